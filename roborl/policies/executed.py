"""The log-density of a chunk's executed part, which every chunk-predicting policy's RL log-probs use: the env
runs the first `execute` actions of a predicted chunk, and only their real `env_action_dim` dimensions (a
VLA's chain may live in a padded action space: pi0's and SmolVLA's `max_action_dim`), so only those enter the
log-probabilities and receive gradients."""
from __future__ import annotations

import math

import torch
from torch.distributions import Normal


class ExecutedChunk:
    execute: int
    env_action_dim: int

    def executed_log_prob(self, x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor | float) -> torch.Tensor:
        """The Gaussian log-density of the executed actions' real dimensions (B×H×D -> B); `std` is a
        tensor of x's shape or one number."""
        k, a = self.execute, self.env_action_dim
        std = std[:, :k, :a] if isinstance(std, torch.Tensor) and std.dim() == 3 else std
        return Normal(mean[:, :k, :a], std).log_prob(x[:, :k, :a]).sum((-1, -2))

    def executed_entropy(self, std: torch.Tensor | float, batch: int, device: torch.device) -> torch.Tensor:
        k, a = self.execute, self.env_action_dim
        if isinstance(std, torch.Tensor) and std.dim() == 3:
            return (0.5 + 0.5 * math.log(2 * math.pi) + std[:, :k, :a].log()).sum((-1, -2))
        per_dim = 0.5 + 0.5 * math.log(2 * math.pi) + math.log(float(std))
        return torch.full((batch,), per_dim * k * a, device=device)
