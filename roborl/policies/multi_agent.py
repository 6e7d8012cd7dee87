"""Per-agent actors for multi-agent PPO (MAPPO): one MLP per agent, each reading only its agent's columns of
the (normalized) state and producing its agent's action dims, concatenated in action order. Used as the actor
of `GaussianActorCritic`, whose critic still reads the whole state: decentralized actors, a centralized critic.
The joint action's log-prob is the sum of the agents' (independent Gaussians), so PPO's ratio and clipping apply
to the joint action of a shared (cooperative) reward."""
from __future__ import annotations

import torch
from torch import nn


class PerAgentActor(nn.Module):
    def __init__(self, agents: dict[str, tuple[tuple[int, ...], int]], make_mlp) -> None:
        """`agents`: name -> (the state columns it observes, its action dims), in action order; `make_mlp(in,
        out)` builds one agent's network."""
        super().__init__()
        self.names = list(agents)
        for name, (columns, _) in agents.items():
            self.register_buffer(f"columns_{name}", torch.tensor(columns, dtype=torch.long), persistent=False)
        self.nets = nn.ModuleDict({name: make_mlp(len(columns), dim) for name, (columns, dim) in agents.items()})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.nets[name](x[:, getattr(self, f"columns_{name}")]) for name in self.names], -1)
