"""Batched simulators behind one VecEnv contract. Knows nothing of policies or training."""
import os

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering unless the user chose a backend

from roborl.sim import (
    gym_adapters,  # noqa: E402,F401  (registers the gym/ prefix)
    isaaclab_env,  # noqa: E402,F401  (registers the isaaclab/ prefix; imports isaaclab lazily)
    libero_env,  # noqa: E402,F401  (registers the libero/ prefix; LIBERO runs in .venv-libero)
    maniskill_env,  # noqa: E402,F401  (registers the maniskill/ prefix; imports mani_skill lazily)
)
from roborl.sim.errors import SimError  # noqa: E402
from roborl.sim.registry import available, make, register, register_prefix  # noqa: E402
from roborl.sim.vec_env import AgentSpace, Obs, VecEnv  # noqa: E402

__all__ = ["AgentSpace", "Obs", "SimError", "VecEnv", "available", "make", "register", "register_prefix"]
