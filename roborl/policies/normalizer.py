"""Running mean / variance of observations (parallel Welford), kept as module buffers so that it is
saved with the weights and exported with the policy."""
from __future__ import annotations

import torch
from torch import nn


class RunningNormalizer(nn.Module):
    def __init__(self, dim: int, clip: float = 10.0, eps: float = 1e-8) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.register_buffer("count", torch.tensor(eps))
        self.clip = clip
        self.eps = eps

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, self.mean.shape[0]).float()
        batch_mean, batch_var, n = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean += delta * n / total
        m2 = self.var * self.count + batch_var * n + delta.square() * self.count * n / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    @torch.no_grad()
    def fit(self, x: torch.Tensor) -> None:
        """Set the statistics to those of `x` (N×dim), e.g. demonstrations the policy is then trained on."""
        self.mean.copy_(x.mean(0))
        self.var.copy_(x.var(0, unbiased=False))
        self.count.fill_(len(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) / torch.sqrt(self.var + self.eps)).clamp(-self.clip, self.clip)
