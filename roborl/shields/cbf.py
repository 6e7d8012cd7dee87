"""Control-barrier-function shield: keep the TCP out of spheres (obstacles, a human zone).

For the `ee_delta_pos` controller the commanded TCP moves as p′ = p + s·u (s = max_ee_step). With
h(p) = ‖p − c‖ − R the distance to a sphere, the discrete-time CBF condition h(p′) ≥ (1 − α)·h(p),
linearized at p, is the affine constraint n·u ≥ −α·h(p)/s with n = (p − c)/‖p − c‖ (α = 1: the next
target stays outside the sphere's tangent half-space, which is outside the sphere). The shield returns
u* = argmin ‖u − u_RL‖² subject to every sphere's constraint and −1 ≤ u ≤ 1:
- one constraint: the closed form u* = u + max(0, b − n·u)/‖n‖² · n (when it lands in the box);
- otherwise a batched QP solved by proxsuite's dense ProxQP (`solve_in_parallel`).
An env whose QP is infeasible (or not solved) is reported in `info["infeasible"]`; its action is the
solver's best effort with the xyz motion stopped, never silently the unsafe proposal.
"""
from __future__ import annotations

import numpy as np
import torch

from roborl.shields.base import Shield, changed


def project_halfspace(u: torch.Tensor, n: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """argmin ‖v − u‖² s.t. n·v ≥ b, batched (closed form)."""
    gap = (b - (n * u).sum(-1)).clamp(min=0)
    return u + (gap / n.square().sum(-1).clamp(min=1e-12))[:, None] * n


def solve_qps(u: torch.Tensor, normals: torch.Tensor, bounds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """argmin ‖v − u‖² s.t. normals·v ≥ bounds, −1 ≤ v ≤ 1, for each row; (solutions, solved) with ProxQP."""
    from proxsuite import proxqp

    batch = proxqp.dense.BatchQP()
    dim, k = u.shape[1], normals.shape[1]
    H = np.eye(dim)
    C = np.concatenate([normals.detach().cpu().double().numpy(), np.broadcast_to(np.eye(dim), (u.shape[0], dim, dim))], 1)
    lo = np.concatenate([bounds.detach().cpu().double().numpy(), -np.ones((u.shape[0], dim))], 1)
    hi = np.concatenate([np.full((u.shape[0], k), 1e20), np.ones((u.shape[0], dim))], 1)
    g = -u.detach().cpu().double().numpy()
    for i in range(u.shape[0]):
        qp = batch.init_qp_in_place(dim, 0, k + dim)
        qp.settings.eps_abs = 1e-9
        qp.init(H, g[i], None, None, np.ascontiguousarray(C[i]), lo[i], hi[i])
    proxqp.dense.solve_in_parallel(num_threads=1, qps=batch)
    x = np.stack([batch.get(i).results.x for i in range(u.shape[0])])
    ok = np.array([batch.get(i).results.info.status == proxqp.PROXQP_SOLVED for i in range(u.shape[0])])
    return torch.from_numpy(x).to(u), torch.from_numpy(ok).to(u.device)


class KeepOutCBF(Shield):
    def __init__(self, spheres: list[list[float]], tcp: slice, max_step: float, alpha: float = 0.5,
                 margin: float = 0.02) -> None:
        self.spheres = torch.tensor(spheres, dtype=torch.float64).reshape(-1, 4)
        if (self.spheres[:, 3] <= 0).any():
            raise ValueError("keep-out spheres are [x, y, z, radius] with radius > 0")
        if not 0 < alpha <= 1:
            raise ValueError(f"CBF alpha must be in (0, 1], got {alpha}")
        self.tcp, self.max_step, self.alpha, self.margin = tcp, max_step, alpha, margin

    def constraints(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(normals N×K×3, bounds N×K): the affine CBF constraints n·u ≥ b at TCP positions p."""
        c, r = self.spheres[:, :3].to(p), self.spheres[:, 3].to(p) + self.margin
        diff = p[:, None] - c[None]
        dist = diff.norm(dim=-1).clamp(min=1e-9)
        return diff / dist[..., None], -self.alpha * (dist - r) / self.max_step

    def __call__(self, obs: dict, action: torch.Tensor):
        p = obs["state"][:, self.tcp].double()
        u = action[:, :3].double()
        normals, bounds = self.constraints(p)
        violated = ((normals * u[:, None]).sum(-1) < bounds - 1e-9)
        infeasible = torch.zeros(action.shape[0], dtype=torch.bool, device=action.device)
        safe_u = u.clone()
        if violated.any():
            single = violated.sum(-1) == 1
            if single.any():
                k = violated[single].float().argmax(-1)
                rows = single.nonzero().flatten()
                v = project_halfspace(u[rows], normals[rows, k], bounds[rows, k])
                fine = (v.abs() <= 1 + 1e-9).all(-1) & ((normals[rows] * v[:, None]).sum(-1) >= bounds[rows] - 1e-9).all(-1)
                safe_u[rows[fine]] = v[fine]
                single[rows[~fine]] = False
            rest = violated.any(-1) & ~single
            if rest.any():
                rows = rest.nonzero().flatten()
                v, solved = solve_qps(u[rows], normals[rows], bounds[rows])
                feasible = solved & ((normals[rows] * v[:, None]).sum(-1) >= bounds[rows] - 1e-6).all(-1)
                safe_u[rows] = torch.where(feasible[:, None], v, torch.zeros_like(v))
                infeasible[rows[~feasible]] = True
        safe = action.clone()
        safe[:, :3] = safe_u.to(action.dtype)
        return safe, changed(action, safe), {"infeasible": infeasible}
