"""Shields: batched action filters that keep a policy inside its safety constraints (see `base.py`)."""
from roborl.shields.base import Shield, ShieldChain
from roborl.shields.cbf import KeepOutCBF, project_halfspace
from roborl.shields.env import ShieldEnv
from roborl.shields.limits import ActionRateShield, JointLimitShield, SpeedShield, WorkspaceShield

__all__ = ["ActionRateShield", "JointLimitShield", "KeepOutCBF", "Shield", "ShieldChain", "ShieldEnv", "SpeedShield",
           "WorkspaceShield", "project_halfspace"]
