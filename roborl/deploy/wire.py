"""Messages on the wire: msgpack with numpy arrays as {"__ndarray__": True, "data", "dtype", "shape"}
(openpi's msgpack-numpy convention, so its clients' encoders read and write the same bytes).

Decoding trusts nothing: only plain numeric dtypes (never object arrays), a byte count that matches
the shape, bounded nesting. Anything else is a `WireError` with a one-line reason.
"""
from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

ALLOWED_KINDS = "biuf"  # bool, int, unsigned, float
MAX_DIMS = 8


class WireError(ValueError):
    """A message that cannot be decoded into what the protocol allows."""


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
