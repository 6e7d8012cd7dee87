"""The ManiSkill3 backend on CPU (worker processes, SAPIEN rendering through Mesa's lavapipe Vulkan).
scripts/setup.sh installs mani-skill and the Vulkan driver, so these tests fail, not skip, without them."""
import pytest
import torch
from contract import check_vecenv_contract

from roborl import sim
from roborl.sim.maniskill_env import ManiSkillVecEnv


@pytest.fixture(scope="module")
def push():
    env = sim.make("maniskill/PushCube-v1", 2, seed=0)
    yield env
    env.close()


def test_pushcube_contract(push):
    assert isinstance(push, ManiSkillVecEnv) and push.max_episode_steps == 50
    assert push.observation_space["state"].shape == (35,) and push.action_dim == 8
    check_vecenv_contract(push, 55)
    scaling = push.action_scaling()  # what an exported policy's [-1, 1] commands: Panda's controller bounds
    low = [o - s for o, s in zip(scaling["offset"], scaling["scale"])]
    high = [o + s for o, s in zip(scaling["offset"], scaling["scale"])]
    assert low == pytest.approx([-0.1] * 7 + [-0.01]) and high == pytest.approx([0.1] * 7 + [0.04])
    assert scaling["units"] == ["arm: PDJointPosController"] * 7 + ["gripper: PDJointPosMimicController"]


def test_action_scaling_of_an_unnormalized_controller():
    """pd_joint_pos takes joint targets as they are (no normalization): [-1, 1] spans the joint limits once."""
    with sim.make("maniskill/PushCube-v1", 1, workers=0, control_mode="pd_joint_pos") as env:
        scaling = env.action_scaling()
        low = torch.tensor(scaling["offset"]) - torch.tensor(scaling["scale"])
        high = torch.tensor(scaling["offset"]) + torch.tensor(scaling["scale"])
        torch.testing.assert_close(low[:7], env._low[:7])
        torch.testing.assert_close(high[:7], env._high[:7])
        assert low[7].item() == pytest.approx(-0.01) and high[7].item() == pytest.approx(0.04)


def test_pickcube_contract():
    with sim.make("maniskill/PickCube-v1", 2, episode_length=10) as env:
        check_vecenv_contract(env, 12)
        workers = [w.proc for w in env._workers]
    assert workers and all(p.poll() is not None for p in workers), "close() left worker processes running"


def test_seeding_reproduces_every_episode(push):
    def run() -> tuple[torch.Tensor, torch.Tensor]:
        first = push.reset(seed=5)["state"]
        gen = torch.Generator().manual_seed(0)
        for _ in range(push.max_episode_steps):
            obs, *_ = push.step(torch.rand(2, push.action_dim, generator=gen) * 2 - 1)
        return first, obs["state"]  # the second episode's first observation

    first_a, second_a = run()
    first_b, second_b = run()
    torch.testing.assert_close(first_a, first_b)
    torch.testing.assert_close(second_a, second_b)
    assert not torch.allclose(first_a[0], first_a[1]), "envs of one batch must start differently"
    assert not torch.allclose(push.reset(seed=6)["state"], first_a)
    grouped = push.reset(seed=5, options={"group_size": 2})["state"]  # GRPO: one initial state per group
    torch.testing.assert_close(grouped[0], grouped[1])
    torch.testing.assert_close(grouped[0], first_a[0])


def test_truncation_reports_final_obs_and_episode(push):
    push.reset(seed=1)
    action = torch.zeros(2, push.action_dim)
    for t in range(push.max_episode_steps):
        obs, reward, term, trunc, info = push.step(action)
        assert reward.dtype == torch.float32 and (reward >= 0).all() and (reward <= 1).all()  # normalized_dense
        assert not term.any()  # ignore_terminations: only the time limit ends an episode
        assert trunc.all() == (t == push.max_episode_steps - 1)
    assert info["done"].all() and info["episode"]["length"].tolist() == [50, 50]
    assert set(info["episode"]) == {"return", "length", "success_once", "success_at_end"}
    assert not torch.allclose(info["final_obs"]["state"], obs["state"])
    torch.testing.assert_close(info["episode"]["success_at_end"], info["success"])


def test_rgb_observations_and_render():
    with sim.make("maniskill/PushCube-v1", 1, obs_mode="rgb", workers=0, render_size=(64, 64)) as env:
        obs = env.reset(seed=0)
        assert obs["rgb"].shape == (1, 64, 64, 3) and obs["rgb"].dtype == torch.uint8
        assert env.observation_space["rgb"].shape == (64, 64, 3)
        assert obs["rgb"].float().std() > 5, "the camera image is constant"
        obs, *_ = env.step(torch.ones(1, env.action_dim))
        frames = env.render()
        assert frames.shape == (1, 64, 64, 3) and frames.dtype == torch.uint8 and frames.float().std() > 5
        with pytest.raises(sim.SimError, match="could not make 'NoSuchTask-v1'"):
            sim.make("maniskill/NoSuchTask-v1", 1, workers=0)


def test_missing_mani_skill_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr("roborl.sim.maniskill_env.importlib.util.find_spec", lambda name: None)
    with pytest.raises(sim.SimError, match=r"pip install -e '\.\[maniskill\]'") as err:
        sim.make("maniskill/PushCube-v1", 1)
    assert "\n" not in str(err.value)
