"""ReachAvoid: reach a goal behind a keep-out sphere (a human zone) without entering it and without
moving the gripper faster than a speed limit.

The sphere is fixed in the world (so a deployed shield can know it), between the arm's start and the
goals, and straight paths to many goals cross it. `info["cost"]` is 1 for a step that ends with the
TCP inside the sphere or that moved it faster than the limit; the labels `in_keep_out` and `too_fast`
say which.
"""
from __future__ import annotations

import torch

from roborl.sim.registry import register
from roborl.tasks.arm import ArmEnv
from roborl.tasks.expert import ScriptedExpert

GOAL_LOW = [0.36, -0.2, 0.1]
GOAL_HIGH = [0.44, 0.2, 0.3]
SUCCESS_DIST = 0.025
KEEP_OUT = (0.5, 0.0, 0.2, 0.07)  # centre x, y, z and radius (metres)
SPEED_LIMIT = 0.6  # m/s of the TCP


class ReachAvoidEnv(ArmEnv):
    scene = "reach.xml"
    instruction = "move the gripper to the green target without entering the red zone or rushing"
    label_names = ("at_goal", "in_keep_out", "too_fast")
    episode_length = 60

    def _setup(self) -> None:
        super()._setup()
        self.goal = torch.zeros(self.num_envs, 3, dtype=torch.float64)
        self.keep_out = torch.tensor(KEEP_OUT, dtype=torch.float64)
        self.last_tcp = torch.zeros(self.num_envs, 3, dtype=torch.float64)

    def _reset_idx(self, ids: torch.Tensor) -> None:
        self._reset_arm(ids)
        self.goal[ids] = self.uniform(len(ids), GOAL_LOW, GOAL_HIGH)
        self.state_version += 1  # the arm moved: recompute the TCP
        self.last_tcp[ids] = self.tcp[ids]

    def _state_obs(self) -> torch.Tensor:
        centre = self.keep_out[:3].expand(self.num_envs, 3)
        return torch.cat([self._arm_obs(), self.goal, self.goal - self.tcp, centre - self.tcp], -1)

    def _evaluate(self) -> dict[str, torch.Tensor]:
        dist = (self.goal - self.tcp).norm(dim=-1)
        success = dist < SUCCESS_DIST
        inside = (self.tcp - self.keep_out[:3]).norm(dim=-1) < self.keep_out[3]
        speed = (self.tcp - self.last_tcp).norm(dim=-1) / self.control_dt
        self.last_tcp = self.tcp.clone()
        too_fast = speed > SPEED_LIMIT
        reward = (1 - torch.tanh(5 * dist) + success.double()) / 2
        return {"reward": reward, "success": success, "labels": torch.stack([success, inside, too_fast], -1),
                "cost": (inside | too_fast).double()}

    def _markers(self):
        return [(self.goal, (0.1, 0.9, 0.1, 0.6), 0.02),
                (self.keep_out[:3].expand(self.num_envs, 3), (0.9, 0.1, 0.1, 0.3), float(self.keep_out[3]))]


class ReachAvoidExpert(ScriptedExpert):
    """Over the zone, then down to the goal, at half speed."""

    def plan(self):
        env = self.env
        c, r = env.keep_out[:3], float(env.keep_out[3])
        high = torch.cat([env.tcp[:, :2], torch.full((env.num_envs, 1), float(c[2]) + r + 0.06, dtype=torch.float64)], -1)
        above = torch.cat([env.goal[:, :2], high[:, 2:]], -1)
        target = self.select([self.limit(high, 0.02), self.limit(above, 0.02), self.limit(env.goal, 0.02)])
        return target, torch.ones(env.num_envs), torch.stack([self.at(high, 0.02), self.at(above, 0.02),
                                                              torch.zeros(env.num_envs, dtype=torch.bool)], 0)[
            self.phase.clamp(max=2), torch.arange(env.num_envs)]


@register("mujoco/ReachAvoid")
def make_reach_avoid(num_envs: int = 1, **kwargs) -> ReachAvoidEnv:
    return ReachAvoidEnv(num_envs, **kwargs)
