"""Shields that keep two arms' TCPs apart (tasks/two_arms.py): one per arm, composed, or one for both.

Each arm's `ee_delta_pos` action u_i (its first three dims) commands the TCP target p_i' = p_i + s·u_i
(s = max_ee_step). With D the gap to keep and d = ‖p_i − p_j‖:

Compositional (assume-guarantee; each arm's shield sees its own action only). Arm i's contract:
- (G1) its target moves at most s per step, ‖u_i‖ ≤ 1 (a speed bound);
- (G2) its target stays out of the other arm's declared region, the ball of radius D + s around p_j: the
  tangent half-space n·(p_i' − p_j) ≥ D + s with n = (p_i − p_j)/d, i.e. n·u_i ≥ (D + s − d)/s.
Assuming the other keeps G1 (‖p_j' − p_j‖ ≤ s), ‖p_i' − p_j'‖ ≥ n·(p_i' − p_j') ≥ D + s − s = D: composed,
the targets stay D apart. The shield projects u_i onto {‖v‖ ≤ 1} ∩ {n·v ≥ b} in closed form; the set is
non-empty whenever d ≥ D (v = n reaches n·v = 1), so the invariant d ≥ D carries itself from step to step.
Where the measured TCPs are closer than D already (tracking lag), the best effort is v = n: straight apart.

Centralized (one shield on the joint action v = (v_l, v_r) ∈ R⁶): argmin ‖v − u‖² subject to ‖v_l‖ ≤ 1,
‖v_r‖ ≤ 1 and n·(v_l − v_r) ≥ (D − d)/s (the targets' offset along n at least D). It knows both actions, so
it is less conservative; it is solved batched by Dykstra's alternating projections between the product of the
two balls and the half-space (the closed form where the half-space projection already lies in the balls).
"""
from __future__ import annotations

import torch

from roborl.shields.base import Shield, changed


def _unit(v: torch.Tensor) -> torch.Tensor:
    return v / v.norm(dim=-1, keepdim=True).clamp(min=1e-12)


def _into_ball(v: torch.Tensor) -> torch.Tensor:
    return v / v.norm(dim=-1, keepdim=True).clamp(min=1.0)


def project_ball_halfspace(u: torch.Tensor, n: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """argmin ‖v − u‖² s.t. ‖v‖ ≤ 1 and n·v ≥ b (n unit), batched in closed form; (v, infeasible) where an
    infeasible row (b > 1) gets v = n, the most it can do along n."""
    a0 = (n * u).sum(-1)
    w0 = u - a0[:, None] * n
    ball = _into_ball(u)
    half = u + (b - a0).clamp(min=0)[:, None] * n
    # the circle where the sphere meets the plane, toward u (any direction of the plane if u is on the normal)
    fallback = _unit(torch.linalg.cross(n, torch.tensor([0.0, 0.0, 1.0], dtype=n.dtype).expand_as(n), dim=-1))
    fallback = torch.where(fallback.norm(dim=-1, keepdim=True) > 0.5, fallback, torch.tensor([1.0, 0, 0], dtype=n.dtype))
    direction = torch.where(w0.norm(dim=-1, keepdim=True) > 1e-12, _unit(w0), fallback)
    circle = b[:, None].clamp(max=1) * n + (1 - b.clamp(max=1).square()).clamp(min=0).sqrt()[:, None] * direction
    tol = 1e-12
    v = torch.where(((n * ball).sum(-1) >= b - tol)[:, None], ball,
                    torch.where((half.norm(dim=-1) <= 1 + tol)[:, None], half, circle))
    infeasible = b > 1 + tol
    return torch.where(infeasible[:, None], n, v), infeasible


class ArmGapShield(Shield):
    """One arm's compositional shield: its action's xyz (`action[:, start:start + 3]`) keeps G1 and G2 above,
    reading its own TCP and the other's from `state`."""

    def __init__(self, tcp: slice, other_tcp: slice, start: int, max_step: float, gap: float) -> None:
        self.tcp, self.other_tcp, self.start, self.max_step, self.gap = tcp, other_tcp, start, max_step, gap

    def __call__(self, obs: dict, action: torch.Tensor):
        state = obs["state"].double()
        p, other = state[:, self.tcp], state[:, self.other_tcp]
        diff = p - other
        d = diff.norm(dim=-1)
        n = _unit(diff)
        u = action[:, self.start : self.start + 3].double()
        v, infeasible = project_ball_halfspace(u, n, (self.gap + self.max_step - d) / self.max_step)
        safe = action.clone()
        safe[:, self.start : self.start + 3] = v.to(action.dtype)
        return safe, changed(action, safe), {"infeasible": infeasible}


class JointGapShield(Shield):
    """The centralized shield over both arms' actions (xyz at `starts[0]` and `starts[1]`)."""

    def __init__(self, tcps: tuple[slice, slice], starts: tuple[int, int], max_step: float, gap: float,
                 iterations: int = 50) -> None:
        self.tcps, self.starts, self.max_step, self.gap, self.iterations = tcps, starts, max_step, gap, iterations

    def __call__(self, obs: dict, action: torch.Tensor):
        state = obs["state"].double()
        diff = state[:, self.tcps[0]] - state[:, self.tcps[1]]
        n = _unit(diff)
        normal = torch.cat([n, -n], -1) / 2**0.5  # unit normal of the half-space in R⁶
        bound = (self.gap - diff.norm(dim=-1)) / self.max_step / 2**0.5
        (i, j) = self.starts
        u = torch.cat([action[:, i : i + 3], action[:, j : j + 3]], -1).double()
        v = self._project(u, normal, bound)
        infeasible = bound > 2**0.5 + 1e-9  # n·(v_l − v_r) ≤ 2 within the balls
        safe = action.clone()
        safe[:, i : i + 3], safe[:, j : j + 3] = v[:, :3].to(action.dtype), v[:, 3:].to(action.dtype)
        return safe, changed(action, safe), {"infeasible": infeasible}

    def _project(self, u: torch.Tensor, normal: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
        def balls(v: torch.Tensor) -> torch.Tensor:
            return torch.cat([_into_ball(v[:, :3]), _into_ball(v[:, 3:])], -1)

        def half(v: torch.Tensor) -> torch.Tensor:
            return v + (bound - (normal * v).sum(-1)).clamp(min=0)[:, None] * normal

        v = half(u)
        inside = (v[:, :3].norm(dim=-1) <= 1 + 1e-12) & (v[:, 3:].norm(dim=-1) <= 1 + 1e-12)
        if inside.all():
            return v
        rows = (~inside).nonzero().flatten()
        x, p, q = u[rows], torch.zeros_like(u[rows]), torch.zeros_like(u[rows])
        normal_r, bound_r = normal[rows], bound[rows]
        for _ in range(self.iterations):  # Dykstra: converges to the projection onto the intersection
            y = balls(x + p)
            p = x + p - y
            shifted = y + q
            x = shifted + (bound_r - (normal_r * shifted).sum(-1)).clamp(min=0)[:, None] * normal_r
            q = shifted - x
        x = balls(x)
        short = (normal_r * x).sum(-1) < bound_r - 1e-9  # not converged onto the half-space: straight apart
        apart = torch.cat([normal_r[:, :3], normal_r[:, 3:]], -1) * 2**0.5  # (n, −n)
        scale = (bound_r * 2**0.5 / 2).clamp(0, 1)[:, None]
        x = torch.where(short[:, None], scale * apart, x)
        v[rows] = x
        return v
