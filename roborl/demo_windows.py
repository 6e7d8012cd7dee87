"""Training windows from demonstrations: what `roborl bc` reads, whichever format the demos are in (the HDF5
of `roborl demos`, demos.py; a LeRobot v3 dataset, lerobot_dataset.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class DemoWindows:
    """Training windows from demonstrations: `obs` M×(n·D) (the last n states, oldest first, padded with
    the episode's first state) and `actions` M×H×A (the next H actions, padded with the last action);
    `instructions` (M strings, each window's episode instruction) and, with `images=True`, `rgb` (M×H×W×3,
    the current frame) for language- and image-conditioned policies."""
    obs: torch.Tensor
    actions: torch.Tensor
    episodes: int
    env_args: dict
    instructions: list[str] = field(default_factory=list)
    rgb: torch.Tensor | None = None


def episode_windows(state: torch.Tensor, actions: torch.Tensor, obs_history: int,
                    horizon: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One episode's windows: for each step the last `obs_history` states (T×(n·D)) and the next `horizon`
    actions (T×H×A), padded with the episode's first state and last action."""
    t = torch.arange(len(actions))
    hist = (t[:, None] + torch.arange(-obs_history + 1, 1)[None]).clamp(min=0)
    future = (t[:, None] + torch.arange(horizon)[None]).clamp(max=len(actions) - 1)
    return state[hist].flatten(1), actions[future]
