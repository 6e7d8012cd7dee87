"""PickPlace: grasp the red cube and hold it at a goal above the table."""
from __future__ import annotations

import torch

from roborl.sim.registry import register
from roborl.tasks.arm import ArmEnv
from roborl.tasks.cube import Cube
from roborl.tasks.expert import ScriptedExpert

CUBE_LOW, CUBE_HIGH = [0.45, -0.15], [0.65, 0.15]
GOAL_LOW, GOAL_HIGH = [0.45, -0.15, 0.08], [0.65, 0.15, 0.25]
SUCCESS_DIST = 0.025


class PickPlaceEnv(ArmEnv):
    scene = "pick_place.xml"
    instruction = "pick up the red cube and move it to the goal"
    label_names = ("grasped", "lifted", "cube_at_goal")
    episode_length = 80

    def _setup(self) -> None:
        super()._setup()
        self.cube = Cube(self, "cube")
        self.goal = torch.zeros(self.num_envs, 3, dtype=torch.float64)

    def _reset_idx(self, ids: torch.Tensor) -> None:
        self._reset_arm(ids)
        self.cube.place(ids, self.uniform(len(ids), CUBE_LOW, CUBE_HIGH))
        self.goal[ids] = self.uniform(len(ids), GOAL_LOW, GOAL_HIGH)

    def _state_obs(self) -> torch.Tensor:
        c = self.cube.pos
        grasped = self.is_grasping(c).double()[:, None]
        return torch.cat([self._arm_obs(), c, self.cube.quat, self.goal, c - self.tcp, self.goal - c, grasped], -1)

    def _evaluate(self) -> dict[str, torch.Tensor]:
        c = self.cube.pos
        reach = (c - self.tcp).norm(dim=-1)
        to_goal = (self.goal - c).norm(dim=-1)
        grasped = self.is_grasping(c)
        success = to_goal < SUCCESS_DIST
        g = grasped.double()
        reward = (1 - torch.tanh(5 * reach)) + g + g * (1 - torch.tanh(5 * to_goal))
        reward = torch.where(success, torch.full_like(reward, 5.0), reward + success.double())
        labels = torch.stack([grasped, c[:, 2] > 0.04, success], -1)
        return {"reward": reward / 5, "success": success, "labels": labels}

    def _markers(self):
        return [(self.goal, (0.1, 0.9, 0.1, 0.5), 0.02)]


def pick_phases(expert: ScriptedExpert, cube: Cube, destination: torch.Tensor, release: bool):
    """Shared by PickPlace and Stack: above, down, close, lift, carry to destination (then release)."""
    env = expert.env
    n = env.num_envs
    c = cube.pos
    above = c + torch.tensor([0, 0, 0.08], dtype=c.dtype)
    grasp = c + torch.tensor([0, 0, 0.0], dtype=c.dtype)
    lift = torch.cat([c[:, :2], destination[:, 2:].clamp(min=0.12) + 0.04], -1)
    lift = expert.limit(lift, 0.02)
    over = torch.cat([destination[:, :2], lift[:, 2:]], -1)
    hold = env.tcp.clone()
    carry = env.tcp - c  # place the cube, not the TCP, at the destination
    destination = destination + torch.where(env.is_grasping(c)[:, None], carry, torch.zeros_like(carry))
    targets = [above, grasp, grasp, lift, over, destination, hold, hold + torch.tensor([0, 0, 0.1], dtype=c.dtype)]
    grip = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0, -1.0, 1.0 if release else -1.0, 1.0 if release else -1.0])
    p = expert.phase.clamp(max=len(targets) - 1)
    timer = expert.timer
    done_checks = [
        expert.at(above, 0.015),
        expert.at(grasp, 0.01) | (timer > 15),
        timer >= 4,
        (c[:, 2] > lift[:, 2] - 0.03) | (timer > 20),
        expert.at(over, 0.02),
        (expert.at(destination, 0.01) | (timer > 25)) if release else torch.zeros(n, dtype=torch.bool),
        (timer >= 4) if release else torch.zeros(n, dtype=torch.bool),
        torch.zeros(n, dtype=torch.bool),
    ]
    advance = torch.stack(done_checks, 0)[p, torch.arange(n)]
    target = expert.select(targets)
    return target, grip[p], advance


class PickPlaceExpert(ScriptedExpert):
    def plan(self):
        env = self.env
        return pick_phases(self, env.cube, env.goal, release=False)


@register("mujoco/PickPlace")
def make_pick_place(num_envs: int = 1, **kwargs) -> PickPlaceEnv:
    return PickPlaceEnv(num_envs, **kwargs)


GRIPPER_SAFETY_LABELS = ("lifted", "opening", "at_goal")


def gripper_safety_labels(obs: dict, action: torch.Tensor) -> torch.Tensor:
    """The labels of `tasks/pick_place_gripper.rm` that `action` would make true: the cube is held above
    the table, the gripper command opens, the cube is at the goal (from PickPlace's observation)."""
    state = obs["state"]
    cube_z, to_goal, grasped = state[:, 20], state[:, 31:34], state[:, -1] > 0.5
    lifted = grasped & (cube_z > 0.04)
    return torch.stack([lifted, action[:, -1] > 0, to_goal.norm(dim=-1) < SUCCESS_DIST], -1)


def keep_gripper_closed(obs: dict, action: torch.Tensor) -> torch.Tensor:
    safe = action.clone()
    safe[:, -1] = -1.0
    return safe

