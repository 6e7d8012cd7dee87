"""Sequence: touch targets A, then B, then C with the gripper (a task with temporal structure).

The observation shows the three targets but not which were touched: the reward "1 once A, B and C
have been touched in this order" is not Markovian in it. A reward machine over the labels `at_a`,
`at_b`, `at_c` (`tasks/sequence.rm`) supplies that memory. The task's own reward is that sparse 1 at
completion (the episode then ends); it also publishes reward terms `approach_a/b/c`: the progress
toward each target in this step (a difference of distances, so hovering near a target earns nothing),
which the machine pays while it waits for that target.
"""
from __future__ import annotations

import torch

from roborl.sim.registry import register
from roborl.tasks.arm import ArmEnv
from roborl.tasks.expert import ScriptedExpert

TARGET_LOW = [0.4, -0.25, 0.08]
TARGET_HIGH = [0.7, 0.25, 0.35]
TOUCH_DIST = 0.04
MIN_SEPARATION = 0.12
APPROACH_GAIN = 5.0  # reward per metre of progress toward a target (0.2 for a full 4 cm step)
NAMES = ("a", "b", "c")
COLORS = [(0.9, 0.2, 0.2, 0.6), (0.2, 0.4, 0.9, 0.6), (0.9, 0.8, 0.1, 0.6)]


class SequenceEnv(ArmEnv):
    scene = "reach.xml"
    instruction = "touch the red, then the blue, then the yellow target"
    label_names = tuple(f"at_{n}" for n in NAMES)
    reward_term_names = tuple(f"approach_{n}" for n in NAMES)
    label_progress = {f"at_{n}": f"approach_{n}" for n in NAMES}
    episode_length = 100
    order = (0, 1, 2)  # the targets to touch, in this order (tasks/tour.py repeats them)

    def _setup(self) -> None:
        super()._setup()
        self.targets = torch.zeros(self.num_envs, 3, 3, dtype=torch.float64)
        self.progress = torch.zeros(self.num_envs, dtype=torch.long)  # targets touched in order so far
        self.last_dist = torch.zeros(self.num_envs, 3, dtype=torch.float64)
        self.order_index = torch.tensor(self.order)  # target of each touch, built once (read every step)

    def _reset_idx(self, ids: torch.Tensor) -> None:
        self._reset_arm(ids)
        targets = self.uniform(len(ids) * 3, TARGET_LOW, TARGET_HIGH).view(len(ids), 3, 3)
        for _ in range(50):  # resample targets closer than MIN_SEPARATION to an earlier one
            gaps = torch.cdist(targets, targets) + torch.eye(3, dtype=targets.dtype) * 1e3
            close = gaps.min(-1).values < MIN_SEPARATION
            if not close.any():
                break
            targets[close] = self.uniform(int(close.sum()), TARGET_LOW, TARGET_HIGH)
        self.targets[ids] = targets
        self.progress[ids] = 0
        self.state_version += 1  # the arm moved: recompute the TCP for these distances
        self.last_dist[ids] = (targets - self.tcp[ids, None]).norm(dim=-1)

    def distances(self) -> torch.Tensor:
        return (self.targets - self.tcp[:, None]).norm(dim=-1)

    def _state_obs(self) -> torch.Tensor:
        rel = self.targets - self.tcp[:, None]
        return torch.cat([self._arm_obs(), self.targets.flatten(1), rel.flatten(1)], -1)

    def _evaluate(self) -> dict[str, torch.Tensor]:
        dist = self.distances()
        at = dist < TOUCH_DIST
        rows, steps = torch.arange(self.num_envs), len(self.order)
        wanted = self.order_index[self.progress.clamp(max=steps - 1)]
        self.progress += (at[rows, wanted] & (self.progress < steps)).long()
        success = self.progress >= steps
        approach = APPROACH_GAIN * (self.last_dist - dist)  # progress toward each target this step
        self.last_dist = dist
        return {"reward": success.double(), "success": success, "terminated": success, "labels": at,
                "reward_terms": approach}

    def _markers(self):
        return [(self.targets[:, i], COLORS[i], 0.02) for i in range(3)]


class SequenceExpert(ScriptedExpert):
    def plan(self):
        env = self.env
        target = self.select([env.targets[:, i] for i in env.order])
        return target, torch.ones(env.num_envs), self.at(target, 0.02) & (self.phase < len(env.order))


@register("mujoco/Sequence")
def make_sequence(num_envs: int = 1, **kwargs) -> SequenceEnv:
    return SequenceEnv(num_envs, **kwargs)
