"""Config values of the form `module:function`: user code named in a config (a base policy factory, a
reward machine, a shield)."""
from __future__ import annotations

import importlib
from typing import Any

from roborl.errors import UserError


def import_factory(spec: str, key: str) -> Any:
    """The callable named by `module:function`; `key` is the config key that named it, for the error."""
    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise UserError(f"{key} '{spec}': cannot import {name} from {module} ({exc})") from exc
