"""Reward machines: finite automata over the task's labels whose edges carry rewards.

An RM has states, an initial state, edges (u, u', guard, reward) with propositional guards over label
names (`roborl.rm.formula`), and terminal states: accepting (the task is done) or failing. In a state,
the edge whose guard holds for this step's labels is taken. Two edges of one state may not both hold for
the same labels (checked when compiled). Where no edge holds, `unmatched` decides:
- "fail" (the original code's semantics, Toro Icarte et al.): the machine falls to a terminal failure
  state with reward 0, so the episode ends. A machine in the original text format means this: a hazard
  that no edge allows (e.g. every edge guarded by `!h`) ends the episode. It is made explicit as a failing
  state `unmatched` reached by the complement of each state's guards (only where the guards leave a gap).
- "stay" (roborl's extension, the default of `RMBuilder`): the machine stays in its state, with reward 0.

A reward is a number or the name of a reward term the task publishes each step in
`info["reward_terms"]` (as the original code's `RewardFunction`s computed rewards from the state):
e.g. a self-loop `(0, 0, '!at_a', approach_a)` pays the dense progress toward target A while the
machine waits for `at_a`.

Three ways to write one, all giving this class:
- Python: `RMBuilder().edge("u0", "u1", "a & !b", 1.0).accepting("u1").build()`
- text (the format of the reward_machines code, read with its semantics): line 1 the initial state,
  line 2 the terminal states as a list, then one `(u, u', 'guard', reward)` per line, reward a number
  or `ConstantRewardFunction(x)`; `#` starts a comment. roborl's extensions, each opt-in: a reward may
  name a reward term; an optional bracketed line after line 2 lists the terminal states that are failures
  (the rest accept); a line `unmatched: stay` makes the machine stay where no edge holds.
- LTLf: `roborl.rm.ltlf.from_ltlf("F(a & F(b))")` through a DFA compiled by MONA.
"""
from __future__ import annotations

import ast
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

from roborl.rm.formula import Formula, evaluate, parse, variables

Reward = float | str


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    guard: str
    reward: Reward
    tree: Formula = field(compare=False, repr=False, default=None)
    call: str | None = None  # a hierarchy's call edge: the machine it calls (roborl/rm/hierarchy.py)


@dataclass
class RewardMachine:
    states: list[str]
    initial: str
    edges: list[Edge]
    accepting: set[str] = field(default_factory=set)
    failing: set[str] = field(default_factory=set)
    unmatched: str = "stay"  # where no edge holds: "stay" (roborl) or "fail" (the original code)

    def __post_init__(self) -> None:
        known = set(self.states)
        for s in [self.initial, *self.accepting, *self.failing, *(e.src for e in self.edges), *(e.dst for e in self.edges)]:
            if s not in known:
                raise ValueError(f"reward machine: state '{s}' is used but not declared (states: {self.states})")
        if self.unmatched not in UNMATCHED:
            raise ValueError(f"reward machine: unmatched '{self.unmatched}' is unknown; available: {', '.join(UNMATCHED)}")
        self.edges = [e if e.tree is not None else Edge(e.src, e.dst, e.guard, e.reward, parse(e.guard), e.call)
                      for e in self.edges]
        if self.unmatched == "fail":
            self._fall_where_no_edge_holds()

    def _fall_where_no_edge_holds(self) -> None:
        """The original semantics as edges: from each non-terminal state, the complement of its guards leads
        to the failing state `unmatched` (reward 0), where some labels satisfy that complement."""
        labels = sorted(self.labels)
        combos = [frozenset(c) for r in range(len(labels) + 1) for c in itertools.combinations(labels, r)]
        for state in [s for s in self.states if s not in self.terminal]:
            guards = [e.guard for e in self.edges if e.src == state]
            rest = "!(" + " | ".join(f"({g})" for g in guards) + ")" if guards else "true"
            tree = parse(rest)
            if any(evaluate(tree, combo) for combo in combos):
                if FALLEN not in self.states:
                    self.states.append(FALLEN)
                    self.failing.add(FALLEN)
                self.edges.append(Edge(state, FALLEN, rest, 0.0, tree))
        self.unmatched = "stay"  # every state now has an edge for every label set

    @property
    def terminal(self) -> set[str]:
        return self.accepting | self.failing

    @property
    def labels(self) -> set[str]:
        return set().union(*(variables(e.tree) for e in self.edges)) if self.edges else set()

    @property
    def calls(self) -> set[str]:
        """The machines this one calls (a machine of a hierarchy; empty for a flat machine)."""
        return {e.call for e in self.edges if e.call is not None}

    @property
    def terms(self) -> list[str]:
        return sorted({e.reward for e in self.edges if isinstance(e.reward, str)})

    def edge_taken(self, state: str, true_labels: set[str]) -> Edge | None:
        """The edge of `state` whose guard holds for these labels (None: none does, or the state is terminal)."""
        if state in self.terminal:
            return None
        taken = [e for e in self.edges if e.src == state and evaluate(e.tree, true_labels)]
        if len(taken) > 1:
            raise ValueError(f"reward machine is not deterministic: in state '{state}' with labels "
                             f"{sorted(true_labels)} the edges {[e.guard for e in taken]} all hold")
        return taken[0] if taken else None

    def step(self, state: str, true_labels: set[str]) -> tuple[str, Reward]:
        """The reference (one env, one step) semantics that the compiled tensors must reproduce."""
        if self.calls:
            raise ValueError(f"this machine calls {sorted(self.calls)}: step it as a hierarchy (roborl.rm.hierarchy)")
        edge = self.edge_taken(state, true_labels)
        return (edge.dst, edge.reward) if edge else (state, 0.0)

    @classmethod
    def from_text(cls, text: str) -> RewardMachine:
        lines = [ln.split("#", 1)[0].strip() for ln in text.splitlines()]
        lines = [ln for ln in lines if ln]
        if len(lines) < 2:
            raise ValueError("reward machine text: needs the initial state, the terminal states and edges")
        initial = lines[0]
        terminal = _state_list(lines[1])
        failing: set[str] = set()
        rest = lines[2:]
        if rest and rest[0].startswith("["):
            failing = _state_list(rest[0])
            rest = rest[1:]
        unmatched = "fail"  # the original code's semantics
        if rest and rest[0].replace(" ", "").startswith("unmatched:"):
            unmatched = rest[0].split(":", 1)[1].strip()
            rest = rest[1:]
        edges, states = [], [initial]
        for ln in rest:
            m = EDGE_LINE.fullmatch(ln)
            if not m:
                raise ValueError(f"reward machine text: cannot read the edge {ln!r}; expected (u, u', 'guard', reward)")
            src, dst, guard, reward = m.group("src"), m.group("dst"), m.group("guard"), _reward(m.group("reward"))
            edges.append(Edge(src, dst, guard, reward, call=m.group("call")))
            states += [s for s in (src, dst) if s not in states]
        states += [s for s in sorted(terminal | failing) if s not in states]
        return cls(states, initial, edges, accepting=terminal - failing, failing=failing, unmatched=unmatched)

    @classmethod
    def from_file(cls, path: str | Path) -> RewardMachine:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"reward machine file '{path}' does not exist")
        try:
            return cls.from_text(path.read_text())
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc

    def equivalent(self, other: RewardMachine, labels: list[str], rewards: bool = True) -> bool:
        """Same rewards and terminal behaviour on every label sequence (product BFS; names may differ). With
        `rewards=False`: the same episode ends only (accepting or failing after the same label sequences)."""
        combos = [frozenset(c) for r in range(len(labels) + 1) for c in itertools.combinations(labels, r)]
        seen, todo = set(), [(self.initial, other.initial)]
        while todo:
            pair = todo.pop()
            if pair in seen:
                continue
            seen.add(pair)
            a, b = pair
            ends = (a in self.accepting, a in self.failing)
            if ends != (b in other.accepting, b in other.failing):
                return False
            if not rewards and any(ends):
                continue  # the episode is over in both
            for combo in combos:
                (na, ra), (nb, rb) = self.step(a, combo), other.step(b, combo)
                if rewards and ra != rb:
                    return False
                todo.append((na, nb))
        return True


