"""roborl's one msgpack codec: the policy server and its clients, the digital twin, and the frames between
LiberoVecEnv and roborl/sim/libero_server.py.

Messages are msgpack with numpy arrays as {"__ndarray__": True, "data", "dtype", "shape"} (openpi's
msgpack-numpy convention, so its clients' encoders read and write the same bytes). Decoding trusts
nothing: only plain numeric dtypes (never object arrays), a byte count that matches the shape, bounded
nesting; anything else is a `WireError` with a one-line reason. A frame is a 4-byte big-endian length,
then the message.

It is the lowest layer of roborl: LIBERO's server (another Python, in LIBERO's own environment) loads this
file by path, so it imports only the standard library, numpy and msgpack, never roborl or torch.
"""
from __future__ import annotations

import os
import select
import struct
import time
from typing import Any

import msgpack
import numpy as np

MAX_FRAME = 1 << 30  # bytes; a longer length prefix means the stream is garbage
_HEADER = struct.Struct(">I")


class WireError(ValueError):
    """A frame or message that cannot be decoded into what the protocol allows."""


class PeerClosed(EOFError):
    """The other end closed the stream."""


ALLOWED_KINDS = "biuf"  # bool, int, unsigned, float
MAX_DIMS = 8


def _encode(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in ALLOWED_KINDS:
            raise TypeError(f"cannot send arrays of dtype {obj.dtype}")
        return {b"__ndarray__": True, b"data": np.ascontiguousarray(obj).tobytes(), b"dtype": obj.dtype.str,
                b"shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__}")


def _decode_array(obj: dict) -> np.ndarray:
    try:
        dtype = np.dtype(obj[b"dtype"] if isinstance(obj[b"dtype"], str) else obj[b"dtype"].decode())
        shape = tuple(int(n) for n in obj[b"shape"])
        data = obj[b"data"]
    except (KeyError, TypeError, ValueError, AttributeError, UnicodeDecodeError) as exc:
        raise WireError(f"malformed array ({type(exc).__name__})") from exc
    if dtype.kind not in ALLOWED_KINDS or dtype.hasobject:
        raise WireError(f"array dtype {dtype} is not allowed (only bool, int and float)")
    if len(shape) > MAX_DIMS or any(n < 0 for n in shape):
        raise WireError(f"array shape {shape} is not allowed")
    if not isinstance(data, bytes) or len(data) != int(np.prod(shape)) * dtype.itemsize:
        raise WireError(f"array data does not fit shape {shape} and dtype {dtype}")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _object_hook(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        return _decode_array(obj)
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in obj.items()}


def pack(message: Any) -> bytes:
    return msgpack.packb(message, default=_encode, use_bin_type=True)


def unpack(payload: bytes | str) -> Any:
    if not isinstance(payload, (bytes, bytearray)):
        raise WireError("messages are binary msgpack frames, not text")
    try:
        return msgpack.unpackb(payload, object_hook=_object_hook, raw=False, strict_map_key=False)
    except WireError:
        raise
    except Exception as exc:
        raise WireError(f"not a msgpack message ({type(exc).__name__})") from exc


def write_frame(fd: int, payload: bytes) -> None:
    """Write one frame to a file descriptor (BrokenPipeError when the reader is gone)."""
    view = memoryview(_HEADER.pack(len(payload)) + payload)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, left = [], n
    while left:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise PeerClosed
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, timeout: float | None = None) -> bytes:
    """Read one frame's payload; PeerClosed at end of stream, TimeoutError after `timeout` seconds,
    WireError for a length no sane frame has."""
    deadline = None if timeout is None else time.monotonic() + timeout
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    if size > MAX_FRAME:
        raise WireError(f"frame of {size} bytes is longer than the {MAX_FRAME} allowed")
    return _read_exact(fd, size, deadline)
