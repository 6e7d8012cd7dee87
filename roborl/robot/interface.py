"""What the control loop needs from a robot. A driver for real hardware implements these five calls;
`roborl.robot.twin.TwinRobot` implements them for the MuJoCo digital twin."""
from __future__ import annotations

import time
from abc import ABC, abstractmethod

import numpy as np


class RobotInterface(ABC):
    control_dt: float  # seconds between commands the robot expects
    clocked: bool = False  # True: observe() blocks until the robot's next sample, and the loop runs on its clock

    @abstractmethod
    def connect(self) -> None:
        """Open the connection; raise if the robot cannot be reached."""

    @abstractmethod
    def observe(self) -> dict[str, np.ndarray]:
        """The newest observation: `state` (float32, the policy's per-step state) and any other keys."""

    @abstractmethod
    def act(self, action: np.ndarray) -> None:
        """Execute one action in the policy's normalized units ([-1, 1] per dimension)."""

    @abstractmethod
    def hold(self) -> None:
        """Keep the current pose for this period (no new command is available)."""

    @abstractmethod
    def stop(self) -> None:
        """Stop motion and refuse further actions until the robot is reset by its operator. Must be safe
        to call from any thread and more than once."""

    def clock(self) -> float:
        """Seconds on the clock the loop's periods are measured on: a clocked robot's own clock at its newest
        observation (an arm's time may fall behind the wall clock in a simulator), else the wall clock."""
        return time.monotonic()

    def close(self) -> None:
        """Release the connection."""
