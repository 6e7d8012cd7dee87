"""Batched simulators behind one VecEnv contract. Knows nothing of policies or training."""
import os

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering unless the user chose a backend

from sim.errors import SimError  # noqa: E402
from sim.registry import available, make, register, register_prefix  # noqa: E402
from sim.vec_env import Obs, VecEnv  # noqa: E402
from sim import gym_adapters  # noqa: E402,F401  (registers the gym/ prefix)

__all__ = ["Obs", "SimError", "VecEnv", "available", "make", "register", "register_prefix"]
