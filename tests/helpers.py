import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def roborl(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs the real CLI in a child process."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "roborl.cli", *args], cwd=cwd or ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Polls `predicate` until it holds; fails the test naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def roborl_in_process(*args: str) -> subprocess.CompletedProcess:
    """The CLI's `main` in this process: its exit status and what it printed, without a child's start-up
    (importing torch alone takes seconds). For checks of what the CLI says about bad input; what only a real
    process shows (signals, the executable's exit code) goes through `roborl`. An exception that `main` lets
    through (a traceback for the user) propagates and fails the test."""
    import contextlib
    import io

    import torch

    from roborl.cli import main

    out, err, threads = io.StringIO(), io.StringIO(), torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        torch.set_num_threads(threads)  # a run sets train.threads for its process
    return subprocess.CompletedProcess(args, code or 0, out.getvalue(), err.getvalue())


def same_picture(a, b, at_most: float = 0.01) -> bool:
    """Two uint8 frames (H×W×3, or a batch of them) show the same picture: at most `at_most` of their pixels
    differ. A frame drawn in another tile of the renderer's framebuffer can differ in a few edge pixels (the
    rasterizer rounds the shifted viewport differently); another picture differs in far more."""
    return float((a != b).any(-1).float().mean()) <= at_most
