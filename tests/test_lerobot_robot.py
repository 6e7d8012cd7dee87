"""A roborl policy driving a LeRobot robot through the bridge: `lerobot-robot-dummy` (a LeRobot plugin robot
that needs no hardware, discovered through LeRobot's own `make_robot_from_config`) receives, feature by
feature, exactly the commands the exported policy computes for the state the bridge observed."""
import numpy as np
import pytest
from deploy_helpers import exported_artifact
from lerobot.robots.utils import make_robot_from_config
from lerobot_robot_dummy import DummyFollowerConfig

from roborl.deploy.artifact import Artifact
from roborl.deploy.client import PolicyClient
from roborl.deploy.server import start_server
from roborl.robot import ControlLoop
from roborl.robot.control_loop import client_policy
from roborl.robot.lerobot_bridge import LeRobotBridgeError, LeRobotRobot

JOINTS = [f"joint_{i}" for i in range(1, 8)] + ["gripper"]
GOAL = np.array([0.6, 0.1, 0.2])


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return exported_artifact(tmp_path_factory, "joint_reach")


def reach_state(obs: dict) -> np.ndarray:
    """The Reach policy's state from the robot's joint positions (velocities and TCP unknown to this robot)."""
    q = np.array([obs[f"{j}.pos"] for j in JOINTS[:7]])
    return np.r_[q, np.zeros(7), 10 * obs["gripper.pos"], np.zeros(3), GOAL, GOAL]


def recorded(robot) -> list[dict]:
    """What the robot's own send_action receives, kept (the robot still gets every call)."""
    sent, send = [], robot.send_action
    robot.send_action = lambda action: sent.append(dict(action)) or send(action)
    return sent


def test_a_served_policy_drives_a_lerobot_robot_with_the_exported_commands(artifact):
    robot = make_robot_from_config(DummyFollowerConfig(silent=True, motor_names=JOINTS))
    sent = recorded(robot)
    server, uri = start_server(artifact)
    client = PolicyClient(uri)
    try:
        bridge = LeRobotRobot(robot, client.metadata, state_fn=reach_state)
        bridge.connect()
        report = ControlLoop(bridge, client_policy(client), client.metadata).run(10)
        assert report.reason == "done" and report.steps == 10, report.detail
        assert len(sent) == 10 and list(sent[0]) == [f"{j}.pos" for j in JOINTS]
        expected = Artifact(artifact)({"state": reach_state(robot.get_observation())[None].astype(np.float32)})
        np.testing.assert_allclose([sent[-1][f"{j}.pos"] for j in JOINTS], expected["command"][0, 0], atol=1e-5)
        assert np.ptp([list(a.values()) for a in sent], axis=0).max() == 0  # the dummy's state never changes
        bridge.close()
        assert not robot.is_connected
    finally:
        server.kill()
        client.close()


def test_a_stop_holds_the_observed_pose_and_refuses_actions(artifact):
    robot = make_robot_from_config(DummyFollowerConfig(silent=True, motor_names=JOINTS))
    sent = recorded(robot)
    metadata = Artifact(artifact).metadata
    bridge = LeRobotRobot(robot, metadata, state_fn=reach_state)
    bridge.connect()
    loop = ControlLoop(bridge, lambda obs: np.ones((1, 8), np.float32), metadata)
    loop.run(3)
    loop.estop()
    assert sent[-1] == {f"{j}.pos": 0.0 for j in JOINTS}  # the positions the robot reported
    assert sent[-2] == bridge.command(np.ones(8)) and sent[-2] != sent[-1]
    with pytest.raises(LeRobotBridgeError, match="stopped"):
        bridge.act(np.zeros(8))
    bridge.reset()
    bridge.act(np.zeros(8))
    assert sent[-1] == bridge.command(np.zeros(8))


def test_what_does_not_fit_is_one_line_that_says_how_to_fix_it(artifact):
    metadata = Artifact(artifact).metadata
    six_joints = make_robot_from_config(DummyFollowerConfig(silent=True))  # SO-101-like: 6 motors with the gripper
    with pytest.raises(LeRobotBridgeError, match=r"commands 8 values .* takes 7 .* pass action_keys"):
        LeRobotRobot(six_joints, metadata)
    with pytest.raises(LeRobotBridgeError, match="no action features \\['elbow.pos'\\]"):
        LeRobotRobot(six_joints, metadata, action_keys=["elbow.pos"] * 8)
    with pytest.raises(LeRobotBridgeError, match="sees images: pass camera="):
        LeRobotRobot(make_robot_from_config(DummyFollowerConfig(silent=True, motor_names=JOINTS)),
                     {**metadata, "observation": {**metadata["observation"], "rgb": {}}})
