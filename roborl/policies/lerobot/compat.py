"""Importing LeRobot inside roborl's environment.

roborl runs LeRobot's policies with transformers 5, which LeRobot 0.4.4 (the newest release for Python 3.11)
predates: importing `lerobot.policies` imports GR00T's model module, whose config dataclass no longer builds
on transformers 5's `PretrainedConfig`. roborl never uses GR00T, so `require()` registers that one package
without running its `__init__` (its configuration module, which `lerobot.policies` re-exports, still
imports). Every other module is LeRobot's own, unchanged.
"""
from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

INSTALL_HINT = ("the lerobot extra: bash scripts/setup.sh installs it (on Python 3.11 lerobot 0.4.4 without its "
                "torch pins, plus torchvision and FFmpeg for its videos)")


def require(what: str = "policy.kind lerobot") -> None:
    """Makes `lerobot.policies` importable, or raises ImportError naming what needs LeRobot and how to get it."""
    spec = importlib.util.find_spec("lerobot")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{what} needs {INSTALL_HINT}")
    if "lerobot.policies" not in sys.modules and "lerobot.policies.groot" not in sys.modules:
        groot = types.ModuleType("lerobot.policies.groot")
        groot.__path__ = [str(Path(spec.submodule_search_locations[0]) / "policies" / "groot")]
        sys.modules["lerobot.policies.groot"] = groot
    try:
        import lerobot.policies  # noqa: F401
        import torchvision  # noqa: F401  (LeRobot's vision backbones and dataset transforms)
    except ImportError as exc:
        raise ImportError(f"{what} needs {INSTALL_HINT} ({exc})") from exc
