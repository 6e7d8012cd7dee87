"""Environment ids -> constructors. Ids look like `mujoco/Push`, `gym/Pusher-v5`,
`maniskill/PushCube-v1`, `libero/libero_spatial` or `isaaclab/Isaac-Cartpole-Direct-v0`."""
from __future__ import annotations

import difflib
from collections.abc import Callable

from roborl.sim.errors import SimError
from roborl.sim.vec_env import VecEnv

EnvFactory = Callable[..., VecEnv]
_ENVS: dict[str, EnvFactory] = {}
_PREFIXES: dict[str, EnvFactory] = {}


def register(env_id: str) -> Callable[[EnvFactory], EnvFactory]:
    """Register a constructor `f(num_envs=..., device=..., seed=..., **options) -> VecEnv` under an id."""

    def wrap(factory: EnvFactory) -> EnvFactory:
        _ENVS[env_id] = factory
        return factory

    return wrap


def register_prefix(prefix: str, factory: EnvFactory) -> None:
    """Register a backend that accepts any id under `prefix/` (the rest of the id is passed as `name`)."""
    _PREFIXES[prefix] = factory


def available() -> list[str]:
    return sorted(_ENVS) + [f"{p}/<id>" for p in sorted(_PREFIXES)]


def make(env_id: str, num_envs: int = 1, **options) -> VecEnv:
    if env_id in _ENVS:
        return _ENVS[env_id](num_envs=num_envs, **options)
    prefix, _, name = env_id.partition("/")
    if prefix in _PREFIXES and name:
        return _PREFIXES[prefix](name, num_envs=num_envs, **options)
    close = difflib.get_close_matches(env_id, list(_ENVS), n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise SimError(f"unknown environment '{env_id}'{hint}; available: {', '.join(available())}")
