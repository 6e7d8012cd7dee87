"""Scripted experts: batched state machines over privileged task state that drive `ee_delta_pos`."""
from __future__ import annotations

import torch

from roborl.tasks.arm import ArmEnv


class ScriptedExpert:
    """Per-env phase machine. Subclasses implement `plan() -> (target N×3, gripper N, advance N bool)`:
    where the TCP should go in the current phase, the gripper command, and which envs move on."""

    def __init__(self, env: ArmEnv, gain: float = 2.0) -> None:
        if env.controller != "ee_delta_pos":
            raise ValueError("scripted experts drive the 'ee_delta_pos' controller")
        self.env = env
        self.gain = gain
        self.phase = torch.zeros(env.num_envs, dtype=torch.long)
        self.timer = torch.zeros(env.num_envs, dtype=torch.long)

    def reset(self, mask: torch.Tensor | None = None) -> None:
        mask = torch.ones_like(self.phase, dtype=torch.bool) if mask is None else mask.cpu()
        self.phase[mask] = 0
        self.timer[mask] = 0

    def plan(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def act(self, obs: dict | None = None) -> torch.Tensor:
        target, gripper, advance = self.plan()
        self.timer += 1
        self.timer[advance] = 0
        self.phase += advance.long()
        delta = (target - self.env.tcp) / self.env.max_ee_step * self.gain
        action = torch.cat([delta.clamp(-1, 1), gripper[:, None].to(delta.dtype)], -1)
        return action.float().to(self.env.device)

    def at(self, target: torch.Tensor, tol: float = 0.01) -> torch.Tensor:
        return (self.env.tcp - target).norm(dim=-1) < tol

    def limit(self, target: torch.Tensor, max_dist: float) -> torch.Tensor:
        """A waypoint at most `max_dist` from the TCP on the way to `target` (slow, careful moves)."""
        delta = target - self.env.tcp
        scale = (max_dist / delta.norm(dim=-1, keepdim=True).clamp(min=1e-9)).clamp(max=1.0)
        return self.env.tcp + delta * scale

    def select(self, phases: list[torch.Tensor]) -> torch.Tensor:
        """Pick, per env, the row of the current phase from a list of per-phase tensors."""
        stacked = torch.stack(phases, 0)
        idx = self.phase.clamp(max=len(phases) - 1)
        return stacked[idx, torch.arange(len(idx))]


class ImperfectExpert:
    """A scripted expert made realistically imperfect: a constant bias on its normalized action (a
    miscalibrated controller) plus Gaussian noise, clipped to [-1, 1]. A base for residual RL."""

    def __init__(self, expert: ScriptedExpert, bias: list[float] | None = None, noise: float = 0.0,
                 seed: int = 0) -> None:
        self.expert = expert
        dim = expert.env.action_dim
        bias = list(bias or [])
        if len(bias) not in (0, dim):
            raise ValueError(f"the expert's action bias needs {dim} values (one per action dim), got {len(bias)}")
        self.bias = torch.tensor(bias or [0.0] * dim, dtype=torch.float32, device=expert.env.device)
        self.noise = noise
        self.generator = torch.Generator(device=expert.env.device).manual_seed(seed)

    def reset(self, mask: torch.Tensor | None = None) -> None:
        self.expert.reset(mask)

    def __call__(self, obs: dict | None = None) -> torch.Tensor:
        action = self.expert.act(obs) + self.bias
        if self.noise > 0:
            action = action + self.noise * torch.randn(action.shape, generator=self.generator, device=action.device)
        return action.clamp(-1, 1)
