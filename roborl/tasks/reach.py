"""Reach: move the tool-centre point to a random goal in the workspace."""
from __future__ import annotations

import torch

from roborl.sim.registry import register
from roborl.tasks.arm import ArmEnv
from roborl.tasks.expert import ScriptedExpert

GOAL_LOW = [0.4, -0.25, 0.05]
GOAL_HIGH = [0.7, 0.25, 0.35]
SUCCESS_DIST = 0.025


class ReachEnv(ArmEnv):
    scene = "reach.xml"
    instruction = "move the gripper to the green target"
    label_names = ("at_goal",)
    episode_length = 50

    def _setup(self) -> None:
        super()._setup()
        self.goal = torch.zeros(self.num_envs, 3, dtype=torch.float64)

    def _reset_idx(self, ids: torch.Tensor) -> None:
        self._reset_arm(ids)
        self.goal[ids] = self.uniform(len(ids), GOAL_LOW, GOAL_HIGH)

    def _state_obs(self) -> torch.Tensor:
        return torch.cat([self._arm_obs(), self.goal, self.goal - self.tcp], -1)

    def _evaluate(self) -> dict[str, torch.Tensor]:
        dist = (self.goal - self.tcp).norm(dim=-1)
        success = dist < SUCCESS_DIST
        reward = (1 - torch.tanh(5 * dist) + success.double()) / 2
        return {"reward": reward, "success": success, "labels": success[:, None]}

    def _markers(self):
        return [(self.goal, (0.1, 0.9, 0.1, 0.6), 0.02)]


class ReachExpert(ScriptedExpert):
    def plan(self):
        env = self.env
        return env.goal, torch.ones(env.num_envs), torch.zeros(env.num_envs, dtype=torch.bool)


@register("mujoco/Reach")
def make_reach(num_envs: int = 1, **kwargs) -> ReachEnv:
    return ReachEnv(num_envs, **kwargs)
