"""Reward machines: automata over task labels that pay rewards (see `machine.py`), their tensor form
(`compiled.py`), LTLf compilation (`ltlf.py`), hierarchies of machines (`hierarchy.py`) and the env wrapper
(`env.py`)."""
from __future__ import annotations

import re
from pathlib import Path

from roborl.imports import import_factory
from roborl.rm.compiled import CompiledRM
from roborl.rm.env import RewardMachineEnv
from roborl.rm.hierarchy import CompiledHierarchy, Hierarchy, flatten
from roborl.rm.machine import RewardMachine, RMBuilder


def load_machine(spec: str | None = None, ltlf: str | None = None) -> RewardMachine:
    """A machine from a text file (`tasks/sequence.rm`), a Python factory (`module:function` returning a
    RewardMachine) or an LTLf formula. A hierarchy (a file of `machine NAME` sections, or a factory returning
    a `Hierarchy`) is flattened: the env runs the flat machine of its configurations (roborl/rm/hierarchy.py)."""
    if (spec is None) == (ltlf is None):
        raise ValueError("give exactly one of env.rm.machine (a .rm file or module:function) and env.rm.ltlf")
    if ltlf is not None:
        from roborl.rm.ltlf import from_ltlf

        return from_ltlf(ltlf)
    if ":" in spec and not Path(spec).exists():
        machine = import_factory(spec, "env.rm.machine")()
        if isinstance(machine, Hierarchy):
            return flatten(machine)
        if not isinstance(machine, RewardMachine):
            raise ValueError(f"env.rm.machine '{spec}' returned {type(machine).__name__}, not a RewardMachine")
        return machine
    path = Path(spec)
    if path.is_file() and re.match(r"\s*(#[^\n]*\n\s*)*machine\s", path.read_text()):
        try:
            return flatten(Hierarchy.from_text(path.read_text()))
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc
    return RewardMachine.from_file(spec)


__all__ = ["CompiledHierarchy", "CompiledRM", "Hierarchy", "RMBuilder", "RewardMachine", "RewardMachineEnv", "flatten",
           "load_machine"]
