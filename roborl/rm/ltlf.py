"""LTLf formulas → reward machines, through the DFA that `ltlf2dfa` builds with the MONA solver.

The DFA's states become RM states. Entering an accepting state pays +1 and leaving one pays −1, so an
episode's undiscounted RM return is 1 exactly when its trace satisfies the formula. Sink states (every
edge a self-loop) are terminal: accepting sinks accept, the others fail.
"""
from __future__ import annotations

import re
import shutil

from roborl.rm.machine import Edge, RewardMachine

DOT_EDGE = re.compile(r'^\s*(\w+)\s*->\s*(\w+)\s*\[label="([^"]*)"\];', re.M)


def ltlf_tree(formula: str):
    """The formula parsed by `ltlf2dfa` (its syntax tree, which compiles itself to a DFA)."""
    try:
        from ltlf2dfa.parser.ltlf import LTLfParser
    except ImportError as exc:
        raise ValueError("LTLf formulas need the `ltlf2dfa` package: pip install ltlf2dfa") from exc
    try:
        return LTLfParser()(formula)
    except Exception as exc:
        raise ValueError(f"LTLf formula '{formula}' does not parse: {str(exc).splitlines()[0]}") from exc


def ltlf_to_dot(formula: str) -> str:
    if shutil.which("mona") is None:
        raise ValueError("LTLf formulas need the MONA solver on PATH: install it with `apt-get install mona` "
                         "(scripts/setup.sh does), or write the reward machine in the text format")
    return ltlf_tree(formula).to_dfa()


def from_dot(dot: str) -> RewardMachine:
    """An RM from MONA's DOT output (as printed by ltlf2dfa's `to_dfa()`)."""
    init = re.search(r"init\s*->\s*(\w+);", dot)
    if not init:
        raise ValueError("DFA in DOT: no initial state (`init -> q`)")
    accepting_decl = re.search(r"node \[shape = doublecircle\];([^\n]*)", dot)
    accepting = set(re.findall(r"\w+", accepting_decl.group(1))) if accepting_decl else set()
    raw = DOT_EDGE.findall(dot)
    states: list[str] = [init.group(1)]
    for src, dst, _ in raw:
        states += [s for s in (src, dst) if s not in states]
    sinks = {s for s in states if all(dst == s for src, dst, _ in raw if src == s)}
    edges = []
    for src, dst, guard in raw:
        if src == dst:
            continue  # staying pays nothing, as a missing edge does
        reward = 1.0 if dst in accepting and src not in accepting else -1.0 if src in accepting and dst not in accepting else 0.0
        edges.append(Edge(src, dst, guard.replace("~", "!"), reward))
    return RewardMachine(states, init.group(1), edges, accepting=accepting & sinks, failing=sinks - accepting)


def from_ltlf(formula: str) -> RewardMachine:
    return from_dot(ltlf_to_dot(formula))
