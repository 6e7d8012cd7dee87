"""The Shield interface (docs/architecture.md): `shield(obs, action) -> (safe_action, intervened, info)`, batched.

A shield sees the observation the policy acted on and the action it proposed, and returns an action
that satisfies its constraint, which envs it changed (N bool) and per-env `info` tensors
(`correction`: how far it moved the action; `infeasible`: no action satisfies the constraint, the
returned one is the best effort). Shields compose in a `ShieldChain`, applied in order. Stateful
shields (action-rate limits, automata) are told about episode ends through `reset(mask)`.
"""
from __future__ import annotations

import torch


class Shield:
    def __call__(self, obs: dict, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError

    def reset(self, mask: torch.Tensor | None = None) -> None:
        """Forget per-episode state for the envs in `mask` (all when None)."""

    def observe(self, obs: dict, executed: torch.Tensor, info: dict) -> None:
        """After the env stepped with `executed`: update per-episode state (previous action, automaton)."""


class ShieldChain(Shield):
    def __init__(self, shields: list[Shield]) -> None:
        self.shields = list(shields)

    def __call__(self, obs: dict, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        proposed = action
        intervened = torch.zeros(action.shape[0], dtype=torch.bool, device=action.device)
        infeasible = intervened.clone()
        for shield in self.shields:
            action, changed, info = shield(obs, action)
            intervened |= changed
            if "infeasible" in info:
                infeasible |= info["infeasible"]
        return action, intervened, {"correction": (action - proposed).norm(dim=-1), "infeasible": infeasible}

    def reset(self, mask: torch.Tensor | None = None) -> None:
        for shield in self.shields:
            shield.reset(mask)

    def observe(self, obs: dict, executed: torch.Tensor, info: dict) -> None:
        for shield in self.shields:
            shield.observe(obs, executed, info)


def changed(before: torch.Tensor, after: torch.Tensor, tol: float = 1e-6) -> torch.Tensor:
    return (after - before).abs().amax(-1) > tol
