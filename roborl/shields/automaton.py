"""A pre-emptive shield from a safety automaton over labels (Alshiekh et al.'s shield synthesis, with
a one-step label model in place of the abstraction).

The automaton is a `RewardMachine` whose failing states are unsafe. `predict(obs, action)` says which of
its labels an action would make true in the next step (labels of the action itself, such as "the
gripper opens", and of the state it acts in). Before an action runs, the shield steps the automaton on
the prediction; where that would reach an unsafe state it substitutes `fallback(obs, action)` and, if
even that is unsafe, reports the env as infeasible. After the step it advances the automaton on the
executed action.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from roborl.rm.compiled import CompiledRM
from roborl.rm.machine import RewardMachine
from roborl.shields.base import Shield

Predict = Callable[[dict, torch.Tensor], torch.Tensor]


class AutomatonShield(Shield):
    def __init__(self, machine: RewardMachine, label_names: list[str], predict: Predict,
                 fallback: Callable[[dict, torch.Tensor], torch.Tensor]) -> None:
        if not machine.failing:
            raise ValueError("a safety automaton needs failing (unsafe) states")
        self.machine = CompiledRM(machine, label_names)
        self.unsafe = torch.tensor([s in machine.failing for s in machine.states])
        self.predict, self.fallback = predict, fallback
        self.state: torch.Tensor | None = None

    def _next(self, obs: dict, action: torch.Tensor) -> torch.Tensor:
        if self.state is None:
            self.state = torch.full((action.shape[0],), self.machine.initial, dtype=torch.long)
        return self.machine.step(self.state, self.predict(obs, action).cpu())[0]

    def __call__(self, obs: dict, action: torch.Tensor):
        unsafe = self.unsafe[self._next(obs, action)].to(action.device)
        safe = action
        infeasible = torch.zeros_like(unsafe)
        if unsafe.any():
            safe = torch.where(unsafe[:, None], self.fallback(obs, action), action)
            infeasible = unsafe & self.unsafe[self._next(obs, safe)].to(action.device)
        return safe, unsafe, {"infeasible": infeasible}

    def observe(self, obs: dict, executed: torch.Tensor, info: dict) -> None:
        self.state = self._next(obs, executed)

    def reset(self, mask: torch.Tensor | None = None) -> None:
        if self.state is not None:
            self.state[mask.cpu() if mask is not None else slice(None)] = self.machine.initial

    def reached_unsafe(self) -> torch.Tensor:
        return self.unsafe[self.state] if self.state is not None else torch.zeros(0, dtype=torch.bool)
