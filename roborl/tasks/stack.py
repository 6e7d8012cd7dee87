"""Stack: put the red cube on top of the blue one and let go."""
from __future__ import annotations

import torch

from roborl.sim.registry import register
from roborl.tasks.arm import CUBE_HALF, ArmEnv
from roborl.tasks.cube import Cube
from roborl.tasks.expert import ScriptedExpert
from roborl.tasks.pick_place import pick_phases

REGION_LOW, REGION_HIGH = [0.45, -0.15], [0.65, 0.15]
MIN_SEPARATION = 0.08
CLEARANCE = 0.03  # m the carried cube is drawn above its resting place on the base until it is over the base
ALIGNED = 0.02  # m of horizontal offset within which that lift fades out (squared: flat once over the base)


def placing_reward(cube: torch.Tensor, resting: torch.Tensor) -> torch.Tensor:
    """In [0, 1], 1 with the cube at its resting place on the base (N×3 each). It draws the cube to that place
    lifted by CLEARANCE while the cube is not yet over the base: drawn straight there, PPO learns to press the
    held cube against the base's side (a local optimum about 4.5 cm from it) and rarely finds the way over."""
    xy = (resting - cube)[:, :2].norm(dim=-1)
    lift = CLEARANCE * torch.tanh((xy / ALIGNED) ** 2)
    target = resting + torch.nn.functional.pad(lift[:, None], (2, 0))
    return 1 - torch.tanh(5 * (target - cube).norm(dim=-1))


def stacking_reward(cube: torch.Tensor, resting: torch.Tensor, tcp: torch.Tensor, grasped: torch.Tensor,
                    gripper_gap: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reward in [0, 1] and the success of stacking `cube` on its `resting` place (N×3 each): reach the cube,
    hold it, carry it there (`placing_reward`), open the gripper; success, worth the most, is the cube within
    1.5 cm (xy) and 8 mm (height) of that place and let go. mujoco/Stack and LangTabletop's stack task share it."""
    offset = resting - cube
    on_top = (offset[:, :2].norm(dim=-1) < 0.015) & (offset[:, 2].abs() < 0.008)
    success = on_top & ~grasped
    g = grasped.double()
    reach = (cube - tcp).norm(dim=-1)
    release = torch.where(on_top, (gripper_gap / 0.08).double(), torch.zeros_like(g))
    reward = (1 - torch.tanh(5 * reach)) + g + 2 * placing_reward(cube, resting) * torch.maximum(g, on_top.double()) \
        + release
    return torch.where(success, torch.full_like(reward, 8.0), reward) / 8, success


class StackEnv(ArmEnv):
    scene = "stack.xml"
    instruction = "stack the red cube on the blue cube"
    label_names = ("grasped", "above_base", "stacked")
    episode_length = 100

    def _setup(self) -> None:
        super()._setup()
        self.cube = Cube(self, "cube")
        self.base = Cube(self, "base_cube")

    def _reset_idx(self, ids: torch.Tensor) -> None:
        self._reset_arm(ids)
        a = self.uniform(len(ids), REGION_LOW, REGION_HIGH)
        b = self.uniform(len(ids), REGION_LOW, REGION_HIGH)
        for _ in range(20):  # resample pairs that overlap (vectorized rejection)
            bad = (a - b).norm(dim=-1) < MIN_SEPARATION
            if not bad.any():
                break
            b[bad] = self.uniform(int(bad.sum()), REGION_LOW, REGION_HIGH)
        self.cube.place(ids, a)
        self.base.place(ids, b)

    @property
    def stack_target(self) -> torch.Tensor:
        return self.base.pos + torch.tensor([0, 0, 2 * CUBE_HALF], dtype=torch.float64)

    def _state_obs(self) -> torch.Tensor:
        a, b = self.cube.pos, self.base.pos
        grasped = self.is_grasping(a).double()[:, None]
        return torch.cat([self._arm_obs(), a, self.cube.quat, b, self.base.quat,
                          a - self.tcp, self.stack_target - a, grasped], -1)

    def _evaluate(self) -> dict[str, torch.Tensor]:
        a = self.cube.pos
        grasped = self.is_grasping(a)
        reward, success = stacking_reward(a, self.stack_target, self.tcp, grasped, self.gripper_gap)
        above = ((self.stack_target - a)[:, :2].norm(dim=-1) < 0.015) & (a[:, 2] > self.base.pos[:, 2] + CUBE_HALF)
        labels = torch.stack([grasped, above, success], -1)
        return {"reward": reward, "success": success, "labels": labels}


class StackExpert(ScriptedExpert):
    def plan(self):
        env = self.env
        return pick_phases(self, env.cube, env.stack_target + torch.tensor([0, 0, 0.005], dtype=torch.float64),
                           release=True)


@register("mujoco/Stack")
def make_stack(num_envs: int = 1, **kwargs) -> StackEnv:
    return StackEnv(num_envs, **kwargs)
