"""`resources.compile`: torch.compile of the hot paths (the policy's `act` in rollouts, GAE, the PPO loss).

Compilation happens at a function's first call. Where this platform cannot compile (no C++ compiler, an
unsupported Python), the first failure prints one warning line and every compiled function runs eagerly
from then on, without trying again.
"""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TypeVar

import torch

F = TypeVar("F", bound=Callable)
_failure: list[str] = []  # the first compilation error of this process


def _fall_back(exc: BaseException) -> None:
    while (inner := getattr(exc, "inner_exception", None) or exc.__cause__) is not None:
        exc = inner  # the compiler's own error, not dynamo's wrapper of it
    if not _failure:
        _failure.append(f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}")
        print(f"roborl: warning: torch.compile failed on this platform ({_failure[0]}); running eagerly",
              file=sys.stderr, flush=True)


def maybe_compile(fn: F, enabled: bool, backend: str | Callable = "inductor", cuda_graphs: bool = False) -> F:
    """`fn` compiled with torch.compile where `enabled` (else `fn` itself). Random ops draw from torch's
    own generator as in eager mode (inductor's `fallback_random`), so a seeded run samples the same noise.
    `cuda_graphs` replays the compiled kernels as CUDA graphs: only for functions whose input shapes stay
    fixed and whose outputs are copied before the next call (rollout inference into the buffer). Eager
    random ops cannot be captured in a graph (CUDA refuses them while a stream captures), so with
    `cuda_graphs` inductor draws the noise itself: seeded, but not the noise an eager run draws."""
    if not enabled:
        return fn
    from torch._dynamo.exc import TorchDynamoException  # seconds to import: only when compiling

    try:
        options = None
        if backend == "inductor":
            options = {"fallback_random": not cuda_graphs, "triton.cudagraphs": cuda_graphs}
        compiled = torch.compile(fn, backend=backend, options=options)
    except RuntimeError as exc:  # torch.compile itself refuses this platform
        _fall_back(exc)
        return fn

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if _failure:
            return fn(*args, **kwargs)
        try:
            return compiled(*args, **kwargs)
        except TorchDynamoException as exc:  # compiling failed: run this call (and all later ones) eagerly
            _fall_back(exc)
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]
