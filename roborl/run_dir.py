"""A run's directory: claimed by one process at a time, safe to reopen after a kill at any moment.

- A lock file (`.lock`, an flock held while the process lives; the kernel drops it when the process dies,
  however it dies) keeps two processes out of one run.
- A run killed before its first `last` checkpoint left nothing to resume: the same command starts it
  again from scratch in the same directory.
- Temporary files of checkpoint writes that a kill interrupted are removed when the run is opened again.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import IO

from roborl.errors import UserError
from roborl.files import atomic_write

LOCK = ".lock"
_held: dict[Path, IO] = {}  # run directories this process holds, with their open lock files


def write_json(path: Path, data: dict) -> None:
    """`data` as JSON at `path`, written to a temporary file first and renamed over it (never half-written)."""
    with atomic_write(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2))


def claim(run_dir: Path) -> None:
    """Holds `run_dir`'s lock for the rest of this process, or refuses if another live process holds it."""
    run_dir = run_dir.resolve()
    if run_dir in _held:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    handle = open(run_dir / LOCK, "a+")  # noqa: SIM115 (held open while the process lives)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        owner = handle.read().strip() or "another process"
        handle.close()
        raise UserError(f"run directory '{run_dir}' is in use by a running roborl process ({owner}); wait for "
                        "it or choose another train.name") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}")
    handle.flush()
    _held[run_dir] = handle
    for stale in run_dir.rglob(".*.tmp-*"):  # writes that a kill interrupted
        stale.unlink(missing_ok=True)


def release(run_dir: Path) -> None:
    handle = _held.pop(run_dir.resolve(), None)
    if handle is not None:
        handle.close()


def new_run_dir(name: str | None, parent: str, default_name: str, resume_hint: bool = True) -> Path:
    """`parent/name` (or `default_name` with a timestamp), claimed. An existing run is refused, so that
    nothing is overwritten (with `resume_hint`, the message says how to carry it on); one that stopped before
    its first checkpoint holds nothing to carry on, and starts again."""
    run_dir = Path(parent) / (name or f"{default_name}_{datetime.now():%Y%m%d-%H%M%S}")
    claim(run_dir)
    saved = [p for p in (run_dir / "checkpoints" / "last.safetensors", run_dir / "checkpoints" / "best.safetensors")
             if p.exists()]
    if saved:
        release(run_dir)
        hint = f"continue it with resume={saved[0]} or choose another train.name" if resume_hint else \
            "choose another train.name"
        raise UserError(f"run directory '{run_dir}' already holds a run; {hint}")
    for entry in run_dir.iterdir():  # a run that died before its first checkpoint: start it again
        if entry.name != LOCK:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    return run_dir
