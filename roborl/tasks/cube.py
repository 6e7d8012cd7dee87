"""Free cubes in the arm scenes: where they are in the state vector, and how to place them."""
from __future__ import annotations

import math

import torch

from roborl.tasks.arm import CUBE_HALF, ArmEnv


class Cube:
    """A cube with a free joint whose qpos starts at `qadr` and qvel at `vadr`."""

    def __init__(self, env: ArmEnv, name: str) -> None:
        joint = env.model.joint(name)
        self.env = env
        self.qadr = int(joint.qposadr[0])
        self.vadr = int(joint.dofadr[0])

    @property
    def pos(self) -> torch.Tensor:
        return self.env.qpos[:, self.qadr : self.qadr + 3]

    @property
    def quat(self) -> torch.Tensor:
        return self.env.qpos[:, self.qadr + 3 : self.qadr + 7]

    @property
    def vel(self) -> torch.Tensor:
        return self.env.qvel[:, self.vadr : self.vadr + 6]

    def place(self, ids: torch.Tensor, xy: torch.Tensor, max_yaw: float = math.pi / 8) -> None:
        """Put the cube on the table at `xy` with a random yaw, at rest."""
        yaw = self.env.uniform(len(ids), [-max_yaw], [max_yaw])[:, 0]
        q = self.env.qpos
        q[ids, self.qadr : self.qadr + 2] = xy
        q[ids, self.qadr + 2] = CUBE_HALF
        q[ids, self.qadr + 3] = torch.cos(yaw / 2)
        q[ids, self.qadr + 4 : self.qadr + 6] = 0.0
        q[ids, self.qadr + 6] = torch.sin(yaw / 2)
        self.env.qvel[ids, self.vadr : self.vadr + 6] = 0.0
