"""A small convolutional encoder for uint8 `rgb` observations (N×H×W×3)."""
from __future__ import annotations

import torch
from torch import nn


class CNNEncoder(nn.Module):
    """Nature-DQN-style conv stack sized for 64-128 px images, then a linear projection."""

    def __init__(self, height: int, width: int, out_dim: int = 256) -> None:
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv2d(3, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            n = self.convs(torch.zeros(1, 3, height, width)).shape[-1]
        self.proj = nn.Sequential(nn.Linear(n, out_dim), nn.ReLU())
        self.out_dim = out_dim

    def forward(self, rgb: torch.Tensor) -> torch.Tensor:
        x = rgb.permute(0, 3, 1, 2).float() / 255.0
        return self.proj(self.convs(x))
