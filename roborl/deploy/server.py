"""`roborl serve ARTIFACT`: an exported policy behind a websocket, msgpack messages (openpi's convention:
the server speaks first with its metadata, then answers each request).

Requests are maps with a `type`:
- `{"type": "infer", "obs": {"state": float32 array, ...}}` → `{"type": "action", "action", "command",
  "infer_ms"}`. `obs` holds exactly the artifact's observation keys, each with its dtype and either its
  per-env shape (one robot: the reply has no batch dim) or (B, *shape) for B ≤ `max_batch`.
- `{"type": "metadata"}` → `{"type": "metadata", "metadata": ...}`; `{"type": "health"}` → status.
An `id` in a request is echoed in its reply. Anything malformed gets `{"type": "error", "error": ...}`
and the connection stays open.

openpi's own client (`openpi_client.websocket_client_policy.WebsocketClientPolicy`) speaks a bare form: a
map without `type` is the observation itself, answered with `{"actions", "command", "server_timing":
{"infer_ms"}}`, and a refused one with a text frame holding the reason (openpi's client raises it as a
RuntimeError); the observation is checked as strictly as in the `infer` form.

It binds 127.0.0.1 unless told otherwise; with a token, a client must send `Authorization: Bearer TOKEN`
(or openpi's `Authorization: Api-Key TOKEN`) in its handshake or is refused with HTTP 401.
"""
from __future__ import annotations

import asyncio
import hmac
import subprocess
import sys
import time
from http import HTTPStatus
from pathlib import Path
from typing import Any

import numpy as np

from roborl.deploy.artifact import Artifact
from roborl.wire import WireError, pack, unpack

MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class RequestError(ValueError):
    """A request the server understood well enough to refuse, with the reason sent back."""


def check_obs(obs: Any, spec: dict[str, dict], max_batch: int) -> tuple[dict[str, np.ndarray], bool]:
    """The observation as the artifact takes it (batched) and whether the request was batched."""
    if not isinstance(obs, dict):
        raise RequestError(f"'obs' must be a map of arrays, got {type(obs).__name__}")
    if set(obs) != set(spec):
        missing, extra = sorted(set(spec) - set(obs)), sorted(set(obs) - set(spec))
        raise RequestError(f"'obs' keys must be {sorted(spec)} (missing {missing}, unexpected {extra})")
    out, batched = {}, None
    for key, want in spec.items():
        value = obs[key]
        shape = tuple(want["shape"])
        if not isinstance(value, np.ndarray):
            raise RequestError(f"obs['{key}'] must be an array, got {type(value).__name__}")
        if value.dtype != np.dtype(want["dtype"]):
            raise RequestError(f"obs['{key}'] must have dtype {want['dtype']}, got {value.dtype}")
        if value.shape == shape:
            this_batched, value = False, value[None]
        elif value.ndim == len(shape) + 1 and value.shape[1:] == shape and 1 <= value.shape[0] <= max_batch:
            this_batched = True
        else:
            raise RequestError(f"obs['{key}'] must have shape {list(shape)} or [B, {', '.join(map(str, shape))}] "
                               f"with 1 <= B <= {max_batch}, got {list(value.shape)}")
        if batched is not None and this_batched != batched:
            raise RequestError("either every observation key is batched or none is")
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            raise RequestError(f"obs['{key}'] contains NaN or inf")
        batched = this_batched
        out[key] = np.ascontiguousarray(value)
    if len({v.shape[0] for v in out.values()}) > 1:
        raise RequestError("every observation key needs the same batch size")
    return out, bool(batched)


