"""`env.proprio_only`: a policy that sees what a robot without a perception stack has, the arm's proprioception
and the camera. The state is the arm's part of the task's state; the twin also sends the task's full state for
the scripted operator standing in for the person who watches the cell; demonstrations are recorded the same way,
and SAC's demonstration buffer refuses states of another layout in one line."""
import json

import numpy as np
import pytest
import torch
import yaml
from deploy_helpers import exported_artifact
from helpers import ROOT, roborl, roborl_in_process

from roborl import sim, tasks  # noqa: F401  (registers the embedded tasks)
from roborl.builder import build
from roborl.checkpoint import Checkpoint
from roborl.config import load_config
from roborl.deploy.client import PolicyClient
from roborl.deploy.server import start_server
from roborl.errors import UserError
from roborl.robot.episodes import run_episodes
from roborl.robot.operators import CUBE, TCP, push_operator
from roborl.robot.twin import TwinRobot, TwinSettings, start_twin
from roborl.sim.errors import SimError

ARM = 18  # joint positions and velocities, gripper opening, TCP position


@pytest.mark.parametrize("task", ["mujoco/Reach", "mujoco/Push", "mujoco/PickPlace", "mujoco/Stack"])
def test_the_state_is_the_arm_part_of_the_tasks_state(task):
    full = sim.make(task, 4, seed=1)
    arm = sim.make(task, 4, seed=1, proprio_only=True)
    assert arm.observation_space["state"].shape == (ARM,)
    a, f = arm.reset(seed=1), full.reset(seed=1)
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):
        assert torch.equal(a["state"], f["state"][:, :ARM])
        assert torch.equal(arm.task_state(), f["state"])  # the objects are still simulated, only not observed
        action = torch.rand(4, arm.action_dim, generator=generator) * 2 - 1
        a, f = arm.step(action)[0], full.step(action)[0]
    full.close()
    arm.close()


def test_what_has_no_single_arm_refuses_it_in_one_line(tmp_path):
    with pytest.raises(SimError, match="TwoArmReachEnv has no single arm whose proprioception could be the state"):
        sim.make("mujoco/TwoArmReach", 2, proprio_only=True)
    with pytest.raises(UserError, match="env.proprio_only works on the embedded mujoco/ arm tasks, not gym/Pusher-v5"):
        build(load_config(ROOT / "configs" / "ppo_gym_pusher.yaml", ["env.proprio_only=true"]), torch.device("cpu"))


def test_the_twin_sends_the_arm_state_and_the_operator_still_sees_the_cube():
    proc, uri = start_twin(TwinSettings(env_id="mujoco/Push", proprio_only=True, camera="front"))
    robot = TwinRobot(uri)
    try:
        robot.connect()
        robot.reset(seed=3)
        obs = robot.observe()
    finally:
        robot.close()
        proc.kill()
    assert obs["state"].shape == (ARM,) and obs["task_state"].shape == (34,) and obs["rgb"].shape == (64, 64, 3)
    np.testing.assert_allclose(obs["task_state"][:ARM], obs["state"], atol=1e-6)
    # the operator takes over when the TCP heads away from the cube: from the task's state, as a person sees it
    full, proprio = push_operator(), push_operator()
    state = np.array(obs["task_state"], np.float32)
    commands = []
    for step in range(6):
        state[TCP] = state[CUBE] + [0.06 + 0.01 * step, 0, 0.05]  # moving away, more than 5 cm off
        commands.append((full({"state": state, "episode_step": step}),
                         proprio({"state": state[:ARM], "task_state": state, "episode_step": step})))
    assert all(a is None for a, _ in commands[:3]) and commands[3][0] is not None
    assert all((a is None and b is None) or np.array_equal(a, b) for a, b in commands)


def test_roborl_twin_serves_a_proprio_only_policy_the_state_it_was_trained_on(tmp_path_factory):
    """The exported policy's metadata says its state is the arm's alone, and `roborl twin` starts its twin so."""
    artifact = exported_artifact(tmp_path_factory, "proprio_rgb")
    server, uri = start_server(artifact)
    try:
        proc = roborl("twin", uri, "--episodes", "1")
    finally:
        server.kill()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["episodes"] == 1


def test_a_robot_that_sends_another_state_than_the_policy_reads_is_one_line(tmp_path_factory):
    """A twin of the task's full state driving the proprio-only policy: the server rejects every request, and
    the episodes end with the reason, not a traceback over statistics of no round trip."""
    server, uri = start_server(exported_artifact(tmp_path_factory, "proprio_rgb"))
    proc, twin_uri = start_twin(TwinSettings(env_id="mujoco/Push", camera="front", render_size=(48, 48)))
    robot, client = TwinRobot(twin_uri), PolicyClient(uri)
    try:
        robot.connect()
        with pytest.raises(UserError, match=r"the policy answered no request \(episode 0: policy_rejected "
                                            r"obs\['state'\] must have shape \[18\]"):
            run_episodes(robot, client, 1)
    finally:
        robot.close()
        client.close()
        proc.kill()
        server.kill()


def test_sac_trains_on_images_and_proprio_demos_and_refuses_full_state_ones(tmp_path):
    for name, flags in (("proprio", ["--rgb", "--size", "48", "--proprio-only"]), ("full", ["--rgb", "--size", "48"])):
        proc = roborl_in_process("demos", "Push", "--episodes", "2", "--envs", "2", "--out", str(tmp_path / name),
                                 "--quiet", *flags)
        assert proc.returncode == 0, proc.stderr[-2000:]
    config = tmp_path / "sac_images.yaml"
    config.write_text(yaml.safe_dump({
        "env": {"id": "mujoco/Push", "num_envs": 2, "obs_mode": "rgb", "render_size": [48, 48], "proprio_only": True},
        "policy": {"kind": "gaussian", "hidden": [32, 32]},
        "train": {"algorithm": "sac", "total_steps": 60, "rollout_steps": 10, "eval_every": 100, "eval_episodes": 2,
                  "eval_envs": 2, "video": False, "progress": False, "run_dir": str(tmp_path / "runs"), "threads": 1},
        "sac": {"buffer_size": 2000, "seed_steps": 20, "batch_size": 32}}))
    proc = roborl_in_process("train", str(config), f"sac.demos={tmp_path / 'proprio'}", "train.name=ok")
    assert proc.returncode == 0, proc.stderr[-2000:]
    ckpt = Checkpoint(tmp_path / "runs" / "ok" / "checkpoints" / "last.safetensors")
    assert ckpt.policy_state["normalizer.mean"].shape == (ARM,)  # the policy reads the arm's state beside its images
    proc = roborl_in_process("train", str(config), f"sac.demos={tmp_path / 'full'}", "train.name=bad")
    refusal = [f"roborl: error: demonstrations '{tmp_path / 'full'}' have 34-dim states but the env's have 18: record "
               "them with this env's settings (roborl demos --proprio-only for env.proprio_only)"]
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == refusal, proc.stderr[-2000:]
    assert not (tmp_path / "runs" / "bad").exists()
    proc = roborl_in_process("bc", str(ROOT / "configs" / "bc_flow_push.yaml"), f"bc.demos={tmp_path / 'full'}",
                             "env.proprio_only=true", f"train.run_dir={tmp_path / 'runs'}", "train.name=bc")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == refusal, proc.stderr[-2000:]  # BC's the same
    assert not (tmp_path / "runs" / "bc").exists()
