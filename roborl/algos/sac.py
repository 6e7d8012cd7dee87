"""SAC (twin critics, target networks, learned entropy temperature) for policies with `sample(obs)`.

The critics are Q(features(obs), executed action); for a residual policy the features include the
base's action, so Q judges the corrected action in the context of what the base wanted.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from policies.gaussian import mlp
from roborl.config import SACConfig


class TwinQ(nn.Module):
    def __init__(self, in_dim: int, action_dim: int, hidden: list[int]) -> None:
        super().__init__()
        self.q1 = mlp([in_dim + action_dim, *hidden, 1], "relu", 1.0)
        self.q2 = mlp([in_dim + action_dim, *hidden, 1], "relu", 1.0)

    def forward(self, x: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xa = torch.cat([x, action], -1)
        return self.q1(xa).squeeze(-1), self.q2(xa).squeeze(-1)


class SAC:
    optimizer = None  # nothing for the checkpoint: the critics and the replay buffer are not saved

    def __init__(self, policy: nn.Module, feature_dim: int, action_dim: int, cfg: SACConfig,
                 device: torch.device) -> None:
        self.policy, self.cfg = policy, cfg
        self.lr = cfg.lr
        self.critic = TwinQ(feature_dim, action_dim, list(cfg.critic_hidden)).to(device)
        self.target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.tensor(float(cfg.init_alpha), device=device).log().requires_grad_(True)
        self.target_entropy = -float(action_dim) if cfg.target_entropy is None else cfg.target_entropy
        self.actor_params = [p for p in policy.parameters() if p.requires_grad]
        self.actor_opt = torch.optim.Adam(self.actor_params, lr=cfg.lr)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=cfg.lr)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=cfg.lr)
        self.updates = 0

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.exp().detach()

    def critic_loss(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean squared Bellman error of both critics against the soft target, and the target."""
        with torch.no_grad():
            next_action, next_logp = self.policy.sample(batch["next_obs"])
            tq1, tq2 = self.target(self.policy.features(batch["next_obs"]), next_action)
            soft_v = torch.min(tq1, tq2) - self.alpha * next_logp
            target = batch["reward"] + self.cfg.gamma * (1 - batch["terminated"]) * soft_v
        q1, q2 = self.critic(self.policy.features(batch["obs"]), batch["action"])
        return 0.5 * ((q1 - target).square().mean() + (q2 - target).square().mean()), target

    def update(self, batch: dict) -> dict[str, float]:
        stats: dict[str, float] = {}
        loss, target = self.critic_loss(batch)
        self.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.critic_opt.step()
        stats.update(critic_loss=loss.item(), q_target=target.mean().item())
        self.updates += 1
        if self.updates % self.cfg.actor_delay == 0:
            obs = batch["obs"]
            action, logp = self.policy.sample(obs)
            q1, q2 = self.critic(self.policy.features(obs), action)
            actor_loss = (self.alpha * logp - torch.min(q1, q2)).mean()
            self.actor_opt.zero_grad(set_to_none=True)
            actor_loss.backward()
            self.actor_opt.step()
            alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
            self.alpha_opt.zero_grad(set_to_none=True)
            alpha_loss.backward()
            self.alpha_opt.step()
            stats.update(actor_loss=actor_loss.item(), alpha=self.alpha.item(), entropy=-logp.mean().item())
        with torch.no_grad():
            for p, tp in zip(self.critic.parameters(), self.target.parameters()):
                tp.lerp_(p, self.cfg.tau)
        return stats