class PolicyServer:
    def __init__(self, artifact: Artifact, token: str | None = None, max_batch: int = 1024) -> None:
        self.artifact, self.token, self.max_batch = artifact, token, max_batch
        self.started = time.monotonic()
        self.requests = self.errors = self.clients = 0
        self.lock = asyncio.Lock()

    def health(self) -> dict:
        return {"type": "health", "status": "ok", "uptime_s": time.monotonic() - self.started,
                "requests": self.requests, "errors": self.errors, "clients": self.clients}

    async def answer(self, payload: bytes | str) -> dict | str:
        """The reply to one message: a map, or the text of an error for openpi's bare form."""
        try:
            request = unpack(payload)
        except WireError as exc:
            return {"type": "error", "error": str(exc)}
        if not isinstance(request, dict):
            return {"type": "error", "error": f"a request is a map with a 'type', got {type(request).__name__}"}
        if "type" not in request:
            return await self.infer_bare(request)
        reply = await self.dispatch(request)
        if "id" in request and isinstance(request["id"], (int, str)):
            reply["id"] = request["id"]
        return reply

    async def infer_bare(self, obs: dict) -> dict | str:
        """openpi's form: the observation in, `{"actions", "command", "server_timing"}` out, errors as text."""
        try:
            checked, batched = check_obs(obs, self.artifact.observation, self.max_batch)
        except RequestError as exc:
            return str(exc)
        out, infer_ms = await self.infer(checked)
        pick = (lambda a: a) if batched else (lambda a: a[0])
        return {"actions": pick(out["action"]), "command": pick(out["command"]), "server_timing": {"infer_ms": infer_ms}}

    async def infer(self, obs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        start = time.perf_counter()
        async with self.lock:  # one inference at a time; clients queue
            out = await asyncio.to_thread(self.artifact, obs)
        return out, 1000 * (time.perf_counter() - start)

    async def dispatch(self, request: dict) -> dict:
        kind = request.get("type")
        if kind == "metadata":
            return {"type": "metadata", "metadata": self.artifact.metadata}
        if kind == "health":
            return self.health()
        if kind != "infer":
            return {"type": "error", "error": f"unknown request type {kind!r}; use infer, metadata or health"}
        try:
            obs, batched = check_obs(request.get("obs"), self.artifact.observation, self.max_batch)
        except RequestError as exc:
            return {"type": "error", "error": str(exc)}
        out, infer_ms = await self.infer(obs)
        reply = {"type": "action", "infer_ms": infer_ms}
        for key in ("action", "command"):
            reply[key] = out[key] if batched else out[key][0]
        return reply

    async def handler(self, connection) -> None:
        self.clients += 1
        try:
            await connection.send(pack({"type": "metadata", "metadata": self.artifact.metadata}))
            async for payload in connection:
                self.requests += 1
                reply = await self.answer(payload)
                if isinstance(reply, str) or reply.get("type") == "error":
                    self.errors += 1
                await connection.send(reply if isinstance(reply, str) else pack(reply))
        except Exception as exc:  # a client that vanished mid-reply: its connection ends, the server goes on
            from websockets.exceptions import ConnectionClosed

            if not isinstance(exc, ConnectionClosed):
                raise
        finally:
            self.clients -= 1

    def process_request(self, connection, request):
        if self.token is None:
            return None
        given = request.headers.get("Authorization", "").encode()
        if not any(hmac.compare_digest(given, f"{scheme} {self.token}".encode()) for scheme in ("Bearer", "Api-Key")):
            return connection.respond(HTTPStatus.UNAUTHORIZED, "missing or wrong token: send 'Authorization: Bearer TOKEN'\n")
        return None


async def serve_forever(artifact: Artifact, host: str = "127.0.0.1", port: int = 8000, token: str | None = None,
                        max_batch: int = 1024) -> None:
    from websockets.asyncio.server import serve

    server = PolicyServer(artifact, token, max_batch)
    async with serve(server.handler, host, port, process_request=server.process_request, compression=None,
                     max_size=MAX_MESSAGE_BYTES, ping_interval=None) as ws:
        bound = ws.sockets[0].getsockname()
        print(f"roborl: serving {artifact.path.name} on ws://{bound[0]}:{bound[1]}"
              f"{' (token required)' if token else ''}", flush=True)
        if host not in ("127.0.0.1", "localhost", "::1") and not token:
            print("roborl: warning: listening beyond this machine without --token", file=sys.stderr, flush=True)
        await asyncio.get_running_loop().create_future()


def serve(path: str, host: str = "127.0.0.1", port: int = 8000, token: str | None = None,
          max_batch: int = 1024) -> None:
    from roborl.errors import UserError

    if not 0 <= port <= 65535:
        raise UserError(f"--port must be in 0..65535 (0 picks a free port), got {port}")
    if max_batch < 1:
        raise UserError(f"--max-batch must be >= 1, got {max_batch}")
    artifact = Artifact(path)
    artifact.warm_up()
    try:
        asyncio.run(serve_forever(artifact, host, port, token, max_batch))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port} ({exc.strerror or exc})") from exc


def start_server(artifact: str | Path, *extra: str, timeout: float = 60.0) -> tuple[subprocess.Popen, str]:
    """`roborl serve ARTIFACT --port 0 [extra]` in a child process; it and its URI once it listens."""
    proc = subprocess.Popen([sys.executable, "-m", "roborl.cli", "serve", str(artifact), "--port", "0", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if " on ws://" in line:
            return proc, line.split(" on ")[1].split()[0]
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"the policy server did not start: {proc.stderr.read().strip()}")
