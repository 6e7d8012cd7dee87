"""The base controller's action as an observation: the environment half of residual RL.

`BaseActionEnv(env, base, execute)` calls a frozen base controller (any callable `obs -> actions`: a
trained policy, a scripted expert, user code) and publishes the action it wants for the coming control
step as `obs["base_action"]` (N×A). A base that predicts chunks (N×H×A) runs them open loop: it is
called again for an env only after `execute` of its actions have been handed out, or when that env's
episode ends, so a residual policy can correct every step while the base decides every K steps. (The
base is called on the whole batch whenever any env needs a new chunk; a stateful base with K > 1 must
tolerate that.)

The base lives here rather than inside the policy because its per-episode state (the chunk being
executed, a scripted expert's phase) belongs to the environments it serves: training and evaluation
envs each get their own base, and a base's `reset(mask)` is called for the envs whose episode ended.
The base's actions are computed once per step under `torch.no_grad` and stored with the observation,
so an RL update never recomputes them and no gradient can reach the base.
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import gymnasium as gym
import numpy as np
import torch

from roborl.sim.errors import SimError
from roborl.sim.vec_env import Obs, VecEnv
from roborl.sim.wrapper import VecEnvWrapper

Base = Callable[[Obs], torch.Tensor]


class BaseActionEnv(VecEnvWrapper):
    def __init__(self, env: VecEnv, base: Base, execute: int = 1) -> None:
        if execute < 1:
            raise SimError(f"the base's executed chunk length must be >= 1, got {execute}")
        super().__init__(env)
        self.base, self.execute = base, execute
        spaces = dict(env.observation_space.spaces)
        spaces["base_action"] = gym.spaces.Box(-1.0, 1.0, (env.action_dim,), np.float32)
        self.observation_space = gym.spaces.Dict(spaces)
        self.chunk: torch.Tensor | None = None  # N×K×A: the base's current open-loop chunk
        self.position = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)  # next index in it

    @torch.no_grad()
    def _base_actions(self, obs: Obs, refresh: torch.Tensor) -> torch.Tensor:
        """The base's action for this step; envs in `refresh` (or all, at the start) get a new chunk."""
        if self.chunk is None or refresh.any():
            out = self.base(obs)
            if out.dim() == 2:
                out = out[:, None]
            if out.dim() != 3 or out.shape[0] != self.num_envs or out.shape[-1] != self.action_dim:
                raise SimError(f"the base returned actions of shape {tuple(out.shape)}; expected N×A or N×H×A "
                               f"with N={self.num_envs}, A={self.action_dim}")
            if out.shape[1] < self.execute:
                raise SimError(f"the base predicts {out.shape[1]} actions per call but {self.execute} are executed")
            out = out[:, :self.execute].to(self.device, torch.float32)
            if self.chunk is None:
                self.chunk = out.clone()
            else:
                self.chunk[refresh] = out[refresh]
            self.position[refresh] = 0
        rows = torch.arange(self.num_envs, device=self.device)
        return self.chunk[rows, self.position].clamp(-1, 1)

    def unobserved(self) -> AbstractContextManager[None]:
        """The base reads every step's observation, so nothing under it may be left out."""
        return nullcontext()

    def reset(self, seed: int | None = None, options: dict | None = None) -> Obs:
        obs = self.env.reset(seed=seed, options=options)
        if hasattr(self.base, "reset"):
            self.base.reset()
        self.chunk = None
        self.position.zero_()
        return {**obs, "base_action": self._base_actions(obs, torch.ones_like(self.position, dtype=torch.bool))}

    def step(self, action: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        executed = self.chunk[torch.arange(self.num_envs, device=self.device), self.position]
        obs, reward, term, trunc, info = self.env.step(action)
        done = term | trunc
        if done.any() and hasattr(self.base, "reset"):
            self.base.reset(done)
        if "final_obs" in info:  # the base is not asked about a state no policy acts in: its last action
            info["final_obs"] = {**info["final_obs"], "base_action": executed.clamp(-1, 1)}
        self.position += 1
        refresh = done | (self.position >= self.execute)
        return {**obs, "base_action": self._base_actions(obs, refresh)}, reward, term, trunc, info
