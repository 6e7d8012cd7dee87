"""Batched forward kinematics, Jacobians and damped least-squares IK of a serial chain of hinge joints,
read off a MjModel.

End-effector controllers need the pose and Jacobian of every environment at every control step. Done
as torch ops over N configurations, dispatching a few dozen tiny ops cost more than the physics leaves
room for; done per environment with `mj_jacSite`, the Python loop did. Here one compiled loop (numba)
walks the chain of all N environments, writing into arrays that torch shares. Matches MuJoCo's own
kinematics (tested).
"""
from __future__ import annotations

import mujoco
import numba
import numpy as np
import torch


def _quat_to_mat(q: np.ndarray) -> np.ndarray:
    w, x, y, z = q
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                     [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                     [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


def _homogeneous(rot: np.ndarray, pos: np.ndarray) -> np.ndarray:
    T = np.eye(4)
    T[:3, :3], T[:3, 3] = rot, pos
    return T


@numba.njit(cache=True)
def _walk_chain(q, qpos0, fixed, axis, pos, rot, jac):  # pragma: no cover - compiled
    """For each row of q (N×J joint angles; qpos0, the angles of the model's own pose): site position (N×3),
    rotation (N×3×3) and the 6×J geometric Jacobian (linear rows first). fixed[k] maps joint k's frame (after
    its rotation) to joint k+1's anchor; fixed[0] is the world to joint 0's anchor; the last one ends at the site."""
    n, dof = q.shape
    T = np.empty((4, 4))
    S = np.empty((4, 4))
    M = np.empty((4, 4))
    axes = np.empty((dof, 3))
    anchors = np.empty((dof, 3))
    for i in range(n):
        T[:] = fixed[0]
        for j in range(dof):
            kx, ky, kz = axis[j, 0], axis[j, 1], axis[j, 2]
            for r in range(3):
                axes[j, r] = T[r, 0] * kx + T[r, 1] * ky + T[r, 2] * kz
                anchors[j, r] = T[r, 3]
            # Rodrigues: rotation by theta about the unit axis k, then the fixed transform to the next anchor
            theta = q[i, j] - qpos0[j]
            s, c = np.sin(theta), np.cos(theta)
            v = 1.0 - c
            S[0, 0], S[0, 1], S[0, 2] = c + kx * kx * v, kx * ky * v - kz * s, kx * kz * v + ky * s
            S[1, 0], S[1, 1], S[1, 2] = ky * kx * v + kz * s, c + ky * ky * v, ky * kz * v - kx * s
            S[2, 0], S[2, 1], S[2, 2] = kz * kx * v - ky * s, kz * ky * v + kx * s, c + kz * kz * v
            for r in range(3):
                for col in range(4):
                    M[r, col] = S[r, 0] * fixed[j + 1, 0, col] + S[r, 1] * fixed[j + 1, 1, col] \
                        + S[r, 2] * fixed[j + 1, 2, col]
            M[3, :] = fixed[j + 1, 3, :]
            for r in range(3):
                t0, t1, t2, t3 = T[r, 0], T[r, 1], T[r, 2], T[r, 3]
                for col in range(4):
                    T[r, col] = t0 * M[0, col] + t1 * M[1, col] + t2 * M[2, col] + t3 * M[3, col]
        for r in range(3):
            pos[i, r] = T[r, 3]
            for col in range(3):
                rot[i, r, col] = T[r, col]
        for j in range(dof):
            ax, ay, az = axes[j, 0], axes[j, 1], axes[j, 2]
            dx, dy, dz = T[0, 3] - anchors[j, 0], T[1, 3] - anchors[j, 1], T[2, 3] - anchors[j, 2]
            jac[i, 0, j] = ay * dz - az * dy
            jac[i, 1, j] = az * dx - ax * dz
            jac[i, 2, j] = ax * dy - ay * dx
            jac[i, 3, j], jac[i, 4, j], jac[i, 5, j] = ax, ay, az


@numba.njit(cache=True)
def _dls_row(err, jac, bias, damping, A, y, dq):  # pragma: no cover - compiled
    """dq = J⁺ (err - J b) + b for one row, with J⁺ = Jᵀ (J Jᵀ + λ² I)⁻¹: the damped least-squares step
    toward the 6-d error `err`, plus the bias step `b` projected onto the null space of J (that is what
    J⁺ err + (I - J⁺ J) b equals). One Cholesky solve of the 6×6 system; A (m×m) and y (m) are scratch."""
    m, dof = jac.shape
    for r in range(m):
        acc = err[r]
        for k in range(dof):
            acc -= jac[r, k] * bias[k]
        y[r] = acc
        for c in range(r + 1):
            acc = 0.0
            for k in range(dof):
                acc += jac[r, k] * jac[c, k]
            A[r, c] = acc
        A[r, r] += damping * damping
    for r in range(m):  # Cholesky, lower triangle in place
        for c in range(r + 1):
            acc = A[r, c]
            for k in range(c):
                acc -= A[r, k] * A[c, k]
            A[r, c] = np.sqrt(acc) if r == c else acc / A[c, c]
    for r in range(m):  # L z = y
        acc = y[r]
        for k in range(r):
            acc -= A[r, k] * y[k]
        y[r] = acc / A[r, r]
    for r in range(m - 1, -1, -1):  # Lᵀ x = z
        acc = y[r]
        for k in range(r + 1, m):
            acc -= A[k, r] * y[k]
        y[r] = acc / A[r, r]
    for k in range(dof):
        acc = bias[k]
        for r in range(m):
            acc += jac[r, k] * y[r]
        dq[k] = acc


@numba.njit(cache=True)
def _dls_step(err, jac, bias, damping, dq):  # pragma: no cover - compiled
    n, m, _ = jac.shape
    A, y = np.empty((m, m)), np.empty(m)
    for i in range(n):
        _dls_row(err[i], jac[i], bias[i], damping, A, y, dq[i])


@numba.njit(cache=True)
def _orientation_hold_step(q, target, pos, rot, jac, down, rest, rest_gain, damping, dq):  # pragma: no cover
    """The DLS step per row toward `target` (position) with the orientation error to `down`,
    0.5 Σ_k rot[:, k] × down[:, k], and the bias rest_gain · (rest - q)."""
    n, m, dof = jac.shape
    A, y = np.empty((m, m)), np.empty(m)
    err, bias = np.empty(m), np.empty(dof)
    for i in range(n):
        for r in range(3):
            err[r] = target[i, r] - pos[i, r]
        err[3], err[4], err[5] = 0.0, 0.0, 0.0
        for k in range(3):
            rx, ry, rz = rot[i, 0, k], rot[i, 1, k], rot[i, 2, k]
            dx, dy, dz = down[0, k], down[1, k], down[2, k]
            err[3] += 0.5 * (ry * dz - rz * dy)
            err[4] += 0.5 * (rz * dx - rx * dz)
            err[5] += 0.5 * (rx * dy - ry * dx)
        for k in range(dof):
            bias[k] = rest_gain * (rest[k] - q[i, k])
        _dls_row(err, jac[i], bias, damping, A, y, dq[i])


def damped_least_squares(err: torch.Tensor, jac: torch.Tensor, bias: torch.Tensor,
                         damping: float = 0.05) -> torch.Tensor:
    """Joint steps (N×J) that reduce the task-space error `err` (N×6) through the Jacobian `jac` (N×6×J),
    damped by `damping`, while moving along `bias` (N×J) only in the null space of the task (float64, CPU)."""
    dq = np.empty((jac.shape[0], jac.shape[2]))
    _dls_step(err.numpy(), jac.numpy(), bias.numpy(), float(damping), dq)
    return torch.from_numpy(dq)


def orientation_hold_step(q: torch.Tensor, target: torch.Tensor, pos: torch.Tensor, rot: torch.Tensor,
                          jac: torch.Tensor, down: torch.Tensor, rest: torch.Tensor, rest_gain: float,
                          damping: float = 0.05) -> torch.Tensor:
    """`damped_least_squares` toward the position `target` (N×3) from the site pose (pos N×3, rot N×3×3)
    while turning the site's rotation toward `down` (3×3), err = [target - pos, ½ Σ_k rot[:, k] × down[:, k]],
    with the null-space bias rest_gain · (rest - q) (rest: J). One compiled pass over the rows: built from
    torch ops, the error and bias cost more dispatches than the step itself (float64, CPU)."""
    dq = np.empty((jac.shape[0], jac.shape[2]))
    _orientation_hold_step(q.numpy(), target.numpy(), pos.numpy(), rot.numpy(), jac.numpy(), down.numpy(),
                           rest.numpy(), float(rest_gain), float(damping), dq)
    return torch.from_numpy(dq)


class SerialChain:
    """The hinge-joint chain from the world to a site: `forward(q)` and `jacobian(q)` for N configs
    (float64 CPU tensors in and out).

    Precomputes the fixed 4×4 transforms between consecutive joints (joint anchors folded in), so the walk
    down the chain is one rotation and one fixed transform per joint.
    """

    def __init__(self, model: mujoco.MjModel, site: str) -> None:
        site_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, site)
        if site_id < 0:
            raise ValueError(f"model has no site '{site}'")
        bodies = []
        b = int(model.site_bodyid[site_id])
        while b != 0:
            bodies.append(b)
            b = int(model.body_parentid[b])
        bodies.reverse()
        fixed = [np.eye(4)]  # fixed[k]: from joint k's frame (after its rotation) to joint k+1's anchor
        axes, qadr, ranges = [], [], []
        for body in bodies:
            joints = [j for j in range(model.njnt) if model.jnt_bodyid[j] == body]
            if len(joints) > 1 or (joints and model.jnt_type[joints[0]] != mujoco.mjtJoint.mjJNT_HINGE):
                raise ValueError(f"body {body} of the chain must have at most one hinge joint")
            fixed[-1] = fixed[-1] @ _homogeneous(_quat_to_mat(model.body_quat[body]), model.body_pos[body])
            if joints:
                j = joints[0]
                fixed[-1] = fixed[-1] @ _homogeneous(np.eye(3), model.jnt_pos[j])
                fixed.append(_homogeneous(np.eye(3), -model.jnt_pos[j]))
                axes.append(model.jnt_axis[j] / np.linalg.norm(model.jnt_axis[j]))
                qadr.append(int(model.jnt_qposadr[j]))
                ranges.append(model.jnt_range[j])
        fixed[-1] = fixed[-1] @ _homogeneous(_quat_to_mat(model.site_quat[site_id]), model.site_pos[site_id])
        self._fixed = np.ascontiguousarray(np.stack(fixed))  # (J+1)×4×4
        self._axis = np.ascontiguousarray(np.array(axes, dtype=np.float64))
        self.qpos_adr = torch.tensor(qadr)
        self._qpos0 = np.ascontiguousarray(model.qpos0[qadr], dtype=np.float64)
        self.lower = torch.tensor(np.array(ranges)[:, 0], dtype=torch.float64)
        self.upper = torch.tensor(np.array(ranges)[:, 1], dtype=torch.float64)
        self.dof = len(axes)

    def forward(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Site position (N×3) and rotation matrix (N×3×3) for joint angles q (N×J)."""
        p, R, _ = self.jacobian(q)
        return p, R

    def jacobian(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Site position, rotation, and the 6×J geometric Jacobian (linear rows first)."""
        q = q.detach().to("cpu", torch.float64).numpy()
        n = q.shape[0]
        pos, rot, jac = np.empty((n, 3)), np.empty((n, 3, 3)), np.empty((n, 6, self.dof))
        _walk_chain(q, self._qpos0, self._fixed, self._axis, pos, rot, jac)
        return torch.from_numpy(pos), torch.from_numpy(rot), torch.from_numpy(jac)
