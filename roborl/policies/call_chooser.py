"""Which call a choice state of a hierarchy of reward machines pursues (the HRM paper's policy over a
machine's calls, Furelos-Blanco et al. 2023): Q-values over the calls of every choice state, read from the
state (the choice's one-hot at its end; standardized by running statistics, as small coordinates learn
slowly otherwise), masked to the calls of the row's choice. It belongs to the policy,
so it is saved and loaded with it; it chooses greedily in eval mode and ε-greedily in training. Its SMDP
Q-learning lives with the hierarchy's env (roborl/rm/call_learning.py)."""
from __future__ import annotations

import torch
from torch import nn

from roborl.policies.gaussian import mlp
from roborl.policies.normalizer import RunningNormalizer


class CallChooser(nn.Module):
    def __init__(self, inputs: int, calls: int, hidden: tuple[int, ...] = (64, 64), epsilon: float = 0.1) -> None:
        super().__init__()
        self.normalizer = RunningNormalizer(inputs)
        self.q = mlp([inputs, *hidden, calls], "relu", 1.0)
        self.epsilon = epsilon

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(self.normalizer(x))

    @torch.no_grad()
    def choose(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The call of each row (N×inputs) among those its mask (N×calls, bool) allows."""
        greedy = self(x).masked_fill(~mask, float("-inf")).argmax(-1)
        if not self.training or self.epsilon == 0:
            return greedy
        explore = torch.rand(len(x), device=x.device) < self.epsilon
        return torch.where(explore, torch.multinomial(mask.float(), 1).squeeze(-1), greedy)
