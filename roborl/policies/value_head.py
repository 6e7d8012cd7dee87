"""The value head the VLA families, pi0, LeRobot policies and residual policies put on their features."""
from __future__ import annotations

import torch
from torch import nn

from roborl.policies.gaussian import mlp


class ValueHead(nn.Module):
    """An MLP from features to V(s), N. With `detach` the value loss stops at the features, so a shared
    backbone is trained by the policy loss alone (RL4VLA's critic on a shared backbone, without letting
    early, noisy value targets move the VLA).

    With `critic_state_dim` > 0 it is an asymmetric critic: it also reads the env's privileged
    `critic_state` (objects, goal), which the policy never sees, so the baseline knows what the image and
    the instruction leave the value head to infer. Without that observation (a deployed or evaluated
    policy, which needs no value) V is NaN, so it cannot pass for a value silently."""

    def __init__(self, in_dim: int, hidden: list[int], detach: bool, critic_state_dim: int = 0,
                 activation: str = "tanh") -> None:
        super().__init__()
        self.net = mlp([in_dim + critic_state_dim, *hidden, 1], activation, 1.0)
        self.detach = detach
        self.critic_state_dim = critic_state_dim

    def forward(self, features: torch.Tensor, obs: dict | None = None) -> torch.Tensor:
        x = features.detach() if self.detach else features
        if self.critic_state_dim:
            if obs is None or "critic_state" not in obs:
                return torch.full(x.shape[:1], float("nan"), device=x.device)
            x = torch.cat([x, obs["critic_state"].to(x)], -1)
        return self.net(x).squeeze(-1)
