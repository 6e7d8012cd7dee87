"""SMDP Q-learning of a hierarchy's choices among calls (the HRM paper's learner over calls).

A decision is made where an env's call stack rests in a choice state (roborl/rm/hierarchy.py) and lasts until
the next choice point of that env or the end of its episode: its return is what call edges pay on return
(the callers' rewards, not the options' own) over those k env steps, discounted by γ per step, and its target
bootstraps γ^k max Q at the next choice (none past a terminal step; a truncated decision is dropped). Each
env step adds the decisions that ended to a replay of the latest few thousand (older ones were made under
option policies that have since improved) and takes a few gradient steps on batches of them, against a
slowly following target network. The Q-network is the policy's `CallChooser`; the replay and optimizer start
over when a run resumes (the weights do not)."""
from __future__ import annotations

import copy

import torch
from torch import nn

from roborl.policies.call_chooser import CallChooser


class CallLearner:
    def __init__(self, chooser: CallChooser, num_envs: int, gamma: float = 0.99, lr: float = 1e-3,
                 batch: int = 256, capacity: int = 4096, tau: float = 0.01, steps: int = 4) -> None:
        self.chooser, self.gamma, self.lr, self.batch, self.capacity = chooser, gamma, lr, batch, capacity
        self.tau, self.steps = tau, steps
        self.target: CallChooser | None = None  # made at the first update, where the chooser's device is final
        self.optimizer: torch.optim.Optimizer | None = None
        self.num_envs, self.calls = num_envs, chooser.q[-1].out_features
        self.open = torch.zeros(num_envs, dtype=torch.bool)
        self.x: torch.Tensor | None = None  # each env's open decision: the state it was made in, the call,
        self.call = torch.zeros(num_envs, dtype=torch.long)  # what it has been paid so far, and γ^k
        self.paid = torch.zeros(num_envs)
        self.discount = torch.ones(num_envs)
        self.replay: dict[str, torch.Tensor] = {}
        self.size = self.pos = 0
        self.updates = 0

    def decide(self, rows: torch.Tensor, x: torch.Tensor, mask: torch.Tensor, call: torch.Tensor) -> None:
        """Decisions made now in `rows` (states `x`, their calls' mask, the calls taken): the decision each of
        those rows had open ends here, bootstrapped from this choice."""
        rows = rows.cpu()
        if self.x is None:
            self.x = torch.zeros(self.num_envs, x.shape[1])
        ending = rows[self.open[rows]]
        if len(ending):
            where = self.open[rows]
            self._store(ending, x.cpu()[where], mask.cpu()[where], torch.zeros(len(ending), dtype=torch.bool))
        self.chooser.normalizer.update(x)
        self.open[rows] = True
        self.x[rows], self.call[rows] = x.cpu(), call.cpu()
        self.paid[rows], self.discount[rows] = 0.0, 1.0

    def pay(self, reward: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor) -> None:
        """One env step: what call edges paid (N); the decisions of ended episodes end (terminal) or are dropped."""
        reward, terminated, truncated = reward.cpu().float(), terminated.cpu(), truncated.cpu()
        self.paid += torch.where(self.open, self.discount * reward, torch.zeros_like(reward))
        self.discount *= self.gamma
        ending = (self.open & terminated).nonzero().flatten()
        if len(ending):
            self._store(ending, torch.zeros(len(ending), self.x.shape[1]),
                        torch.zeros(len(ending), self.calls, dtype=torch.bool), torch.ones(len(ending), dtype=torch.bool))
        self.open &= ~(terminated | truncated)

    def drop_all(self) -> None:
        self.open[:] = False

    def _store(self, rows: torch.Tensor, next_x: torch.Tensor, next_mask: torch.Tensor, done: torch.Tensor) -> None:
        item = {"x": self.x[rows], "call": self.call[rows], "paid": self.paid[rows], "discount": self.discount[rows],
                "next_x": next_x, "mask": next_mask, "done": done}
        if not self.replay:
            self.replay = {k: torch.zeros(self.capacity, *v.shape[1:], dtype=v.dtype) for k, v in item.items()}
        index = (self.pos + torch.arange(len(rows))) % self.capacity
        for k, v in item.items():
            self.replay[k][index] = v
        self.pos = (self.pos + len(rows)) % self.capacity
        self.size = min(self.size + len(rows), self.capacity)
        self.open[rows] = False

    def update(self) -> float | None:
        """`steps` gradient steps on batches of ended decisions: the last loss (None: fewer than a batch so far)."""
        if self.size < self.batch:
            return None
        return [self.gradient_step() for _ in range(self.steps)][-1]

    def gradient_step(self) -> float:
        if self.target is None:
            self.target = copy.deepcopy(self.chooser).requires_grad_(False)
            self.optimizer = torch.optim.Adam(self.chooser.parameters(), lr=self.lr)
        device = next(self.chooser.parameters()).device
        pick = torch.randint(self.size, (self.batch,))
        b = {k: v[pick].to(device) for k, v in self.replay.items()}
        with torch.no_grad():
            best = self.target.q(self.chooser.normalizer(b["next_x"])).masked_fill(~b["mask"], float("-inf")).max(-1).values
            target = b["paid"] + b["discount"] * torch.where(b["done"], torch.zeros_like(best), best)
        with torch.enable_grad():  # the env steps inside the collector's no_grad
            q = self.chooser(b["x"]).gather(-1, b["call"][:, None]).squeeze(-1)
            loss = nn.functional.smooth_l1_loss(q, target)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)  # the policy's own optimizer, over all its parameters, skips these
        with torch.no_grad():
            for p, t in zip(self.chooser.parameters(), self.target.parameters()):
                t.lerp_(p, self.tau)
        self.updates += 1
        return float(loss.detach())
