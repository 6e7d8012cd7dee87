"""The robot side's connection to `roborl serve`: a blocking websocket client with timeouts.

`PolicyUnavailable` means the server is gone or too slow (the control loop's watchdog acts on it);
`PolicyRejected` means the server answered with an error (a bug on the robot side, not a network fault).
"""
from __future__ import annotations

import time

import numpy as np

from roborl.wire import pack, unpack


class PolicyUnavailable(RuntimeError):
    """The server cannot be reached, closed the connection, or did not answer in time."""


class PolicyRejected(ValueError):
    """The server refused the request; the message says why."""


class PolicyClient:
    def __init__(self, uri: str = "ws://127.0.0.1:8000", token: str | None = None, timeout: float = 1.0,
                 connect_timeout: float = 10.0) -> None:
        from websockets.sync.client import connect

        headers = {"Authorization": f"Bearer {token}"} if token else None
        self.timeout = timeout
        try:
            self.connection = connect(uri, additional_headers=headers, open_timeout=connect_timeout, proxy=None, legacy=True,
                                      compression=None, max_size=16 * 1024 * 1024, ping_interval=None)
            self.metadata = self._receive(connect_timeout)["metadata"]
        except PolicyUnavailable:
            raise
        except Exception as exc:
            raise PolicyUnavailable(f"cannot connect to {uri}: {exc}") from exc
        self.last_round_trip_ms = float("nan")

    def _receive(self, timeout: float) -> dict:
        try:
            return unpack(self.connection.recv(timeout=timeout))
        except TimeoutError as exc:
            raise PolicyUnavailable(f"no answer from the policy server within {timeout:.3f} s") from exc
        except Exception as exc:
            raise PolicyUnavailable(f"policy server connection lost ({type(exc).__name__})") from exc

    def request(self, message: dict, timeout: float | None = None) -> dict:
        start = time.perf_counter()
        try:
            self.connection.send(pack(message))
        except Exception as exc:
            raise PolicyUnavailable(f"policy server connection lost ({type(exc).__name__})") from exc
        reply = self._receive(self.timeout if timeout is None else timeout)
        self.last_round_trip_ms = 1000 * (time.perf_counter() - start)
        if reply.get("type") == "error":
            raise PolicyRejected(reply.get("error", "error"))
        return reply

    def infer(self, obs: dict[str, np.ndarray], timeout: float | None = None) -> dict:
        return self.request({"type": "infer", "obs": obs}, timeout)

    def health(self) -> dict:
        return self.request({"type": "health"})

    def close(self) -> None:
        try:
            self.connection.close()
        except Exception:
            pass

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
