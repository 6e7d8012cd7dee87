"""Data from Ray env workers (`resources.env_workers`), for any algorithm the runner drives.

- `inference: learner`: the workers only simulate. Their shards are one VecEnv (roborl/ray_vec_env.py),
  which the algorithm's own `collect` steps like any other (one round trip to every worker per step), so
  PPO, GRPO and SAC all run this way.
- `inference: collocated` (default): every worker acts with its own copy of the policy and runs the
  algorithm's collection itself (`Algorithm.collect`, then `rollout_part`); the learner concatenates the
  parts (`Algorithm.absorb`), then updates and publishes the new weights. Synchronous by default; with
  `async_rollouts` every worker keeps `max_staleness` rollouts in flight while the learner updates, so a
  part it gets was collected by a policy at most `max_staleness` updates old, and is marked `stale` for
  the algorithm to correct (PPO: decoupled PPO's importance weights, roborl/algos/ppo.py).
A worker that dies is replaced (roborl/ray_workers.py); restarts and lost env steps go to the logs
(train/worker_restarts, train/lost_env_steps) and the summary.
"""
from __future__ import annotations

import torch

from roborl.algos.base import Algorithm
from roborl.collect import EpisodeLog
from roborl.collector import Collector
from roborl.config import Config
from roborl.ray_vec_env import RayVecEnv
from roborl.ray_workers import WorkerPool
from roborl.sim.batch import concat


class RayCollector(Collector):
    def __init__(self, cfg: Config, device: torch.device) -> None:
        self.cfg = cfg
        self.pool = WorkerPool(cfg)
        self.env = RayVecEnv(self.pool, device)
        self.staleness: float | None = None

    def collect(self, algo: Algorithm, obs: dict, log: EpisodeLog) -> dict:
        r = self.cfg.resources
        self.staleness = None
        if r.inference == "learner":
            return algo.collect(self.env, obs, log)
        self.pool.publish(algo.policy)
        parts = self.pool.rollouts()
        if r.async_rollouts:
            self.pool.fill(r.max_staleness)  # the next rollouts run while this update does
        for part in parts:
            for key, values in part["episodes"].items():
                log.extend(key, values)
            log.violations += part["violations"]
            part["stale"] = part["version"] != self.pool.version
        obs = self.env.to_device(concat([p["last_obs"] for p in parts]))
        self.staleness = sum(float(self.pool.version - p["version"]) for p in parts) / len(parts)
        algo.absorb(parts, obs, log)
        return obs

    def stats(self) -> dict[str, float]:
        out = {} if self.staleness is None else {"staleness": self.staleness}
        return {**out, "worker_restarts": self.pool.restarts, "lost_env_steps": self.pool.lost_steps}

    def summary(self) -> dict:
        return {"worker_restarts": self.pool.restarts, "lost_env_steps": self.pool.lost_steps}

    def close(self) -> None:
        self.env.close()
