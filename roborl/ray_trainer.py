"""PPO with Ray env workers (`resources.env_workers`): the learner gathers their rollouts.

- `inference: collocated` (default): every worker acts with its own copy of the policy and returns a
  whole rollout; the learner concatenates them, runs GAE and the update, and publishes the new weights.
  Synchronous by default; with `async_rollouts` every worker keeps `max_staleness` rollouts in flight
  while the learner updates, so a rollout it gets was collected by a policy at most `max_staleness`
  updates old. Such rows are corrected: the learner recomputes log-probs and values with its current
  policy (the proximal policy of the ratio and the critic of GAE) and weights each row by
  min(π_learner/π_behaviour, resources.is_clip) (decoupled PPO, see roborl/algos/ppo.py).
- `inference: learner`: the learner acts on every step's gathered observations (RayVecEnv.step); the
  workers only simulate.
A worker that dies is replaced (roborl/ray_workers.py); restarts and lost env steps go to the logs
(train/worker_restarts, train/lost_env_steps) and the summary.
"""
from __future__ import annotations

import torch

import sim
from policies.act import Act
from roborl.buffer import RolloutBuffer
from roborl.ray_vec_env import RayVecEnv, concat
from roborl.ray_workers import WorkerPool
from roborl.trainer import Trainer


def correct_off_policy(policy: torch.nn.Module, buffer: RolloutBuffer, is_clip: float) -> None:
    """Rows of older policies: log-probs and values of `policy` (the learner's) replace the behaviour
    policy's, and each row gets min(π_learner/π_behaviour, is_clip) as its `behaviour_weights`."""
    T, N = buffer.T, buffer.N
    flat = buffer.flat_inputs()
    log_prob, _, value = policy.evaluate(flat["obs"], Act(flat["actions"], flat["log_probs"], extras=flat["extras"]))
    log_prob = log_prob.reshape(buffer.log_probs.shape)
    joint = (log_prob - buffer.log_probs).reshape(T, N, -1).sum(-1)  # all of a row's columns: one action
    buffer.behaviour_weights = joint.exp().clamp(max=is_clip)
    buffer.log_probs = log_prob
    buffer.values = value.reshape(T, N)


class RayTrainer(Trainer):
    def make_env(self) -> sim.VecEnv:
        self.pool = WorkerPool(self.cfg)
        return RayVecEnv(self.pool, self.device)

    def iterate(self, total_iters: int) -> dict[str, float]:
        self.staleness: float | None = None
        stats = super().iterate(total_iters)
        if self.staleness is not None:
            stats["staleness"] = self.staleness
        stats["worker_restarts"] = self.pool.restarts
        stats["lost_env_steps"] = self.pool.lost_steps
        return stats

    def collect_rollout(self) -> RolloutBuffer:
        """With learner-side inference, the trainer's own loop over the workers' VecEnv; collocated, one
        rollout from each worker, concatenated, corrected where an older policy collected it, and GAE."""
        cfg, r = self.cfg, self.cfg.resources
        if r.inference == "learner":
            return super().collect_rollout()
        self.pool.publish(self.policy)
        parts = self.pool.rollouts()
        if r.async_rollouts:
            self.pool.fill(r.max_staleness)  # the next rollouts run while this update does
        for part in parts:
            for key, values in part["episodes"].items():
                self.episodes.setdefault(key, []).extend(values)
            self.train_violations += part["violations"]
        buffer = RolloutBuffer.concat_envs(parts, self.device, self.gae)
        self.obs = self.env.to_device(concat([p["last_obs"] for p in parts]))
        staleness = torch.tensor([float(self.pool.version - p["version"]) for p in parts])
        self.staleness = float(staleness.mean())
        safe = self.lagrangian is not None
        with torch.no_grad():
            if staleness.any():
                correct_off_policy(self.policy, buffer, r.is_clip)
                last_value = self.policy.value(self.obs)
                last_cost_value = self.policy.cost_value(self.obs) if safe else None
            else:
                last_value = torch.cat([p["last_value"] for p in parts]).to(self.device)
                last_cost_value = torch.cat([p["last_cost_value"] for p in parts]).to(self.device) if safe else None
            buffer.finish(last_value, cfg.algo.gamma, cfg.algo.gae_lambda, last_cost_value)
        return buffer

    def summary(self, wall: float) -> dict:
        return {**super().summary(wall), "worker_restarts": self.pool.restarts, "lost_env_steps": self.pool.lost_steps}
