"""Action chunks: a policy decides every K control steps and the wrapper executes K actions of its chunk.

The wrapped env is a VecEnv whose one `step` is K control steps (one decision of a chunked policy), so
the trainer's MDP runs at the decision rate. Rewards are summed over the executed steps. An env whose
episode ends inside the chunk stops collecting reward there; its `final_obs` and episode statistics are
those of that moment, and the rest of its chunk runs on the fresh episode (set the task's episode length
to a multiple of K and that happens only on early terminations). The inner steps but the last run
`unobserved`: their observations are dropped, so a simulator need not render them.
"""
from __future__ import annotations

import math
from contextlib import nullcontext

import gymnasium as gym
import numpy as np
import torch

from roborl.sim.batch import clone, merge_rows
from roborl.sim.errors import SimError
from roborl.sim.vec_env import Obs, VecEnv
from roborl.sim.wrapper import VecEnvWrapper


class ActionChunkEnv(VecEnvWrapper):
    def __init__(self, env: VecEnv, execute: int) -> None:
        if execute < 1:
            raise SimError(f"env.action_chunk must be >= 1, got {execute}")
        super().__init__(env)
        self.execute = execute
        self.action_space = gym.spaces.Box(-1.0, 1.0, (execute, env.action_dim), np.float32)
        self.max_episode_steps = math.ceil(env.max_episode_steps / execute) if env.max_episode_steps else None
        self.control_dt = env.control_dt * execute

    def step(self, action: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """`action` is N×H×A with H >= K (the first K are executed) or N×A (held for K steps)."""
        if action.dim() == 2:
            action = action[:, None].expand(-1, self.execute, -1)
        if action.dim() != 3 or action.shape[1] < self.execute:
            raise SimError(f"a chunked env needs actions N×H×A with H >= {self.execute}, got {tuple(action.shape)}")
        N = self.num_envs
        total = torch.zeros(N, device=self.device)
        ended = torch.zeros(N, dtype=torch.bool, device=self.device)
        terminated, truncated = ended.clone(), ended.clone()
        final_obs: Obs | None = None
        episode: dict[str, torch.Tensor] | None = None
        for k in range(self.execute):
            with self.env.unobserved() if k < self.execute - 1 else nullcontext():
                obs, reward, term, trunc, info = self.env.step(action[:, k])
            alive = ~ended
            total += reward * alive
            if k == 0:
                success, labels = info["success"].clone(), info["labels"].clone()
                cost = info["cost"].clone() if "cost" in info else None
            else:
                success = torch.where(alive, info["success"], success)
                labels = torch.where(alive[:, None], info["labels"], labels)
                if cost is not None:
                    cost += info["cost"] * alive
            now = (term | trunc) & alive
            if now.any():
                if final_obs is None:
                    final_obs = clone(info["final_obs"])
                    episode = {key: value.clone() for key, value in info["episode"].items()}
                else:
                    merge_rows(final_obs, info["final_obs"], now)
                    for key, value in info["episode"].items():
                        episode[key][now] = value[now]
                terminated |= term & alive
                truncated |= trunc & alive
                ended |= now
        out: dict = {"success": success, "labels": labels, "done": ended}
        if cost is not None:
            out["cost"] = cost
        if final_obs is not None:
            out["final_obs"], out["episode"] = final_obs, episode
        return obs, total, terminated, truncated, out
