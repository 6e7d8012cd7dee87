"""Human interventions against the MuJoCo twin: a scripted operator takes over from the policy during part of
each episode; the loop executes the operator's actions and marks them in the transitions it records; the learner
samples its online and its demonstration buffer 50/50."""
import itertools

import numpy as np
import pytest
import torch
from deploy_helpers import running_twin

from roborl.replay import ReplayBuffer, sample_mixed
from roborl.robot import ControlLoop
from roborl.robot.hil import TransitionRecorder
from roborl.robot.teleop import ScriptedOperator
from roborl.robot.twin import TwinRobot

METADATA = {"env": {"control_dt": 0.05}, "action": {"chunk": 1}, "observation": {"state": {}}, "shields": {"specs": []}}
TO_GOAL = slice(21, 24)  # Reach's state ends with the goal and the TCP's offset to it


@pytest.fixture(scope="module")
def twin():
    yield from running_twin("mujoco/Reach")


def steer_to_goal():
    """An operator who steps in at the 11th period, drives the TCP toward the goal for 15, then lets go."""
    periods = itertools.count()

    def rule(obs):
        if not 10 <= next(periods) < 25:
            return None
        offset = obs["state"][TO_GOAL]
        return np.r_[offset / max(np.linalg.norm(offset), 0.04), 1.0]
    return rule


def test_an_intervention_segment_is_recorded_with_the_operators_actions(twin):
    robot = TwinRobot(twin)
    robot.connect()
    start = robot.reset(seed=0)
    operator = ScriptedOperator(steer_to_goal())
    recorder = TransitionRecorder(success_fn=lambda obs: False)  # no success: all 40 steps are one episode
    policy = lambda obs: np.array([[0.0, 0.0, 0.0, 1.0]], np.float32)  # noqa: E731 (a policy that stays put)
    loop = ControlLoop(robot, policy, METADATA, teleop=operator, on_step=recorder.record)
    report = loop.run(40)
    final = robot.observe()
    recorder.end_episode(final, loop.policy_obs(final))
    robot.close()
    rows, episodes = recorder.take()

    assert report.reason == "done" and report.interventions == operator.takeovers == 15
    assert len(rows["reward"]) == 40 and episodes == [{"return": 0.0, "length": 40, "interventions": 15, "success": 0.0}]
    moved = np.abs(rows["action"][:, :3]).sum(1) > 0  # the policy commands no motion; the operator does
    assert rows["intervened"].tolist() == moved.tolist() == [10 <= t < 25 for t in range(40)]
    assert np.array_equal(rows["next_obs"]["state"][:39], rows["obs"]["state"][1:])  # consecutive steps chain
    start_distance = np.linalg.norm(start["state"][TO_GOAL])
    assert np.linalg.norm(rows["next_obs"]["state"][24, TO_GOAL]) < start_distance - 0.1  # it moved the arm


def test_rlpd_sampling_takes_half_the_batch_from_each_buffer():
    def filled(n: int, tag: float) -> ReplayBuffer:
        buf = ReplayBuffer(1000, torch.device("cpu"))
        obs = {"state": torch.full((n, 3), tag)}
        buf.add(obs, torch.full((n, 2), tag), torch.zeros(n), obs, torch.zeros(n))
        return buf

    online, demos = filled(900, 0.0), filled(20, 1.0)  # few demonstrations, much online data
    batch = sample_mixed(online, demos, 256, generator=torch.Generator().manual_seed(0))
    assert batch["action"].shape == (256, 2) and batch["obs"]["state"].shape == (256, 3)
    assert int(batch["action"][:, 0].sum()) == 128  # exactly half from the demonstrations
    empty = ReplayBuffer(1000, torch.device("cpu"))
    assert int(sample_mixed(online, empty, 64)["action"].sum()) == 0  # all online until there are demonstrations
