"""An LTLf formula split into a hierarchy of reward machines where it splits exactly.

Two shapes split; anything else is one machine compiled whole by MONA (roborl.rm.ltlf):

- **Then**: `F(ψ & X ρ)` with ψ propositional and ρ an eventuality (`F …`) or an any-order conjunction:
  the caller calls `F(ψ)`, then ρ's machine. The call of `F(ψ)` returns at the first step where ψ holds and
  ρ's machine reads from the next step on; since ρ holds from a step if it holds from any later one, the
  first ψ is as good as any, so the split accepts exactly the traces the formula does.
- **Any order**: `F(ψ1) & F(ψ2) & …` with every ψi propositional: a machine whose states are the sets of
  conjuncts done, each state a choice (roborl/rm/hierarchy.py) between calls of the remaining conjuncts.
  A call of a set T of conjuncts, `F(ψT)` (the conjunction of its ψs), is taken where exactly T's ψs of the
  remaining ones hold, so simultaneous events are done together and the calls' contexts exclude each other.

`split_ltlf("F(a & X(F(b) & F(c)))")` is a root calling `F(a)`, then an any-order machine choosing between
`F(b)`, `F(c)` and `F(b & c)`. A flat machine that is only done when a trace guarantees the formula (MONA's
accepting sinks, as `from_ltlf`) ends where the hierarchy accepts, on every label sequence
(tests/test_ltlf_split.py checks this against MONA's whole-formula automaton). Each called machine pays 1
when its sub-formula holds, and the root's last call 1 more on return, as `sequence` does.

A machine that waits for one label, `F(p)`, pays meanwhile the task's progress term for p where the task has
one (`label_progress`, e.g. Sequence's `approach_a` for `at_a`: the distance to the red target closed in this
step), as a hand-written `touch_a` does: `F(at_a & X F(at_b))` on Sequence gives the machines of a file
written by hand, and the option learner the dense reward it learns from (without it each option is sparse).
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from roborl.rm.hierarchy import Hierarchy
from roborl.rm.machine import Edge, RewardMachine, RMBuilder

PROPOSITIONAL = {"LTLfAtomic", "LTLfNot", "LTLfAnd", "LTLfOr", "LTLfTrue", "LTLfFalse"}


@dataclass(frozen=True)
class Whole:
    formula: str  # compiled to one machine


@dataclass(frozen=True)
class Then:
    parts: tuple  # Whole or AnyOrder, done one after another


@dataclass(frozen=True)
class AnyOrder:
    events: tuple[str, ...]  # propositional ψs, each to hold once, in any order


Plan = Whole | Then | AnyOrder


def kind(tree) -> str:
    return type(tree).__name__


def operands(tree) -> list:
    """A formula's sub-formulas (none for an atom or a constant)."""
    return list(getattr(tree, "formulas", None) or ([tree.f] if hasattr(tree, "f") else []))


def propositional(tree) -> bool:
    return kind(tree) in PROPOSITIONAL and all(propositional(f) for f in operands(tree))


def plan(tree) -> Plan:
    """How the formula splits: into parts done one after another, events in any order, or not at all."""
    if kind(tree) == "LTLfAnd" and all(kind(f) == "LTLfEventually" and propositional(f.f) for f in tree.formulas):
        return AnyOrder(tuple(str(f.f) for f in tree.formulas))
    if kind(tree) == "LTLfEventually" and kind(tree.f) == "LTLfAnd":
        nexts = [f for f in tree.f.formulas if kind(f) == "LTLfNext"]
        now = [f for f in tree.f.formulas if kind(f) != "LTLfNext"]
        if len(nexts) == 1 and all(propositional(f) for f in now):
            rest = plan(nexts[0].f)
            if kind(nexts[0].f) == "LTLfEventually" or isinstance(rest, AnyOrder):
                head = Whole(f"F({' & '.join(str(f) for f in now)})")
                return Then((head, *(rest.parts if isinstance(rest, Then) else (rest,))))
    return Whole(str(tree))


class HierarchyBuilder:
    """Machines for a plan, one per distinct sub-formula (a repeated sub-task is one machine, called twice)."""

    def __init__(self, progress: dict[str, str] | None = None) -> None:
        self.machines: dict[str, RewardMachine] = {}
        self.names: dict[Plan, str] = {}
        self.progress = progress or {}

    def name(self, part: Plan) -> str:
        if part not in self.names:
            prefix = "f" if isinstance(part, Whole) else "any"
            name = f"{prefix}{sum(n.startswith(prefix) for n in self.machines)}"
            self.machines[name] = self.whole(part) if isinstance(part, Whole) else self.any_order(part, 0.0)
            self.names[part] = name
        return self.names[part]

    def whole(self, part: Whole) -> RewardMachine:
        from roborl.rm.ltlf import from_ltlf, ltlf_tree

        machine = from_ltlf(part.formula)
        if not machine.accepting:
            raise ValueError(f"LTLf formula '{part.formula}': no finite trace guarantees it (its automaton has no "
                             "accepting sink), so a call of it would never return; learn it flat (env.rm.learner flat)")
        tree = ltlf_tree(part.formula)
        label = tree.f.s if kind(tree) == "LTLfEventually" and kind(tree.f) == "LTLfAtomic" else None
        if label in self.progress:  # waiting for the label (MONA's self-loop, which pays nothing) pays its progress
            wait = Edge(machine.initial, machine.initial, f"!{label}", self.progress[label])
            machine = RewardMachine(machine.states, machine.initial, [*machine.edges, wait], accepting=machine.accepting,
                                    failing=machine.failing, unmatched=machine.unmatched)
        return machine

    def then(self, parts: tuple, last_pays: float) -> RewardMachine:
        machine = RMBuilder("s0")
        for i, part in enumerate(parts):
            machine.call(f"s{i}", f"s{i + 1}", self.name(part), "true", last_pays if i == len(parts) - 1 else 0.0)
        return machine.accepting(f"s{len(parts)}").build()

    def any_order(self, part: AnyOrder, last_pays: float) -> RewardMachine:
        n = len(part.events)
        everything = (1 << n) - 1
        machine = RMBuilder("s0")
        for done in range(everything):
            remaining = [i for i in range(n) if not done >> i & 1]
            for size in range(1, len(remaining) + 1):
                for together in combinations(remaining, size):
                    event = Whole(f"F({' & '.join(f'({part.events[i]})' for i in together)})")
                    others = [f"!({part.events[i]})" for i in remaining if i not in together]
                    after = done | sum(1 << i for i in together)
                    machine.call(f"s{done}", f"s{after}", self.name(event), " & ".join(others) or "true",
                                 last_pays if after == everything else 0.0)
        return machine.accepting(f"s{everything}").build()


def split_ltlf(formula: str, progress: dict[str, str] | None = None) -> Hierarchy:
    """The hierarchy of an LTLf formula, split where it splits exactly (module docstring); a formula that does
    not split is a root calling its one machine. `progress`: label -> the reward term a machine waiting for
    that label pays."""
    from roborl.rm.ltlf import ltlf_tree

    tree = plan(ltlf_tree(formula))
    builder = HierarchyBuilder(progress)
    if isinstance(tree, AnyOrder):
        root = builder.any_order(tree, 1.0)
    else:
        root = builder.then(tree.parts if isinstance(tree, Then) else (tree,), 1.0)
    return Hierarchy({**builder.machines, "root": root}, "root")
