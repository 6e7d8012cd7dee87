"""A reward machine as tensors, stepped for N environments at once.

The labels of a step are a bit vector over the env's `label_names`; its integer code indexes a
transition table `next_state[U, 2^P]`, a constant reward table `reward[U, 2^P]` and a reward-term table
`term[U, 2^P]` (−1: none; else the column of `info["reward_terms"]` the edge pays). Building the tables
runs the reference semantics of `RewardMachine.step` once per (state, label combination).
"""
from __future__ import annotations

import torch

from roborl.rm.machine import RewardMachine

MAX_LABELS = 16


class CompiledRM:
    def __init__(self, rm: RewardMachine, label_names: tuple[str, ...] | list[str],
                 term_names: tuple[str, ...] | list[str] = (), device: torch.device | str = "cpu") -> None:
        label_names, term_names = list(label_names), list(term_names)
        unknown = rm.labels - set(label_names)
        if unknown:
            raise ValueError(f"reward machine uses labels {sorted(unknown)} that the env does not publish "
                             f"(its labels: {label_names})")
        missing = set(rm.terms) - set(term_names)
        if missing:
            raise ValueError(f"reward machine pays reward terms {sorted(missing)} that the env does not publish "
                             f"(its reward terms: {term_names or 'none'})")
        if len(label_names) > MAX_LABELS:
            raise ValueError(f"a compiled reward machine handles up to {MAX_LABELS} labels, the env has {len(label_names)}")
        self.rm, self.label_names, self.term_names = rm, label_names, term_names
        U, C = len(rm.states), 2 ** len(label_names)
        index = {s: i for i, s in enumerate(rm.states)}
        nxt = torch.zeros(U, C, dtype=torch.long)
        reward = torch.zeros(U, C)
        term = torch.full((U, C), -1, dtype=torch.long)
        for code in range(C):
            true = {name for bit, name in enumerate(label_names) if code >> bit & 1}
            for s in rm.states:
                dst, r = rm.step(s, true)
                nxt[index[s], code] = index[dst]
                if isinstance(r, str):
                    term[index[s], code] = term_names.index(r)
                else:
                    reward[index[s], code] = r
        self.next_state, self.reward, self.term = nxt.to(device), reward.to(device), term.to(device)
        self.initial = index[rm.initial]
        self.accepting = torch.tensor([s in rm.accepting for s in rm.states], device=device)
        self.terminal = torch.tensor([s in rm.terminal for s in rm.states], device=device)
        self.bits = (2 ** torch.arange(len(label_names))).to(device)
        self.num_states = U

    def codes(self, labels: torch.Tensor) -> torch.Tensor:
        """N×P bool labels → N integer codes."""
        return (labels.long() * self.bits).sum(-1)

    def step(self, state: torch.Tensor, labels: torch.Tensor,
             terms: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(next state N, reward N) for states N (long) and labels N×P; `terms` N×T the task's reward terms."""
        code = self.codes(labels)
        nxt = self.next_state[state, code]
        reward = self.reward[state, code]
        if terms is not None and terms.shape[-1] > 0:
            t = self.term[state, code]
            paid = terms.gather(-1, t.clamp(min=0)[:, None]).squeeze(-1).float()
            reward = torch.where(t >= 0, paid, reward)
        return nxt, reward

    def values(self, gamma: float, iterations: int = 1000, term_bound: float = 0.0) -> torch.Tensor:
        """V(u) by value iteration on the RM as a deterministic MDP whose actions pick the labels
        (optimistic: the best any label sequence can earn), with V = 0 at terminal states. A reward term
        counts as `term_bound` (its assumed best per-step value)."""
        reward = torch.where(self.term >= 0, torch.full_like(self.reward, term_bound), self.reward)
        v = torch.zeros(self.num_states, device=self.reward.device)
        for _ in range(iterations):
            q = reward + gamma * v[self.next_state]
            new = torch.where(self.terminal, torch.zeros_like(v), q.max(-1).values)
            if torch.allclose(new, v, atol=1e-7):
                break
            v = new
        return v
