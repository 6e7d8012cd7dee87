"""Observation history: `state` becomes the last n states of the episode, oldest first, concatenated.

At the start of an episode the history is filled with its first state (as Diffusion Policy pads), so
the shape never changes. Demonstration loaders build the same windows (see `roborl.demos`).
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from roborl.sim.errors import SimError
from roborl.sim.vec_env import Obs, VecEnv
from roborl.sim.wrapper import VecEnvWrapper


class StateHistoryEnv(VecEnvWrapper):
    def __init__(self, env: VecEnv, length: int) -> None:
        if length < 1:
            raise SimError(f"env.obs_history must be >= 1, got {length}")
        super().__init__(env)
        self.length = length
        spaces = dict(env.observation_space.spaces)
        dim = spaces["state"].shape[0]
        spaces["state"] = gym.spaces.Box(-np.inf, np.inf, (length * dim,), np.float32)
        self.observation_space = gym.spaces.Dict(spaces)
        self.history: torch.Tensor | None = None

    def _with(self, obs: Obs, history: torch.Tensor) -> Obs:
        return {**obs, "state": history.flatten(1)}

    def reset(self, seed: int | None = None, options: dict | None = None) -> Obs:
        obs = self.env.reset(seed=seed, options=options)
        self.history = obs["state"][:, None].repeat(1, self.length, 1)
        return self._with(obs, self.history)

    def step(self, action: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        obs, reward, term, trunc, info = self.env.step(action)
        shifted = self.history.roll(-1, dims=1)
        if "final_obs" in info:
            final = shifted.clone()
            final[:, -1] = info["final_obs"]["state"]
            info["final_obs"] = self._with(info["final_obs"], final)
        shifted[:, -1] = obs["state"]
        done = info["done"]
        if done.any():
            shifted[done] = obs["state"][done][:, None].expand(-1, self.length, -1)
        self.history = shifted
        return self._with(obs, shifted), reward, term, trunc, info
