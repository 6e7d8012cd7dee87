"""The Ray env workers' shards seen as one VecEnv (rows: worker 0's envs, then worker 1's, ...).

With `resources.inference: learner` the trainer steps it like any VecEnv (one round trip to every
worker per step); with collocated inference it only resets the workers and describes their envs.
When a worker dies mid-step, its replacement's envs start from a reset: the episodes the dead worker
was running end as time-outs (bootstrapped from their last observation), are not counted as episodes,
and their steps are counted in `WorkerPool.lost_steps`.
"""
from __future__ import annotations

from typing import Any

import torch

from roborl.errors import UserError
from roborl.ray_workers import WorkerPool
from roborl.sim.batch import concat, to_device, zeros_like_rows
from roborl.sim.vec_env import Obs, VecEnv


def merge_infos(infos: list[dict], obs: list[Obs], sizes: list[int]) -> dict:
    """The workers' step infos as one: a key some workers lack is filled with zeros for their rows, and
    `final_obs` with their current observation (their envs did not end)."""
    merged = {}
    for key in dict.fromkeys(k for info in infos for k in info):
        example = next(info[key] for info in infos if key in info)
        if key == "final_obs":
            merged[key] = concat([info.get(key, o) for info, o in zip(infos, obs)])
        else:
            merged[key] = concat([info[key] if key in info else zeros_like_rows(example, n)
                                  for info, n in zip(infos, sizes)])
    return merged


class RayVecEnv(VecEnv):
    def __init__(self, pool: WorkerPool, device: torch.device) -> None:
        self.pool = pool
        self.device = device
        self.num_envs = pool.cfg.env.num_envs
        self.sizes = [pool.envs_per_worker] * len(pool.workers)
        d = pool.describe()
        self.observation_space, self.action_space = d["observation_space"], d["action_space"]
        self.label_names, self.reward_term_names = d["label_names"], d["reward_term_names"]
        self.max_episode_steps, self.control_dt = d["max_episode_steps"], d["control_dt"]
        self._action_scaling = d["action_scaling"]
        self._group_resets = d["supports_group_resets"]
        self.option_machines: list[int] | None = d["option_machines"]  # of a hierarchy learned by options
        self.last_obs: list[Obs] = []

    @property
    def supports_group_resets(self) -> bool:
        return self._group_resets

    def set_group_size(self, group_size: int) -> None:
        """Every worker's envs start groups alike; a group may not straddle two workers."""
        if self.sizes[0] % group_size:
            raise UserError(f"the group size ({group_size}) must divide each Ray env worker's share of the envs "
                            f"({self.sizes[0]} = env.num_envs / resources.env_workers)")
        self.pool.call("set_group_size", [(group_size,)] * len(self.sizes))

    def action_scaling(self) -> dict[str, list]:
        return self._action_scaling

    def to_device(self, value: Any) -> Any:
        return to_device(value, self.device)

    def reset(self, seed: int | None = None, options: dict | None = None) -> Obs:
        self.last_obs = self.pool.reset(seed, options)
        return self.to_device(concat(self.last_obs))

    def lost_step(self, i: int, reset_obs: Obs, example: tuple) -> tuple:
        """The step of worker i's envs when it died: cut as time-outs, no reward, not counted as episodes."""
        n = self.sizes[i]
        info = zeros_like_rows(example[4], n)
        info["final_obs"] = self.last_obs[i]
        return (reset_obs, torch.zeros(n), torch.zeros(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool), info)

    def step(self, action: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        chunks = action.detach().cpu().split(self.sizes)
        parts, replaced = self.pool.call("step", [(c,) for c in chunks], lost_steps=self.sizes[0])
        if replaced:
            example = next((p for p in parts if p is not None), None)
            if example is None:  # every worker died at once: nothing to take the layout of
                return self.step(action)
            for i, reset_obs in replaced.items():
                parts[i] = self.lost_step(i, reset_obs, example)
        obs = [p[0] for p in parts]
        self.last_obs = obs
        info = merge_infos([p[4] for p in parts], obs, self.sizes)
        out = (concat(obs), concat([p[1] for p in parts]), concat([p[2] for p in parts]),
               concat([p[3] for p in parts]), info)
        return tuple(self.to_device(x) for x in out)

    def close(self) -> None:
        self.pool.close()
