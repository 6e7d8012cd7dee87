"""Reward machines: automata over task labels that pay rewards (see `machine.py`), their tensor form
(`compiled.py`), LTLf compilation (`ltlf.py`) and the env wrapper (`env.py`)."""
from __future__ import annotations

from pathlib import Path

from roborl.imports import import_factory
from roborl.rm.compiled import CompiledRM
from roborl.rm.env import RewardMachineEnv
from roborl.rm.machine import RewardMachine, RMBuilder


def load_machine(spec: str | None = None, ltlf: str | None = None) -> RewardMachine:
    """A machine from a text file (`tasks/sequence.rm`), a Python factory (`module:function` returning a
    RewardMachine) or an LTLf formula."""
    if (spec is None) == (ltlf is None):
        raise ValueError("give exactly one of env.rm.machine (a .rm file or module:function) and env.rm.ltlf")
    if ltlf is not None:
        from roborl.rm.ltlf import from_ltlf

        return from_ltlf(ltlf)
    if ":" in spec and not Path(spec).exists():
        machine = import_factory(spec, "env.rm.machine")()
        if not isinstance(machine, RewardMachine):
            raise ValueError(f"env.rm.machine '{spec}' returned {type(machine).__name__}, not a RewardMachine")
        return machine
    return RewardMachine.from_file(spec)


__all__ = ["CompiledRM", "RMBuilder", "RewardMachine", "RewardMachineEnv", "load_machine"]
