"""Post-posed limit shields for the arm: an unsafe action is replaced by the nearest safe one.

They read the proprioception at the front of every arm task's `state` (`tasks.arm.ARM_OBS`: joint
positions, scaled joint velocities, gripper, TCP position), so the same shield runs on the robot side.
"""
from __future__ import annotations

import torch

from roborl.shields.base import Shield, changed


def clamp_delta_target(action: torch.Tensor, now: torch.Tensor, step: float, low: torch.Tensor,
                       high: torch.Tensor) -> torch.Tensor:
    """The nearest action whose target now + action·step lies in [low, high]. A coordinate already outside
    (an overshoot, a start outside) is sent back toward the box by up to a step: holding a moving arm's target
    at where it is measured would move the target out with the arm, period after period, while the arm brakes.
    More than a step outside, no action in [-1, 1] reaches the box, and the target is a full step back."""
    target = (now + action * step).clamp(low, high)
    return ((target - now) / step).clamp(-1, 1)


class WorkspaceShield(Shield):
    """ee_delta_pos: the commanded TCP target tcp + a·max_step stays inside the box [low, high]."""

    def __init__(self, low: list[float], high: list[float], tcp: slice, max_step: float) -> None:
        self.low, self.high = torch.tensor(low), torch.tensor(high)
        if (self.low >= self.high).any():
            raise ValueError(f"workspace box: low {low} must be below high {high}")
        self.tcp, self.max_step = tcp, max_step

    def __call__(self, obs: dict, action: torch.Tensor):
        p = obs["state"][:, self.tcp].to(action.dtype)
        safe = action.clone()
        safe[:, :3] = clamp_delta_target(action[:, :3], p, self.max_step, self.low.to(action), self.high.to(action))
        return safe, changed(action, safe), {}


class SpeedShield(Shield):
    """ee_delta_pos: the commanded TCP step is at most `max_speed` (m/s) · control period."""

    def __init__(self, max_speed: float, control_dt: float, max_step: float) -> None:
        self.limit = max_speed * control_dt / max_step  # as a norm of the normalized xyz action

    def __call__(self, obs: dict, action: torch.Tensor):
        norm = action[:, :3].norm(dim=-1, keepdim=True)
        scale = (self.limit / norm.clamp(min=1e-12)).clamp(max=1.0)
        safe = action.clone()
        safe[:, :3] = action[:, :3] * scale
        return safe, changed(action, safe), {}


class ActionRateShield(Shield):
    """|a_t − a_{t−1}| ≤ max_delta per dimension; the first action of an episode is free."""

    def __init__(self, max_delta: float) -> None:
        self.max_delta = max_delta
        self.previous: torch.Tensor | None = None
        self.has_previous: torch.Tensor | None = None

    def __call__(self, obs: dict, action: torch.Tensor):
        if self.previous is None:
            return action, torch.zeros(action.shape[0], dtype=torch.bool, device=action.device), {}
        low, high = self.previous - self.max_delta, self.previous + self.max_delta
        safe = torch.where(self.has_previous[:, None], action.clamp(low, high), action)
        return safe, changed(action, safe), {}

    def observe(self, obs: dict, executed: torch.Tensor, info: dict) -> None:
        self.previous = executed.detach().clone()
        if self.has_previous is None:
            self.has_previous = torch.ones(executed.shape[0], dtype=torch.bool, device=executed.device)
        self.has_previous.fill_(True)

    def reset(self, mask: torch.Tensor | None = None) -> None:
        if self.has_previous is None:
            return
        if mask is None:
            self.has_previous.fill_(False)
        else:
            self.has_previous[mask.to(self.has_previous.device)] = False


class JointLimitShield(Shield):
    """joint_delta_pos: q + a·max_joint_step stays within [lower + margin, upper − margin]."""

    def __init__(self, lower: torch.Tensor, upper: torch.Tensor, q: slice, max_joint_step: float,
                 margin: float = 0.05) -> None:
        self.lower, self.upper = lower.float() + margin, upper.float() - margin
        self.q, self.max_joint_step = q, max_joint_step

    def __call__(self, obs: dict, action: torch.Tensor):
        q = obs["state"][:, self.q].to(action.dtype)
        safe = action.clone()
        safe[:, :7] = clamp_delta_target(action[:, :7], q, self.max_joint_step, self.lower.to(action),
                                         self.upper.to(action))
        return safe, changed(action, safe), {}
