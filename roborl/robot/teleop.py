"""Human interventions on the robot side (HIL-SERL): an operator with a teleop device takes over from the
policy whenever they choose, and the control loop executes their action instead, through the same shields.

A device answers `poll(obs)` every control period: None while the operator lets the policy act, else the
action they command, in the policy's normalized units ([-1, 1] per dimension). The steps the operator
commanded are marked as interventions in the loop's step records (`ControlLoop(on_step=...)`), which is
how a real-world RL run puts them in both its online and its demonstration buffers.

`ScriptedOperator` is the device of tests and benchmarks: a rule of the observation decides when it takes
over and what it does (e.g. steer toward the cube when the policy heads away from it).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np


class TeleopDevice(ABC):
    @abstractmethod
    def poll(self, obs: dict[str, np.ndarray]) -> np.ndarray | None:
        """The operator's action for this period, or None while they let the policy act."""

    def close(self) -> None:
        """Let go of the device."""


class ScriptedOperator(TeleopDevice):
    def __init__(self, rule: Callable[[dict[str, np.ndarray]], np.ndarray | None]) -> None:
        """`rule(obs)`: the action the operator commands in this state, or None to let the policy act."""
        self.rule = rule
        self.takeovers = 0  # steps it commanded

    def poll(self, obs: dict[str, np.ndarray]) -> np.ndarray | None:
        action = self.rule(obs)
        if action is None:
            return None
        self.takeovers += 1
        return np.clip(np.asarray(action, np.float32), -1, 1)
