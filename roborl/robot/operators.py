"""Scripted operators for the twin's tasks: the teleop devices of tests and benchmarks (`robot.operator:
roborl.robot.operators:push_operator`), standing in for a person who watches the robot and steps in. They see
what the robot sends (the task's `state`, `episode_step`; the twin's `task_state` where the policy's `state` is the
arm's proprioception alone, since the person sees the cube) and command `ee_delta_pos` actions. And the scripted
judge of a reward classifier's claimed successes (`robot.judge`), standing in for the person who says whether
the task is really done."""
from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from roborl.errors import UserError
from roborl.tasks.arm import ArmEnv
from roborl.tasks.cube import CUBE_HALF

TCP, CUBE, GOAL = slice(15, 18), slice(18, 21), slice(25, 28)  # in Push's state


def guide(state: np.ndarray) -> np.ndarray:
    """The operator's command: above the spot behind the cube, down to it, then through the cube toward the goal
    (the scripted expert's geometry, from the observation alone)."""
    tcp, cube, goal = state[TCP], state[CUBE], state[GOAL]
    d = goal[:2] - cube[:2]
    d = d / max(np.linalg.norm(d), 1e-6)
    behind = cube[:2] - d * (CUBE_HALF + 0.02)
    off_line = np.linalg.norm(tcp[:2] - behind)
    if off_line > 0.03:
        target = np.r_[behind, 0.08]  # travel above the cube
    elif off_line > 0.01:
        target = np.r_[behind, tcp[2]]  # line up
    elif tcp[2] > 0.025:
        target = np.r_[behind, 0.015]
    else:
        target = np.r_[cube[:2] + d * 0.02, 0.015]
    delta = np.clip((target - tcp) / ArmEnv.max_ee_step * 2, -1, 1)
    return np.r_[delta, -1.0].astype(np.float32)


def push_operator() -> Callable[[dict], np.ndarray | None]:
    """`robot.operator: roborl.robot.operators:push_operator`: takes over for 20 steps when the policy heads away
    from the cube (its distance to the TCP grew for three steps in a row, more than 5 cm away)."""
    distances: deque[float] = deque(maxlen=4)
    left = [0]

    def rule(obs):
        state = obs.get("task_state", obs["state"])
        if obs["episode_step"] == 0:
            distances.clear()
            left[0] = 0
        distance = float(np.linalg.norm(state[CUBE] - state[TCP]))
        distances.append(distance)
        heading_away = len(distances) == 4 and all(b > a + 0.002 for a, b in zip(distances, list(distances)[1:]))
        if left[0] == 0 and heading_away and distance > 0.05:
            left[0] = 20
        if left[0] == 0:
            return None
        left[0] -= 1
        return guide(state)
    return rule


def success_flag_judge() -> Callable[[dict], bool]:
    """`robot.judge: roborl.robot.operators:success_flag_judge`: the twin's own success flag says whether a success
    the reward classifier claims is one (a person looking at the cell, on a real robot)."""
    def judge(obs):
        if "success" not in obs:
            raise UserError("robot.judge success_flag_judge reads the robot's success flag, which only the twin sends")
        return bool(obs["success"])
    return judge
