"""Push: slide the red cube along the table to a goal in front of it."""
from __future__ import annotations

import math

import torch

from roborl.sim.registry import register
from roborl.tasks.arm import CUBE_HALF, ArmEnv
from roborl.tasks.cube import Cube
from roborl.tasks.expert import ScriptedExpert

CUBE_LOW, CUBE_HIGH = [0.4, -0.15], [0.55, 0.15]
SUCCESS_DIST = 0.025


class CubePushing:
    """Where to push from, for a task with a `cube` and a `goal` (N×3): the scripted experts' geometry."""

    @property
    def push_direction(self) -> torch.Tensor:
        """Unit vector from the cube to its goal (xy)."""
        d = self.goal[:, :2] - self.cube.pos[:, :2]
        return d / d.norm(dim=-1, keepdim=True).clamp(min=1e-6)

    def push_pose(self) -> torch.Tensor:
        """Where the TCP should be to push the cube toward the goal: just behind it, low."""
        xy = self.cube.pos[:, :2] - self.push_direction * (CUBE_HALF + 0.02)
        return torch.nn.functional.pad(xy, (0, 1), value=0.015)


class PushEnv(CubePushing, ArmEnv):
    """The goal lies 0.1-0.15 m from the cube, within 30 degrees of straight ahead (+x)."""

    scene = "push.xml"
    instruction = "push the red cube to the goal"
    label_names = ("touching", "cube_at_goal", "cube_off_table")
    episode_length = 80

    def _setup(self) -> None:
        super()._setup()
        self.cube = Cube(self, "cube")
        self.goal = torch.zeros(self.num_envs, 3, dtype=torch.float64)
        self.goal[:, 2] = CUBE_HALF

    def _reset_idx(self, ids: torch.Tensor) -> None:
        self._reset_arm(ids)
        xy = self.uniform(len(ids), CUBE_LOW, CUBE_HIGH)
        self.cube.place(ids, xy)
        angle, dist = self.uniform(len(ids), [-math.pi / 6, 0.1], [math.pi / 6, 0.15]).unbind(-1)
        self.goal[ids, :2] = xy + dist[:, None] * torch.stack([angle.cos(), angle.sin()], -1)

    def _state_obs(self) -> torch.Tensor:
        c = self.cube.pos
        return torch.cat([self._arm_obs(), c, self.cube.quat, self.goal, c - self.tcp, self.goal - c], -1)

    def _evaluate(self) -> dict[str, torch.Tensor]:
        c, tcp = self.cube.pos, self.tcp
        reach = (self.push_pose() - tcp).norm(dim=-1)
        to_goal = (self.goal[:, :2] - c[:, :2]).norm(dim=-1)
        off_table = c[:, 2] < -0.05
        at_goal = to_goal < SUCCESS_DIST
        success = at_goal & ~off_table
        touching = (c - tcp).norm(dim=-1) < CUBE_HALF + 0.03
        # (1 - tanh(5 reach)) + 2 (1 - tanh(5 to_goal)) + 3 success, over 6
        reward = (3 - torch.tanh(5 * reach) - 2 * torch.tanh(5 * to_goal) + 3 * success) / 6
        labels = torch.stack([touching, at_goal, off_table], -1)
        return {"reward": reward, "success": success, "labels": labels, "terminated": off_table}

    def _markers(self):
        return [(self.goal, (0.1, 0.9, 0.1, 0.5), 0.02)]


class PushExpert(ScriptedExpert):
    """Above the push pose, down behind the cube, push along the line to the goal, back off."""

    def plan(self):
        env = self.env
        n = env.num_envs
        c = env.cube.pos[:, :2]
        d = env.push_direction
        rel = env.tcp[:, :2] - c
        lateral = (d[:, 0] * rel[:, 1] - d[:, 1] * rel[:, 0]).abs()
        to_goal = (env.goal[:, :2] - c).norm(dim=-1, keepdim=True)
        along = (rel * d).sum(-1)
        slipped = (self.phase == 2) & ((lateral > 0.012) | (along > -0.022)) & (to_goal[:, 0] > 0.015)
        self.phase[slipped] = 0  # off the line through cube and goal: approach again
        pose = env.push_pose()
        above = pose + torch.tensor([0, 0, 0.08], dtype=pose.dtype)
        forward = d * ((to_goal - 0.008).clamp(0.0, 0.015) - (CUBE_HALF + 0.011))
        through = self.limit(torch.cat([c + forward, pose[:, 2:]], -1), 0.006)
        retreat = env.tcp.clone()
        retreat[:, 2] = 0.08
        target = self.select([above, pose, through, retreat])
        advance = torch.stack([self.at(above, 0.015), self.at(pose, 0.008), to_goal[:, 0] < 0.015,
                               torch.zeros(n, dtype=torch.bool)], 0)
        advance = advance[self.phase.clamp(max=3), torch.arange(n)]
        return target, -torch.ones(n), advance


@register("mujoco/Push")
def make_push(num_envs: int = 1, **kwargs) -> PushEnv:
    return PushEnv(num_envs, **kwargs)
