"""The value head both VLA families put on backbone features."""
from __future__ import annotations

import torch
from torch import nn

from policies.gaussian import mlp


class ValueHead(nn.Module):
    """An MLP from features to V(s). With `detach` the value loss stops at the features, so a shared
    backbone is trained by the policy loss alone (RL4VLA's critic on a shared backbone, without letting
    early, noisy value targets move the VLA)."""

    def __init__(self, in_dim: int, hidden: list[int], detach: bool) -> None:
        super().__init__()
        self.net = mlp([in_dim, *hidden, 1], "tanh", 1.0)
        self.detach = detach

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features.detach() if self.detach else features)
