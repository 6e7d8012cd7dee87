"""One actor per callable machine of a hierarchy of reward machines (`policy.actors: per_machine` with
`env.rm.learner: options`): the HRM learner's policy per machine (Furelos-Blanco et al. 2023), instead of one
network told apart by the option's one-hot. Each actor reads the whole state (the option's one-hot included, so
it sees its machine's state); the row's machine, a one-hot in the last `machines` input columns, picks whose
output is used, so an actor is trained only on the steps where its machine runs. Used as the actor of
`GaussianActorCritic`, whose critic stays one network (its input is the same)."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class PerMachineActor(nn.Module):
    def __init__(self, machines: int, make_mlp: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.machines = machines
        self.nets = nn.ModuleList([make_mlp() for _ in range(machines)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, inputs = x[:, -self.machines:], x[:, :-self.machines]
        out = gate[:, :1] * self.nets[0](inputs)
        for m in range(1, self.machines):
            out = out + gate[:, m:m + 1] * self.nets[m](inputs)
        return out
