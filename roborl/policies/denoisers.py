"""Networks that map (noisy action chunk x, time t, condition c) -> a chunk of the same shape: the
noise prediction of a diffusion policy or the velocity of a flow policy.

`t` is a float per sample on the scale [0, 1000] (diffusion timesteps as they are; flow times × 1000),
embedded with diffusers' sinusoidal timestep embedding.
"""
from __future__ import annotations

import torch
from diffusers.models.embeddings import get_timestep_embedding
from torch import nn

TIME_DIM = 64


def time_embedding(t: torch.Tensor) -> torch.Tensor:
    return get_timestep_embedding(t.float().reshape(-1), TIME_DIM, flip_sin_to_cos=True, downscale_freq_shift=0)


class MLPDenoiser(nn.Module):
    """The chunk flattened, concatenated with the time embedding and the condition, through an MLP."""

    def __init__(self, action_dim: int, horizon: int, cond_dim: int, hidden: list[int]) -> None:
        super().__init__()
        self.shape = (horizon, action_dim)
        sizes = [horizon * action_dim + TIME_DIM + cond_dim, *hidden]
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(a, b), nn.Mish()]
        layers.append(nn.Linear(sizes[-1], horizon * action_dim))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = torch.cat([x.flatten(1), time_embedding(t), cond], -1)
        return self.net(h).view(-1, *self.shape)


class FiLMBlock(nn.Module):
    """Two Conv1d-GroupNorm-Mish layers over the horizon; the condition scales and shifts the first."""

    def __init__(self, c_in: int, c_out: int, cond_dim: int) -> None:
        super().__init__()
        groups = 8 if c_out % 8 == 0 else 1
        self.conv1 = nn.Sequential(nn.Conv1d(c_in, c_out, 5, padding=2), nn.GroupNorm(groups, c_out), nn.Mish())
        self.conv2 = nn.Sequential(nn.Conv1d(c_out, c_out, 5, padding=2), nn.GroupNorm(groups, c_out), nn.Mish())
        self.film = nn.Linear(cond_dim, 2 * c_out)
        self.skip = nn.Conv1d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        scale, shift = self.film(cond)[..., None].chunk(2, dim=1)
        h = self.conv1(x) * (1 + scale) + shift
        return self.conv2(h) + self.skip(x)


class UNet1DDenoiser(nn.Module):
    """A temporal 1-D U-Net over the chunk (Diffusion Policy's conditional U-Net, small): channels are
    action dims, the length is the horizon; time and observation enter every block by FiLM."""

    def __init__(self, action_dim: int, horizon: int, cond_dim: int, channels: list[int]) -> None:
        super().__init__()
        if horizon % (2 ** (len(channels) - 1)):
            raise ValueError(f"the U-Net halves the horizon {len(channels) - 1} times: horizon {horizon} "
                             f"must be a multiple of {2 ** (len(channels) - 1)} (or use policy.denoiser=mlp)")
        self.shape = (horizon, action_dim)
        c = TIME_DIM + cond_dim
        self.cond = nn.Sequential(nn.Linear(c, c), nn.Mish())
        dims = [action_dim, *channels]
        self.down = nn.ModuleList(FiLMBlock(a, b, c) for a, b in zip(dims[:-1], dims[1:]))
        self.mid = FiLMBlock(channels[-1], channels[-1], c)
        self.up = nn.ModuleList(FiLMBlock(a + b, a, c) for a, b in zip(channels[:-1][::-1], channels[1:][::-1]))
        self.out = nn.Conv1d(channels[0], action_dim, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        c = self.cond(torch.cat([time_embedding(t), cond], -1))
        h = x.transpose(1, 2)
        skips = []
        for i, block in enumerate(self.down):
            h = block(h, c)
            if i < len(self.down) - 1:
                skips.append(h)
                h = nn.functional.avg_pool1d(h, 2)
        h = self.mid(h, c)
        for block in self.up:
            h = nn.functional.interpolate(h, scale_factor=2, mode="nearest")
            h = block(torch.cat([h, skips.pop()], 1), c)
        return self.out(h).transpose(1, 2)


def make_denoiser(kind: str, action_dim: int, horizon: int, cond_dim: int, hidden: list[int]) -> nn.Module:
    if kind == "mlp":
        return MLPDenoiser(action_dim, horizon, cond_dim, hidden)
    if kind == "unet":
        return UNet1DDenoiser(action_dim, horizon, cond_dim, hidden)
    raise ValueError(f"policy.denoiser '{kind}' is unknown; available: mlp, unet")
