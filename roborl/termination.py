"""SIGTERM stops a run as Ctrl-C does. Schedulers preempt with it (Slurm, Kubernetes, `timeout`), and a background
job started by a shell ignores SIGINT, so SIGTERM is the signal such a run gets. Without this, the process ends where
it stands and the run loses what it did since its last periodic save; with it, the runner saves its `last`
checkpoint and a summary with `finished: false`, and `resume=` carries the run on."""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While inside, the first SIGTERM raises KeyboardInterrupt in the main thread and later ones are ignored, so
    the save it leads to is not cut short. Outside the main thread (where Python cannot set handlers): nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
