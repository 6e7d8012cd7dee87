"""Tasks on a robot cell without a simulator: what the embedded task computes for its state and success, from
the robot's proprioception alone (`robot.task` of a real-world RL run on a Franka). A task draws what an episode
needs (a goal) at `reset`, adds the task's part to the state (`state`, FrankaRobot's `task_state`) and judges
`success` on the observation; `TaskRobot` puts both on a `RobotInterface`. Tasks with objects need their poses
from a perception stack or a reward classifier (`robot.reward`), which are not here."""
from __future__ import annotations

import numpy as np

from roborl.robot.interface import RobotInterface
from roborl.tasks.reach import GOAL_HIGH, GOAL_LOW, SUCCESS_DIST


class Reach:
    """mujoco/Reach's goals (uniform in the same box) and success (the TCP within 2.5 cm), on a real arm. The
    gripper plays no part: it is held open, whatever the policy commands (as the embedded task's expert holds it),
    so an exploring policy does not send the gripper a command every period."""
    gripper_open = True

    def __init__(self) -> None:
        self.goal = np.mean([GOAL_LOW, GOAL_HIGH], 0)

    def reset(self, seed: int) -> None:
        self.goal = np.random.default_rng(seed).uniform(GOAL_LOW, GOAL_HIGH)

    def state(self, proprio: dict[str, np.ndarray]) -> np.ndarray:
        """The task's part of `state`, as the embedded task lays it out: the goal, then goal − TCP."""
        return np.r_[self.goal, self.goal - proprio["tcp"]]

    def success(self, obs: dict[str, np.ndarray]) -> bool:
        return bool(np.linalg.norm(obs["state"][-3:]) < SUCCESS_DIST)


class TaskRobot(RobotInterface):
    """A robot with a task: observations carry `success` and `episode_step` (as the twin's do), and `reset(seed)`
    starts the task's episode after the robot's own reset."""

    def __init__(self, robot: RobotInterface, task) -> None:
        self.robot, self.task = robot, task
        self.control_dt, self.clocked = robot.control_dt, robot.clocked
        self.episode_step = 0

    def connect(self) -> None:
        self.robot.connect()
        self.control_dt = self.robot.control_dt

    def observe(self) -> dict[str, np.ndarray]:
        obs = self.robot.observe()
        return {**obs, "success": self.task.success(obs), "episode_step": self.episode_step}

    def act(self, action: np.ndarray) -> None:
        if getattr(self.task, "gripper_open", False):
            action = np.r_[action[:-1], 1.0].astype(np.float32)
        self.robot.act(action)
        self.episode_step += 1

    def hold(self) -> None:
        self.robot.hold()
        self.episode_step += 1

    def clock(self) -> float:
        return self.robot.clock()

    def stop(self) -> None:
        self.robot.stop()

    def reset(self, seed: int = 0) -> dict[str, np.ndarray]:
        self.task.reset(seed)
        self.robot.reset()
        self.episode_step = 0
        return self.observe()

    def close(self) -> None:
        self.robot.close()
