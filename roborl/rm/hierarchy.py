"""Hierarchies of reward machines (HRMs, Furelos-Blanco et al. 2023): an edge of a machine may call another.

A `Hierarchy` is a set of named machines and its root. A call edge `(u, u', call M, 'context', reward)` of a
machine K is taken, as a plain edge is, when its context holds for the step's labels (at most one edge of a
state may hold, call or not). The run then goes on in M's initial state, which reads the same labels (a call
takes no step of its own), and once M reaches an accepting state it returns to K in u', which pays the call
edge's reward. A state with several call edges (and no other edge) is a choice, as in the HRM paper: it
waits, paying nothing, until the labels start one of its callees (the callee, entered on these labels, would
leave its initial state, or call a machine that starts), and then takes that call; two callees that start on
the same labels are refused. Which call to pursue while a choice waits is the option learner's to learn
(roborl/rm/hierarchy_env.py). A machine that fails fails the whole hierarchy; the hierarchy accepts when the
root accepts. A step pays the rewards of every edge it takes, at every level. An edge may pay one of the task's reward terms
(`approach_a`: dense progress while a machine waits) unless it completes a call, whose return adds the caller's
number. What the innermost machine's own edge pays in a step is that machine's reward (`own`): the option
learner (roborl/rm/hierarchy_env.py) trains each callable machine's option on it. Calls nest but never recurse,
so a configuration (the call stack with each caller's return state, and the innermost state) is one of finitely
many:

- `Hierarchy.step(config, labels)`: the one-env reference semantics;
- `flatten(h)`: the flat `RewardMachine` over the reachable configurations (what a flat learner is given);
- `CompiledHierarchy`: N envs at once, the call stack as small long tensors per env, per-machine tables as
  `CompiledRM`'s.

Text: the machines one after the other, each after a line `machine NAME` (the first is the root), in the
reward-machine text format with `unmatched: stay` semantics and call edges `(u, u', call NAME, 'context', r)`.
`sequence([...])` builds the hierarchy of an LTLf task that splits into sub-formulas done one after another;
`roborl.rm.ltlf_split.split_ltlf(formula)` finds the split of one formula by itself.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import torch

from roborl.rm.formula import evaluate
from roborl.rm.machine import Edge, Reward, RewardMachine

Frame = tuple[str, str, float]  # (machine, state, reward its call edge pays on return); the innermost pays 0
Config = tuple[Frame, ...]
FAILED: Config = (("", "failed", 0.0),)


@dataclass
class Hierarchy:
    machines: dict[str, RewardMachine]
    root: str

    def __post_init__(self) -> None:
        if self.root not in self.machines:
            raise ValueError(f"hierarchy: the root '{self.root}' is not one of its machines ({sorted(self.machines)})")
        for name, machine in self.machines.items():
            if machine.unmatched != "stay":
                raise ValueError(f"hierarchy: machine '{name}' must stay where no edge holds (unmatched: stay)")
            for callee in machine.calls:
                if callee not in self.machines:
                    raise ValueError(f"hierarchy: machine '{name}' calls '{callee}', which is not defined")
                called = self.machines[callee]
                if not called.accepting:
                    raise ValueError(f"hierarchy: machine '{callee}' is called but never accepts (no return)")
                if called.initial in called.accepting:
                    raise ValueError(f"hierarchy: machine '{callee}' accepts in its initial state: a call would do nothing")
            for e in machine.edges:
                if isinstance(e.reward, str) and (e.call is not None or (name != self.root and e.dst in machine.accepting)):
                    raise ValueError(f"hierarchy: machine '{name}' pays the reward term '{e.reward}' on an edge that "
                                     "calls or returns; those pay numbers (a term can be paid while a machine waits)")
        self.depth = self._depth(self.root, ())
        self.choices: dict[tuple[str, str], list[Edge]] = {}  # (machine, state) of each choice: its call edges
        for name, machine in self.machines.items():
            for state in machine.states:
                edges = [e for e in machine.edges if e.src == state]
                calls = [e for e in edges if e.call is not None]
                if len(calls) > 1 and len(calls) < len(edges):
                    raise ValueError(f"hierarchy: state '{state}' of machine '{name}' calls several machines (a "
                                     "choice) and has plain edges too; a choice state has call edges only")
                if len(calls) > 1:
                    self.choices[(name, state)] = calls

    def _depth(self, name: str, path: tuple[str, ...]) -> int:
        """Levels of calls below `name` (1: calls nothing); refuses recursion."""
        if name in path:
            raise ValueError(f"hierarchy: machines call themselves ({' -> '.join((*path, name))}); calls may not recurse")
        callees = self.machines[name].calls
        return 1 + max((self._depth(c, (*path, name)) for c in callees), default=0)

    def edge_taken(self, name: str, state: str, true_labels: set[str]) -> Edge | None:
        """The edge that `state` of machine `name` takes on these labels (None: it stays). A choice takes the
        call whose context holds and whose callee starts on them."""
        calls = self.choices.get((name, state))
        if calls is None:
            return self.machines[name].edge_taken(state, true_labels)
        starting = [e for e in calls if evaluate(e.tree, true_labels) and self.starts(e.call, true_labels)]
        if len(starting) > 1:
            raise ValueError(f"hierarchy is not deterministic: the choice '{state}' of machine '{name}' could call "
                             f"{' and '.join(e.call for e in starting)} on labels {sorted(true_labels)}, which start "
                             "both; give the calls contexts that exclude each other there")
        return starting[0] if starting else None

    def starts(self, name: str, true_labels: set[str]) -> bool:
        """Whether machine `name`, called on these labels, moves: its initial state takes an edge to another
        state, or a call whose callee starts."""
        initial = self.machines[name].initial
        edge = self.edge_taken(name, initial, true_labels)
        if edge is None:
            return False
        return self.starts(edge.call, true_labels) if edge.call is not None else edge.dst != initial

    @property
    def labels(self) -> set[str]:
        return set().union(*(m.labels for m in self.machines.values()))

    @property
    def initial(self) -> Config:
        return ((self.root, self.machines[self.root].initial, 0.0),)

    def accepts(self, config: Config) -> bool:
        return len(config) == 1 and config[0][0] == self.root and config[0][1] in self.machines[self.root].accepting

    def fails(self, config: Config) -> bool:
        return config == FAILED

    def step(self, config: Config, true_labels: set[str],
             terms: dict[str, float] | None = None) -> tuple[Config, float]:
        """The reference semantics of one step of one env: (next configuration, reward); `terms` are the task's
        reward terms of this step, by name."""
        config, own, paid, _ = self.transition(config, true_labels)
        own_value = (terms or {}).get(own, 0.0) if isinstance(own, str) else own
        return config, own_value + paid

    def transition(self, config: Config, true_labels: set[str]) -> tuple[Config, Reward, float, bool]:
        """One step of one env: (next configuration, what the innermost machine's own edge pays (a number or a
        reward term), what the returns pay, whether a call returned)."""
        if self.accepts(config) or self.fails(config):
            return config, 0.0, 0.0, False
        stack = list(config)
        while True:
            name, state, _ = stack[-1]
            machine = self.machines[name]
            edge = self.edge_taken(name, state, true_labels)
            if edge is None:
                return tuple(stack), 0.0, 0.0, False
            if edge.call is not None:  # the callee reads the same labels
                stack[-1] = (name, edge.dst, float(edge.reward))
                stack.append((edge.call, self.machines[edge.call].initial, 0.0))
                continue
            own = edge.reward if isinstance(edge.reward, str) else float(edge.reward)
            stack[-1] = (name, edge.dst, 0.0)
            if edge.dst in machine.failing:
                return FAILED, own, 0.0, False
            paid, returned = 0.0, False
            while len(stack) > 1 and stack[-1][1] in self.machines[stack[-1][0]].accepting:  # returns
                stack.pop()
                caller, back, pays = stack[-1]
                paid += pays
                returned = True
                stack[-1] = (caller, back, 0.0)
            return tuple(stack), own, paid, returned

    @classmethod
    def from_text(cls, text: str) -> Hierarchy:
        text = "\n".join(ln.split("#", 1)[0].rstrip() for ln in text.splitlines())
        parts = re.split(r"^\s*machine\s+(\w+)\s*$", text, flags=re.M)
        if len(parts) < 3 or parts[0].strip():
            raise ValueError("hierarchy text: starts with `machine NAME` (the root), then that machine's lines")
        machines: dict[str, RewardMachine] = {}
        for name, body in zip(parts[1::2], parts[2::2]):
            if name in machines:
                raise ValueError(f"hierarchy text: machine '{name}' is defined twice")
            lines = [ln for ln in body.splitlines() if ln.strip()]
            head = 3 if len(lines) > 2 and lines[2].lstrip().startswith("[") else 2  # with the failing states' line
            try:  # the hierarchy's semantics: stay where no edge holds
                machines[name] = RewardMachine.from_text("\n".join([*lines[:head], "unmatched: stay", *lines[head:]]))
            except ValueError as exc:
                raise ValueError(f"hierarchy text, machine '{name}': {exc}") from exc
        return cls(machines, parts[1])


def sequence(formulas: list[str]) -> Hierarchy:
    """The hierarchy of an LTLf task that is its sub-formulas done one after another: each sub-formula compiled
    to a machine (through MONA, roborl.rm.ltlf), and a root that calls them in order, paying 1 at the end."""
    from roborl.rm.ltlf import from_ltlf
    from roborl.rm.machine import RMBuilder

    root = RMBuilder("s0")
    machines = {}
    for i, formula in enumerate(formulas):
        name = f"f{i}"
        machines[name] = from_ltlf(formula)  # pays 1 when its sub-formula holds, where the call returns
        root.call(f"s{i}", f"s{i + 1}", name, "true", 1.0 if i == len(formulas) - 1 else 0.0)
    machines["root"] = root.accepting(f"s{len(formulas)}").build()
    return Hierarchy(machines, "root")


def label_sets(labels: list[str]) -> list[frozenset[str]]:
    return [frozenset(c) for r in range(len(labels) + 1) for c in itertools.combinations(labels, r)]


def config_name(config: Config) -> str:
    return "failed" if config == FAILED else "/".join(f"{m}.{s}" for m, s, _ in config)


def flatten(h: Hierarchy) -> RewardMachine:
    """The flat machine over the hierarchy's reachable configurations: the same rewards and episode ends on
    every label sequence (a guard per edge as the disjunction of the label sets that take it)."""
    labels = sorted(h.labels)
    combos = label_sets(labels)
    seen, todo, edges = {h.initial}, [h.initial], {}
    while todo:
        config = todo.pop()
        for combo in combos:
            nxt, own, paid, _ = h.transition(config, set(combo))
            reward = own if isinstance(own, str) else own + paid  # a term is never paid with a return
            if nxt != config or reward != 0.0:
                edges.setdefault((config, nxt, reward), []).append(combo)
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    def minterm(combo: frozenset[str]) -> str:
        return " & ".join(name if name in combo else f"!{name}" for name in labels) or "true"

    flat_edges = [Edge(config_name(a), config_name(b), " | ".join(f"({minterm(c)})" for c in combos), r)
                  for (a, b, r), combos in edges.items()]
    ordered = sorted(seen, key=lambda c: (c != h.initial, config_name(c)))
    return RewardMachine([config_name(c) for c in ordered], config_name(h.initial), flat_edges,
                         accepting={config_name(c) for c in seen if h.accepts(c)},
                         failing={config_name(c) for c in seen if h.fails(c)})


class CompiledHierarchy:
    """N envs of a hierarchy at once. Per env: the call stack (`machine`, `state`: D long each, the innermost
    at `depth`; `paid`: D float, what each caller's call edge pays on return), `failed`, and what the last step
    did: `own` (what the innermost machine's own edge paid) and `returned` (a call returned). Per machine k,
    padded to the largest machine: `next_state[k, u, code]`, `reward[k, u, code]`, `term[k, u, code]` (−1: none;
    else the column of the task's reward terms the edge pays) and `callee[k, u, code]` (−1: a plain edge or
    none) over the label codes of `label_names`, as `CompiledRM` builds them."""

    def __init__(self, h: Hierarchy, label_names: list[str] | tuple[str, ...],
                 term_names: list[str] | tuple[str, ...] = (), device: torch.device | str = "cpu") -> None:
        label_names, term_names = list(label_names), list(term_names)
        unknown = h.labels - set(label_names)
        if unknown:
            raise ValueError(f"hierarchy uses labels {sorted(unknown)} that the env does not publish ({label_names})")
        missing = {t for m in h.machines.values() for t in m.terms} - set(term_names)
        if missing:
            raise ValueError(f"hierarchy pays reward terms {sorted(missing)} that the env does not publish "
                             f"(its reward terms: {term_names or 'none'})")
        self.h, self.label_names, self.term_names = h, label_names, term_names
        self.names = list(h.machines)
        K, U, C = len(self.names), max(len(m.states) for m in h.machines.values()), 2 ** len(label_names)
        self.next_state = torch.zeros(K, U, C, dtype=torch.long)
        self.reward = torch.zeros(K, U, C)
        self.callee = torch.full((K, U, C), -1, dtype=torch.long)
        self.term = torch.full((K, U, C), -1, dtype=torch.long)
        self.accepting = torch.zeros(K, U, dtype=torch.bool)
        self.failing = torch.zeros(K, U, dtype=torch.bool)
        self.initial_state = torch.zeros(K, dtype=torch.long)
        for k, name in enumerate(self.names):
            m = h.machines[name]
            index = {s: i for i, s in enumerate(m.states)}
            self.initial_state[k] = index[m.initial]
            for s in m.states:
                self.accepting[k, index[s]] = s in m.accepting
                self.failing[k, index[s]] = s in m.failing
                for code in range(C):
                    edge = h.edge_taken(name, s, {n for bit, n in enumerate(label_names) if code >> bit & 1})
                    self.next_state[k, index[s], code] = index[edge.dst] if edge else index[s]
                    if edge is not None and isinstance(edge.reward, str):
                        self.term[k, index[s], code] = term_names.index(edge.reward)
                    elif edge is not None:
                        self.reward[k, index[s], code] = float(edge.reward)
                        if edge.call is not None:
                            self.callee[k, index[s], code] = self.names.index(edge.call)
        tables = ("next_state", "reward", "term", "callee", "accepting", "failing", "initial_state")
        for key in tables:
            setattr(self, key, getattr(self, key).to(device))
        self.bits = (2 ** torch.arange(len(label_names))).to(device)
        self.root = self.names.index(h.root)
        self.max_depth = h.depth
        self.device = torch.device(device)

    def reset(self, n: int) -> dict[str, torch.Tensor]:
        """The stacks of `n` envs at the root's initial state."""
        D = self.max_depth
        machine = torch.full((n, D), self.root, dtype=torch.long, device=self.device)
        state = torch.zeros(n, D, dtype=torch.long, device=self.device)
        state[:, 0] = self.initial_state[self.root]
        return {"machine": machine, "state": state, "paid": torch.zeros(n, D, device=self.device),
                "depth": torch.zeros(n, dtype=torch.long, device=self.device),
                "failed": torch.zeros(n, dtype=torch.bool, device=self.device),
                "own": torch.zeros(n, device=self.device),
                "returned": torch.zeros(n, dtype=torch.bool, device=self.device)}

    def accepts(self, stack: dict) -> torch.Tensor:
        top = self.top(stack)
        return (stack["depth"] == 0) & self.accepting[top[0], top[1]] & ~stack["failed"]

    def top(self, stack: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The innermost machine of each stack and its state."""
        rows = torch.arange(len(stack["depth"]), device=self.device)
        return stack["machine"][rows, stack["depth"]], stack["state"][rows, stack["depth"]]

    def step(self, stack: dict, labels: torch.Tensor, terms: torch.Tensor | None = None) -> tuple[dict, torch.Tensor]:
        """(the stacks after one step, reward N) for labels N×P (bool) and the task's reward terms N×T."""
        stack = {k: v.clone() for k, v in stack.items()}
        n = len(labels)
        rows = torch.arange(n, device=self.device)
        code = (labels.long() * self.bits).sum(-1)
        reward = torch.zeros(n, device=self.device)
        stack["own"] = torch.zeros(n, device=self.device)
        stack["returned"] = torch.zeros(n, dtype=torch.bool, device=self.device)
        active = ~(stack["failed"] | self.accepts(stack))
        for _ in range(self.max_depth):  # at most D − 1 calls in one step, then a plain edge or none
            m, u = self.top(stack)
            d = stack["depth"]
            callee = self.callee[m, u, code]
            nxt = self.next_state[m, u, code]
            calling = active & (callee >= 0)
            plain = active & (callee < 0)
            # a call: the caller waits in its return state; the callee starts and reads the same labels
            stack["state"][rows[calling], d[calling]] = nxt[calling]
            stack["paid"][rows[calling], d[calling]] = self.reward[m, u, code][calling]
            d_in = d[calling] + 1
            stack["machine"][rows[calling], d_in] = callee[calling]
            stack["state"][rows[calling], d_in] = self.initial_state[callee[calling]]
            stack["paid"][rows[calling], d_in] = 0.0
            stack["depth"][calling] = d_in
            # a plain edge (or none: the state stays): its reward, failure, then the returns it completes
            own = self.reward[m, u, code]
            term = self.term[m, u, code]
            if terms is not None and terms.shape[-1] > 0:
                pays = terms.to(own.dtype).gather(-1, term.clamp(min=0)[:, None]).squeeze(-1)
                own = torch.where(term >= 0, pays, own)
            own = torch.where(plain, own, torch.zeros_like(own))
            stack["own"] = stack["own"] + own
            reward = reward + own
            stack["state"][rows[plain], d[plain]] = nxt[plain]
            stack["failed"] |= plain & self.failing[m, nxt]
            returning = plain & ~stack["failed"]
            for _ in range(self.max_depth - 1):
                tm, tu = self.top(stack)
                back = returning & (stack["depth"] > 0) & self.accepting[tm, tu]
                stack["depth"] = stack["depth"] - back.long()
                paid = stack["paid"][rows, stack["depth"]]
                reward = reward + torch.where(back, paid, torch.zeros_like(paid))
                stack["returned"] |= back
                stack["paid"][rows[back], stack["depth"][back]] = 0.0
                returning = back
            active = calling
            if not active.any():
                break
        return stack, reward

    def configs(self, stack: dict) -> list[Config]:
        """The stacks as the reference's configurations (for tests and logs)."""
        out = []
        for i in range(len(stack["depth"])):
            if stack["failed"][i]:
                out.append(FAILED)
                continue
            frames = []
            for level in range(int(stack["depth"][i]) + 1):
                name = self.names[int(stack["machine"][i, level])]
                state = self.h.machines[name].states[int(stack["state"][i, level])]
                frames.append((name, state, float(stack["paid"][i, level])))
            out.append(tuple(frames))
        return out
