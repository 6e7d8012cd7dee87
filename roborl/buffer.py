"""On-device rollout storage and advantage estimation (torch only, T×N tensors)."""
from __future__ import annotations

from collections.abc import Callable

import torch

from roborl.algos.advantages import gae
from roborl.policies.act import Act


class RolloutBuffer:
    """Holds one rollout of T steps for N envs: observations (dict), actions, log-probs (N or N×S, one
    column per denoising step or flow-matching sample), values, rewards, dones, the policy's `extras`
    (denoising chains, sampled noise); then advantages and returns (by `gae`, or a compiled `gae`)."""

    def __init__(self, num_steps: int, num_envs: int, device: torch.device, gae_fn: Callable = gae) -> None:
        self.T, self.N, self.device, self.gae = num_steps, num_envs, device, gae_fn
        self.obs: dict[str, torch.Tensor] = {}
        self.actions = self.log_probs = self.values = None
        self.extras: dict[str, torch.Tensor] = {}
        self.rewards = torch.zeros(num_steps, num_envs, device=device)
        self.dones = torch.zeros(num_steps, num_envs, dtype=torch.bool, device=device)
        self.costs: torch.Tensor | None = None  # safety costs and their values (PPO-Lagrangian)
        self.cost_values: torch.Tensor | None = None
        self.behaviour_weights: torch.Tensor | None = None  # off-policy rows' π_learner/π_behaviour (truncated)
        self.step = 0

    def add(self, obs: dict, act: Act, reward: torch.Tensor, done: torch.Tensor,
            cost: torch.Tensor | None = None, cost_value: torch.Tensor | None = None) -> None:
        t = self.step
        if cost is not None:
            if self.costs is None:
                self.costs, self.cost_values = torch.zeros_like(self.rewards), torch.zeros_like(self.rewards)
            self.costs[t], self.cost_values[t] = cost, cost_value
        for key, value in obs.items():
            if isinstance(value, torch.Tensor):
                if key not in self.obs:
                    self.obs[key] = torch.zeros((self.T, *value.shape), dtype=value.dtype, device=self.device)
                self.obs[key][t] = value
        if self.actions is None:
            self.actions = torch.zeros((self.T, *act.action.shape), device=self.device)
            self.log_probs = torch.zeros((self.T, *act.log_prob.shape), device=self.device)
            self.values = torch.zeros(self.T, self.N, device=self.device)
        self.actions[t] = act.action
        for key, value in act.extras.items():
            if key not in self.extras:
                self.extras[key] = torch.zeros((self.T, *value.shape), dtype=value.dtype, device=self.device)
            self.extras[key][t] = value
        self.log_probs[t] = act.log_prob
        self.values[t] = act.value
        self.rewards[t] = reward
        self.dones[t] = done
        self.step += 1

    @classmethod
    def concat_envs(cls, parts: list[dict], device: torch.device, gae_fn: Callable = gae) -> RolloutBuffer:
        """The rollouts of several workers (dicts of T×n tensors, as `roborl.ray_workers.EnvWorker.rollout`
        returns them) as one buffer of T×(n₁ + n₂ + ...)."""
        def cat(key: str) -> torch.Tensor:
            return torch.cat([p[key] for p in parts], dim=1).to(device)

        T = parts[0]["rewards"].shape[0]
        buffer = cls(T, sum(p["rewards"].shape[1] for p in parts), device, gae_fn)
        buffer.obs = {k: torch.cat([p["obs"][k] for p in parts], dim=1).to(device) for k in parts[0]["obs"]}
        buffer.extras = {k: torch.cat([p["extras"][k] for p in parts], dim=1).to(device) for k in parts[0]["extras"]}
        buffer.actions, buffer.log_probs, buffer.values = cat("actions"), cat("log_probs"), cat("values")
        buffer.rewards, buffer.dones = cat("rewards"), cat("dones")
        if parts[0]["costs"] is not None:
            buffer.costs, buffer.cost_values = cat("costs"), cat("cost_values")
        return buffer

    def finish(self, last_value: torch.Tensor, gamma: float, lam: float,
               last_cost_value: torch.Tensor | None = None) -> None:
        self.advantages, self.returns = self.gae(self.rewards, self.values, self.dones, last_value, gamma, lam)
        if self.costs is not None:
            self.cost_advantages, self.cost_returns = self.gae(self.costs, self.cost_values, self.dones,
                                                               last_cost_value, gamma, lam)
        self.step = 0

    def flat_inputs(self) -> dict:
        """What the policy saw and did, flattened to (T·N, ...): obs, actions, log-probs, extras."""
        n = self.T * self.N
        return {
            "obs": {k: v.reshape(n, *v.shape[2:]) for k, v in self.obs.items()},
            "actions": self.actions.reshape(n, *self.actions.shape[2:]),
            "log_probs": self.log_probs.reshape(n, *self.log_probs.shape[2:]),
            "extras": {k: v.reshape(n, *v.shape[2:]) for k, v in self.extras.items()},
        }

    def flat(self) -> dict:
        """Everything flattened to (T·N, ...) for minibatching."""
        n = self.T * self.N
        return {
            **self.flat_inputs(), "values": self.values.reshape(n),
            "advantages": self.advantages.reshape(n), "returns": self.returns.reshape(n),
            **({"cost_advantages": self.cost_advantages.reshape(n), "cost_returns": self.cost_returns.reshape(n)}
               if self.costs is not None else {}),
            **({"behaviour_weights": self.behaviour_weights.reshape(n)} if self.behaviour_weights is not None else {}),
        }