UNMATCHED = ("stay", "fail")
FALLEN = "unmatched"  # the failing state of the original semantics

EDGE_LINE = re.compile(r"\(\s*(?P<src>\w+)\s*,\s*(?P<dst>\w+)\s*,\s*(?:call\s+(?P<call>\w+)\s*,\s*)?"
                       r"'(?P<guard>[^']*)'\s*,\s*(?P<reward>[^()]+|ConstantRewardFunction\([^()]*\))\s*\)")


def _state_list(text: str) -> set[str]:
    try:
        items = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        items = [s.strip() for s in text.strip("[]").split(",") if s.strip()]
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"reward machine text: expected a list of states like [3], got {text!r}")
    return {str(s) for s in items}


def _reward(text: str) -> Reward:
    text = text.strip()
    m = re.fullmatch(r"ConstantRewardFunction\((.*)\)", text)
    if m:
        text = m.group(1).strip()
    try:
        return float(text)
    except ValueError:
        if re.fullmatch(r"[A-Za-z_]\w*", text):
            return text
        raise ValueError(f"reward machine text: reward {text!r} is neither a number nor a reward-term name") from None


class RMBuilder:
    """`RMBuilder(initial="u0").edge("u0", "u1", "a", 1.0).accepting("u1").build()`; states are declared
    by use."""

    def __init__(self, initial: str = "u0", unmatched: str = "stay") -> None:
        self._initial, self._states, self._edges, self._unmatched = initial, [initial], [], unmatched
        self._accepting: set[str] = set()
        self._failing: set[str] = set()

    def _add(self, *states: str) -> None:
        self._states += [s for s in states if s not in self._states]

    def edge(self, src: str, dst: str, guard: str, reward: Reward = 0.0) -> RMBuilder:
        self._add(src, dst)
        self._edges.append(Edge(src, dst, guard, float(reward) if not isinstance(reward, str) else reward))
        return self

    def call(self, src: str, dst: str, machine: str, context: str = "true", reward: float = 0.0) -> RMBuilder:
        """A hierarchy's call edge: where `context` holds, run `machine`; once it accepts, go on in `dst`."""
        self._add(src, dst)
        self._edges.append(Edge(src, dst, context, float(reward), call=machine))
        return self

    def accepting(self, *states: str) -> RMBuilder:
        self._add(*states)
        self._accepting |= set(states)
        return self

    def failing(self, *states: str) -> RMBuilder:
        self._add(*states)
        self._failing |= set(states)
        return self

    def build(self) -> RewardMachine:
        return RewardMachine(list(self._states), self._initial, list(self._edges), set(self._accepting), set(self._failing),
                             self._unmatched)
