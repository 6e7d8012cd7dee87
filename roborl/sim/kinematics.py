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


def _homogeneous(rot: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    T = torch.eye(4, dtype=rot.dtype).repeat(*rot.shape[:-2], 1, 1)
    T[..., :3, :3] = rot
    T[..., :3, 3] = pos
    return T


class SerialChain:
    """The hinge-joint chain from the world to a site: `forward(q)` and `jacobian(q)` for N configs.

    Precomputes the fixed 4×4 transforms between consecutive joints (joint anchors folded in), so a
    batched forward pass is one small matmul per joint.
    """

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
        fixed = [torch.eye(4, **f)]  # fixed[k]: from joint k's frame (after its rotation) to joint k+1's anchor
        axes, qadr, ranges = [], [], []
        for body in bodies:
            joints = [j for j in range(model.njnt) if model.jnt_bodyid[j] == body]
            if len(joints) > 1 or (joints and model.jnt_type[joints[0]] != mujoco.mjtJoint.mjJNT_HINGE):
                raise ValueError(f"body {body} of the chain must have at most one hinge joint")
            body_T = _homogeneous(_quat_to_mat(torch.tensor(model.body_quat[body], **f)),
                                  torch.tensor(model.body_pos[body], **f))
            fixed[-1] = fixed[-1] @ body_T
            if joints:
                j = joints[0]
                anchor = torch.tensor(model.jnt_pos[j], **f)
                fixed[-1] = fixed[-1] @ _homogeneous(torch.eye(3, **f), anchor)
                fixed.append(_homogeneous(torch.eye(3, **f), -anchor))
                axes.append(model.jnt_axis[j] / np.linalg.norm(model.jnt_axis[j]))
                qadr.append(int(model.jnt_qposadr[j]))
                ranges.append(model.jnt_range[j])
        site_T = _homogeneous(_quat_to_mat(torch.tensor(model.site_quat[site_id], **f)),
                              torch.tensor(model.site_pos[site_id], **f))
        fixed[-1] = fixed[-1] @ site_T
        self.fixed = torch.stack(fixed)  # (J+1)×4×4
        self.axis = torch.tensor(np.array(axes), **f)
        K = _skew(self.axis)
        self.K, self.K2 = K, K @ K
        self.qpos_adr = torch.tensor(qadr)
        self.qpos0 = torch.tensor(model.qpos0[qadr], **f)
        self.lower = torch.tensor(np.array(ranges)[:, 0], **f)
        self.upper = torch.tensor(np.array(ranges)[:, 1], **f)
        self.dof = len(axes)

    def _frames(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """World transform of the site (N×4×4), and every joint's world axis and anchor (N×J×3)."""
        dtype = self.axis.dtype
        theta = (q - self.qpos0).to(dtype)
        s, c = theta.sin()[..., None, None], theta.cos()[..., None, None]
        step = torch.zeros(*theta.shape, 4, 4, dtype=dtype)
        step[..., :3, :3] = torch.eye(3, dtype=dtype) + s * self.K + (1 - c) * self.K2
        step[..., 3, 3] = 1.0
        n, J = theta.shape
        # joint rotation, then the fixed transform to the next anchor: one bmm over joints
        step = (step.transpose(0, 1).reshape(J, n * 4, 4) @ self.fixed[1:]).reshape(J, n, 4, 4).transpose(0, 1)
        T = self.fixed[0].expand(n, 4, 4)
        axes, anchors = [], []
        for j in range(self.dof):
            axes.append(T[:, :3, :3] @ self.axis[j])
            anchors.append(T[:, :3, 3])
            T = T @ step[:, j]
        return T, torch.stack(axes, 1), torch.stack(anchors, 1)

    def forward(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Site position (N×3) and rotation matrix (N×3×3) for joint angles q (N×J)."""
        T, _, _ = self._frames(q)
        return T[:, :3, 3], T[:, :3, :3]

    def jacobian(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Site position, rotation, and the 6×J geometric Jacobian (linear rows first)."""
        T, axes, anchors = self._frames(q)
        p = T[:, :3, 3]
        jv = torch.linalg.cross(axes, p[:, None, :] - anchors, dim=-1)
        return p, T[:, :3, :3], torch.cat([jv, axes], -1).transpose(1, 2)
