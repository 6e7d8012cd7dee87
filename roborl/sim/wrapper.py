"""Base of VecEnv wrappers: forwards everything to the wrapped env unless the wrapper overrides it."""
from __future__ import annotations

from contextlib import AbstractContextManager

import torch

from roborl.sim.vec_env import Obs, VecEnv


class VecEnvWrapper(VecEnv):
    def __init__(self, env: VecEnv) -> None:
        self.env = env
        self.num_envs, self.device = env.num_envs, env.device
        self.observation_space, self.action_space = env.observation_space, env.action_space
        self.label_names, self.reward_term_names = env.label_names, env.reward_term_names
        self.max_episode_steps, self.control_dt = env.max_episode_steps, env.control_dt
        self.agents = env.agents  # wrappers append to `state` (the agents' columns stay where they were)

    @property
    def action_dim(self) -> int:
        return self.env.action_dim

    def reset(self, seed: int | None = None, options: dict | None = None) -> Obs:
        return self.env.reset(seed=seed, options=options)

    def step(self, action: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        return self.env.step(action)

    def unobserved(self) -> AbstractContextManager[None]:
        return self.env.unobserved()

    def render(self, env_ids: list[int] | None = None) -> torch.Tensor:
        return self.env.render(env_ids)

    def close(self) -> None:
        self.env.close()

    @property
    def unwrapped(self) -> VecEnv:
        return self.env.unwrapped


def find_wrapper(env: object, cls: type) -> object | None:
    """The outermost wrapper of type `cls` around the simulator, or None."""
    while env is not None:
        if isinstance(env, cls):
            return env
        env = getattr(env, "env", None)
    return None
