"""Batched forward kinematics and Jacobians of a serial chain of hinge joints, read off a MjModel.

Torch over N configurations at once, so end-effector controllers (differential IK) run batched
instead of calling `mj_jacSite` per environment. Matches MuJoCo's own kinematics (tested).
"""
from __future__ import annotations

import mujoco
import numpy as np
import torch


def _quat_to_mat(q: torch.Tensor) -> torch.Tensor:
    w, x, y, z = q.unbind(-1)
    return torch.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w),
        2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w),
        2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y),
    ], -1).reshape(*q.shape[:-1], 3, 3)


def _skew(a: torch.Tensor) -> torch.Tensor:
    x, y, z = a.unbind(-1)
    o = torch.zeros_like(x)
    return torch.stack([o, -z, y, z, o, -x, -y, x, o], -1).reshape(*a.shape[:-1], 3, 3)


class SerialChain:
    """The hinge-joint chain from the world to a site: `forward(q)` and `jacobian(q)` for N configs."""

    def __init__(self, model: mujoco.MjModel, site: str, dtype: torch.dtype = torch.float64) -> None:
        site_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, site)
        if site_id < 0:
            raise ValueError(f"model has no site '{site}'")
        bodies = []
        b = int(model.site_bodyid[site_id])
        while b != 0:
            bodies.append(b)
            b = int(model.body_parentid[b])
        bodies.reverse()
        f = dict(dtype=dtype)
        self.body_pos = torch.tensor(model.body_pos[bodies], **f)
        self.body_rot = _quat_to_mat(torch.tensor(model.body_quat[bodies], **f))
        self.joint_of_body: list[int | None] = []
        axes, jpos, qadr, q0 = [], [], [], []
        for body in bodies:
            joints = [j for j in range(model.njnt) if model.jnt_bodyid[j] == body]
            if len(joints) > 1 or (joints and model.jnt_type[joints[0]] != mujoco.mjtJoint.mjJNT_HINGE):
                raise ValueError(f"body {body} of the chain must have at most one hinge joint")
            if joints:
                j = joints[0]
                self.joint_of_body.append(len(axes))
                axes.append(model.jnt_axis[j])
                jpos.append(model.jnt_pos[j])
                qadr.append(int(model.jnt_qposadr[j]))
                q0.append(model.qpos0[model.jnt_qposadr[j]])
            else:
                self.joint_of_body.append(None)
        axis = torch.tensor(np.array(axes), **f)
        axis = axis / axis.norm(dim=-1, keepdim=True)
        self.axis = axis
        self.K = _skew(axis)
        self.K2 = self.K @ self.K
        self.joint_pos = torch.tensor(np.array(jpos), **f)
        self.qpos_adr = torch.tensor(qadr)
        self.qpos0 = torch.tensor(q0, **f)
        self.site_pos = torch.tensor(model.site_pos[site_id], **f)
        self.site_rot = _quat_to_mat(torch.tensor(model.site_quat[site_id], **f))
        self.lower = torch.tensor(model.jnt_range[[model.jnt_qposadr.tolist().index(a) for a in qadr], 0], **f)
        self.upper = torch.tensor(model.jnt_range[[model.jnt_qposadr.tolist().index(a) for a in qadr], 1], **f)
        self.dof = len(axes)

    def _frames(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """World rotation and position of the site, and of every joint (axis and anchor)."""
        n = q.shape[0]
        theta = (q - self.qpos0).to(self.axis.dtype)
        s, c = theta.sin()[..., None, None], theta.cos()[..., None, None]
        joint_rot = torch.eye(3, dtype=self.axis.dtype) + s * self.K + (1 - c) * self.K2  # N×J×3×3
        R = torch.eye(3, dtype=self.axis.dtype).expand(n, 3, 3)
        p = torch.zeros(n, 3, dtype=self.axis.dtype)
        axes, anchors = [], []
        for i, j in enumerate(self.joint_of_body):
            p = p + R @ self.body_pos[i]
            R = R @ self.body_rot[i]
            if j is not None:
                anchor = p + R @ self.joint_pos[j]
                axes.append(R @ self.axis[j])
                anchors.append(anchor)
                R = R @ joint_rot[:, j]
                p = anchor - R @ self.joint_pos[j]
        site_p = p + R @ self.site_pos
        site_R = R @ self.site_rot
        return site_R, site_p, torch.stack(axes, 1), torch.stack(anchors, 1)

    def forward(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Site position (N×3) and rotation matrix (N×3×3) for joint angles q (N×J)."""
        R, p, _, _ = self._frames(q)
        return p, R

    def jacobian(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Site position, rotation, and the 6×J geometric Jacobian (linear rows first)."""
        R, p, axes, anchors = self._frames(q)
        jv = torch.linalg.cross(axes, p[:, None, :] - anchors, dim=-1)
        return p, R, torch.cat([jv, axes], -1).transpose(1, 2)
