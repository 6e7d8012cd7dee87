"""Shields as data: `[{"type": "workspace", ...constructor arguments}]`, JSON-safe, so a deployed
artifact's metadata carries the exact shields its policy was trained with and the robot side rebuilds
them (`build_shields`) without a simulator. Slices of `state` are written as [start, stop]."""
from __future__ import annotations

from typing import Any

from roborl.imports import import_factory
from roborl.shields.base import Shield, ShieldChain
from roborl.shields.cbf import KeepOutCBF
from roborl.shields.limits import ActionRateShield, JointLimitShield, SpeedShield, WorkspaceShield
from roborl.shields.two_arms import ArmGapShield, JointGapShield

SHIELD_TYPES: dict[str, Any] = {
    "action_rate": ActionRateShield, "max_speed": SpeedShield, "workspace": WorkspaceShield,
    "keep_out": KeepOutCBF, "automaton": lambda factory: import_factory(factory, "env.shield.automaton")(),
    "joint_limits": JointLimitShield, "arm_gap": ArmGapShield, "joint_gap": JointGapShield,
}
# stateless shields made of plain tensor operations: they are traced into exported artifacts
TRACEABLE = ("max_speed", "workspace", "joint_limits")
SLICE_ARGS = ("tcp", "q", "other_tcp")


def build_shield(spec: dict) -> Shield:
    kind = spec.get("type")
    if kind not in SHIELD_TYPES:
        raise ValueError(f"unknown shield type '{kind}'; available: {', '.join(SHIELD_TYPES)}")
    args = {k: (slice(*v) if k in SLICE_ARGS else v) for k, v in spec.items() if k != "type"}
    if kind == "joint_gap":
        args["tcps"], args["starts"] = tuple(slice(*t) for t in args["tcps"]), tuple(args["starts"])
    if kind == "joint_limits":
        import torch

        args["lower"], args["upper"] = torch.tensor(args["lower"]), torch.tensor(args["upper"])
    return SHIELD_TYPES[kind](**args)


def build_shields(specs: list[dict]) -> ShieldChain:
    return ShieldChain([build_shield(spec) for spec in specs])
