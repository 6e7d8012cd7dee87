"""Reward machines: automata over task labels that pay rewards (see `machine.py`), their tensor form
(`compiled.py`), LTLf compilation (`ltlf.py`), hierarchies of machines (`hierarchy.py`) and the env
wrappers (`env.py`: a flat machine; `hierarchy_env.py`: a hierarchy for the option learner, whose choices among
calls `call_learning.py` learns)."""
from __future__ import annotations

import re
from pathlib import Path

from roborl.imports import import_factory
from roborl.rm.compiled import CompiledRM
from roborl.rm.env import RewardMachineEnv
from roborl.rm.hierarchy import CompiledHierarchy, Hierarchy, flatten
from roborl.rm.hierarchy_env import HierarchyEnv
from roborl.rm.machine import RewardMachine, RMBuilder


def load_hierarchy(spec: str | None = None, ltlf: str | None = None, split: bool = False,
                   progress: dict[str, str] | None = None) -> RewardMachine | Hierarchy:
    """A machine or a hierarchy from a text file (`tasks/sequence.rm`; a file of `machine NAME` sections is a
    hierarchy), a Python factory (`module:function` returning either) or an LTLf formula: MONA's machine of
    the whole formula, or with `split` the hierarchy of its sub-formulas (roborl/rm/ltlf_split.py), whose
    machines that wait for one label pay its `progress` term (the task's `label_progress`) meanwhile."""
    if (spec is None) == (ltlf is None):
        raise ValueError("give exactly one of env.rm.machine (a .rm file or module:function) and env.rm.ltlf")
    if ltlf is not None:
        from roborl.rm.ltlf import from_ltlf
        from roborl.rm.ltlf_split import split_ltlf

        return split_ltlf(ltlf, progress) if split else from_ltlf(ltlf)
    if ":" in spec and not Path(spec).exists():
        machine = import_factory(spec, "env.rm.machine")()
        if not isinstance(machine, (RewardMachine, Hierarchy)):
            raise ValueError(f"env.rm.machine '{spec}' returned {type(machine).__name__}, not a RewardMachine or "
                             "a Hierarchy")
        return machine
    path = Path(spec)
    if path.is_file() and re.match(r"\s*(#[^\n]*\n\s*)*machine\s", path.read_text()):
        try:
            return Hierarchy.from_text(path.read_text())
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc
    return RewardMachine.from_file(spec)


def load_machine(spec: str | None = None, ltlf: str | None = None) -> RewardMachine:
    """A flat machine as `load_hierarchy` finds it; a hierarchy is flattened: the env runs the flat machine of
    its configurations (roborl/rm/hierarchy.py)."""
    machine = load_hierarchy(spec, ltlf)
    return flatten(machine) if isinstance(machine, Hierarchy) else machine


__all__ = ["CompiledHierarchy", "CompiledRM", "Hierarchy", "HierarchyEnv", "RMBuilder", "RewardMachine",
           "RewardMachineEnv", "flatten", "load_hierarchy", "load_machine"]
