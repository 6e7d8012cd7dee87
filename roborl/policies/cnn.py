"""A small convolutional encoder for uint8 `rgb` observations (N×H×W×3)."""
from __future__ import annotations

import torch
from torch import nn

NATURE = ((32, 8, 4), (64, 4, 2), (64, 3, 1))  # (channels, kernel, stride): Nature DQN's, for 36 px and up
SMALL = ((32, 3, 2), (64, 3, 2), (64, 3, 1))  # for 15-35 px images (tiny renders in tests and CPU runs)


class CNNEncoder(nn.Module):
    """Nature-DQN-style conv stack (smaller kernels below 36 px), then a linear projection."""

    def __init__(self, height: int, width: int, out_dim: int = 256) -> None:
        super().__init__()
        if min(height, width) < 15:
            raise ValueError(f"the CNN encoder needs images of at least 15×15 px, got {height}×{width}: "
                             "raise env.render_size")
        layers, channels = [], 3
        for out, kernel, stride in NATURE if min(height, width) >= 36 else SMALL:
            layers += [nn.Conv2d(channels, out, kernel, stride=stride), nn.ReLU()]
            channels = out
        self.convs = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            n = self.convs(torch.zeros(1, 3, height, width)).shape[-1]
        self.proj = nn.Sequential(nn.Linear(n, out_dim), nn.ReLU())
        self.out_dim = out_dim

    def forward(self, rgb: torch.Tensor) -> torch.Tensor:
        x = rgb.permute(0, 3, 1, 2).float() / 255.0
        return self.proj(self.convs(x))
