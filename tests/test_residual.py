"""Residual RL: the composition starts at the base, the base gets no gradient, chunk bookkeeping holds
across resets, SAC's critic moves toward the Bellman target, and residual PPO / SAC fix a biased base."""
import json
import os

import pytest
import torch
from helpers import roborl_in_process
from torch.distributions import Normal, TanhTransform, TransformedDistribution

from roborl import sim, tasks
from roborl.algos.sac import SAC, exploration_prob
from roborl.builder import build
from roborl.config import SACConfig, config_from_dict
from roborl.errors import UserError
from roborl.policies import ResidualPolicy
from roborl.policies.gaussian import squashed_log_prob
from roborl.replay import ReplayBuffer
from roborl.runner import Runner
from roborl.sim.base_action import BaseActionEnv
from roborl.tasks.expert import ImperfectExpert

# A biased Reach expert (≈ 0% success: it stops 4 cm off the goal); residual.scale 1 can cancel the bias.
BIASED_REACH = {"env": {"id": "mujoco/Reach", "num_envs": 32},
                "policy": {"kind": "residual", "hidden": [64, 64]},
                "residual": {"base": "expert", "base_bias": [1.0, 1.0, 0.0, 0.0], "scale": 1.0},
                "train": {"progress": False, "video": False, "eval_episodes": 32, "device": "cpu"}}


SAC_REACH = ["train.algorithm=sac", "policy.activation=relu", "sac.critic_hidden=[64, 64]", "env.num_envs=8",
             "train.total_steps=8000", "train.rollout_steps=50", "train.eval_every=4", "sac.seed_steps=800",
             "sac.progressive_steps=1600", "sac.utd_ratio=0.5"]


def test_residual_starts_exactly_at_the_base():
    raw = sim.make("mujoco/PickPlace", 8, seed=0)
    env = BaseActionEnv(raw, ImperfectExpert(tasks.EXPERTS["mujoco/PickPlace"](raw), [0.2, 0.0, 0.0, 0.0], noise=0.3))
    policy = ResidualPolicy(raw.observation_space["state"].shape[0], raw.action_dim, scale=0.3)
    obs = env.reset(seed=0)
    for _ in range(20):
        act = policy.act(obs, deterministic=True)
        assert torch.equal(act.action, obs["base_action"])  # residual's last layer is zero at step 0
        obs, *_ = env.step(act.action)
    stochastic = policy.act(obs)
    assert not torch.equal(stochastic.action, obs["base_action"])
    assert ((stochastic.action - obs["base_action"]).abs() <= 0.3 + 1e-6).all()  # bounded by the scale


def test_squashed_log_prob_matches_torch_tanh_transform():
    policy = ResidualPolicy(5, 3, scale=0.2, state_std=True)
    torch.nn.init.normal_(policy.actor[-1].weight, std=0.1)
    obs = {"state": torch.randn(64, 5), "base_action": torch.rand(64, 3) * 2 - 1}
    with torch.no_grad():
        d = policy.distribution(policy.features(obs))
    dist = Normal(d.mean.double(), d.stddev.double())  # float64: atanh(tanh(u)) stays accurate
    u = dist.sample()
    reference = TransformedDistribution(Normal(dist.mean, dist.stddev), [TanhTransform()])
    keep = u.abs().max(-1).values < 6  # atanh(tanh(u)) is exact only away from saturation
    expected = reference.log_prob(torch.tanh(u)).sum(-1)
    assert keep.sum() > 50
    torch.testing.assert_close(squashed_log_prob(dist, u)[keep], expected[keep], atol=1e-6, rtol=1e-6)


def _checkpoint_base(tmp_path):
    """A trained-format checkpoint of a chunked flow policy on Reach (BC-style base)."""
    from roborl.checkpoint import save_checkpoint
    from roborl.config import config_to_dict

    cfg = config_from_dict({"env": {"id": "mujoco/Reach", "action_chunk": 2, "obs_history": 2},
                            "policy": {"kind": "flow", "horizon": 4, "hidden": [32, 32], "steps": 2}})
    env, policy = build(cfg, torch.device("cpu"))
    path = tmp_path / "base.safetensors"
    save_checkpoint(path, policy, None, config_to_dict(cfg), {})
    return path


def test_gradients_never_reach_the_base(tmp_path):
    path = _checkpoint_base(tmp_path)
    cfg = config_from_dict({"env": {"id": "mujoco/Reach", "num_envs": 8}, "policy": {"kind": "residual", "hidden": [32]},
                            "residual": {"base": str(path), "scale": 0.2}, "train": {"device": "cpu"}})
    env, policy = build(cfg, torch.device("cpu"))
    single = sim.make("mujoco/Reach", 1).observation_space["state"].shape[0]
    assert env.execute == 2 and env.observation_space["state"].shape[0] == 2 * single
    base = env.base.__closure__[0].cell_contents  # the frozen flow policy inside the base callable
    before = {k: v.clone() for k, v in base.state_dict().items()}
    obs = env.reset(seed=0)
    assert not obs["base_action"].requires_grad
    act = policy.act(obs)
    log_prob, entropy, value = policy.evaluate(obs, act)
    (log_prob.mean() + value.mean() + policy.bc_regularizer(obs, act)).backward()
    assert all(p.grad is None and not p.requires_grad for p in base.parameters())
    assert any(p.grad is not None for p in policy.parameters())
    env.step(act.action)
    assert all(torch.equal(v, base.state_dict()[k]) for k, v in before.items())


def test_a_checkpoint_base_serves_another_task_with_the_same_spaces(tmp_path):
    """A VLA-style base trained on the mixed LangTabletop tasks corrects (and is evaluated) on one of them;
    a task whose observations differ is refused in one line."""
    from roborl.checkpoint import save_checkpoint
    from roborl.config import config_to_dict

    base_cfg = config_from_dict({"env": {"id": "mujoco/LangTabletopFixed-ReachPushLift", "obs_mode": "state"},
                                 "policy": {"kind": "gaussian", "hidden": [16]}})
    _, base = build(base_cfg, torch.device("cpu"))
    path = tmp_path / "base.safetensors"
    save_checkpoint(path, base, None, config_to_dict(base_cfg), {})
    residual = {"policy": {"kind": "residual", "hidden": [16]}, "residual": {"base": str(path)}}
    env, _ = build(config_from_dict({"env": {"id": "mujoco/LangTabletopFixed-Push", "obs_mode": "state", "num_envs": 2},
                                     **residual}), torch.device("cpu"))
    assert env.reset(seed=0)["base_action"].shape == (2, 4)
    with pytest.raises(UserError, match=r"trained on mujoco/LangTabletopFixed-ReachPushLift \(state \(\d+,\).*"
                                        r"mujoco/Reach has state"):
        build(config_from_dict({"env": {"id": "mujoco/Reach"}, **residual}), torch.device("cpu"))


def test_a_residual_on_an_image_env_sees_the_image_and_its_critic_the_privileged_state(tmp_path):
    """A base that reads the camera gets a residual that reads it too (its own CNN), and with env.critic_state
    the residual's critic reads the privileged state, which a frozen base trained without it ignores."""
    from roborl.checkpoint import save_checkpoint
    from roborl.config import config_to_dict

    base_cfg = config_from_dict({"env": {"id": "mujoco/LangTabletopFixed-Push", "obs_mode": "rgb"},
                                 "policy": {"kind": "gaussian", "hidden": [16]}})
    _, base = build(base_cfg, torch.device("cpu"))
    path = tmp_path / "base.safetensors"
    save_checkpoint(path, base, None, config_to_dict(base_cfg), {})
    cfg = {"env": {"id": "mujoco/LangTabletopFixed-Push", "obs_mode": "rgb", "num_envs": 2, "critic_state": True},
           "policy": {"kind": "residual", "hidden": [16]}, "residual": {"base": str(path)}}
    env, policy = build(config_from_dict(cfg), torch.device("cpu"))
    obs = env.reset(seed=0)
    torch.nn.init.normal_(policy.actor[-1].weight, std=1.0)
    dark = {**obs, "rgb": torch.zeros_like(obs["rgb"])}
    with torch.no_grad():
        assert not torch.allclose(policy.act(obs, True).action, policy.act(dark, True).action)
        moved = {**obs, "critic_state": obs["critic_state"] + 1}
        assert not torch.allclose(policy.value(obs), policy.value(moved))
        unseen = {k: v for k, v in obs.items() if k != "critic_state"}
        assert torch.isnan(policy.value(unseen)).all()  # no privileged state, no plausible value
        assert torch.equal(policy.act(unseen, True).action, policy.act(obs, True).action)  # the actor never reads it
    with pytest.raises(UserError, match="env.critic_state is read by PPO's value head"):
        build(config_from_dict({**cfg, "train": {"algorithm": "sac"}, "sac": {"buffer_size": 1000}}),
              torch.device("cpu"))


class CountingChunkBase:
    """Chunks whose action encodes (call number, index in chunk); records resets."""

    def __init__(self, num_envs, action_dim, horizon):
        self.calls = torch.zeros(num_envs)
        self.shape = (num_envs, horizon, action_dim)
        self.resets = []

    def __call__(self, obs):
        self.calls += 1
        chunk = torch.zeros(self.shape)
        chunk[..., 0] = self.calls[:, None] / 100
        chunk[..., 1] = torch.arange(self.shape[1]) / 10
        return chunk

    def reset(self, mask=None):
        self.resets.append(None if mask is None else mask.clone())


def test_chunked_base_runs_open_loop_and_restarts_at_episode_ends():
    raw = sim.make("mujoco/Reach", 4, seed=0, episode_length=5)  # 5 is not a multiple of the chunk
    base = CountingChunkBase(4, raw.action_dim, horizon=4)
    env = BaseActionEnv(raw, base, execute=3)
    obs = env.reset(seed=0)
    seen = [obs["base_action"][0, :2].tolist()]
    for step in range(9):
        obs, _, term, trunc, info = env.step(torch.zeros(4, raw.action_dim))
        seen.append(obs["base_action"][0, :2].tolist())
        if step == 4:
            assert (term | trunc).all() and base.resets[-1].all()
            assert torch.equal(info["final_obs"]["base_action"][:, 1], torch.full((4,), 0.1))  # last executed: index 1
    # call 1: steps 0-2, call 2: steps 3-4 (episode ends after step 4), call 3: steps 5-7, call 4: 8-9
    calls = [round(s[0] * 100) for s in seen]
    index = [round(s[1] * 10) for s in seen]
    assert calls == [1, 1, 1, 2, 2, 3, 3, 3, 4, 4], calls
    assert index == [0, 1, 2, 0, 1, 0, 1, 2, 0, 1], index
    assert base.resets[0] is None  # env.reset resets the base


def test_base_with_wrong_shape_is_refused():
    raw = sim.make("mujoco/Reach", 2, seed=0)
    with pytest.raises(sim.SimError, match="expected N×A or N×H×A"):
        BaseActionEnv(raw, lambda obs: torch.zeros(2, 7)).reset()


def test_sac_critic_moves_toward_the_bellman_target():
    torch.manual_seed(0)
    policy = ResidualPolicy(3, 2, scale=0.5, state_std=True, critic=False, normalize_obs=False)
    sac = SAC(policy, 5, 2, SACConfig(lr=1e-3, gamma=0.9, init_alpha=0.1), torch.device("cpu"))
    obs = {"state": torch.randn(128, 3), "base_action": torch.zeros(128, 2)}
    next_obs = {"state": torch.randn(128, 3), "base_action": torch.zeros(128, 2)}
    batch = {"obs": obs, "next_obs": next_obs, "action": torch.rand(128, 2) - 0.5,
             "reward": torch.randn(128), "terminated": (torch.rand(128) < 0.5).float()}
    loss0, target0 = sac.critic_loss(batch)
    # the target is r + γ(1 − d)(min Q_target(s', a') − α log π(a'|s')): check it against its definition
    torch.manual_seed(1)
    _, target_a = sac.critic_loss(batch)
    torch.manual_seed(1)
    a2, logp2, _ = policy.sample(next_obs)
    q1, q2 = sac.target(policy.features(next_obs), a2)
    expected = batch["reward"] + 0.9 * (1 - batch["terminated"]) * (torch.min(q1, q2) - sac.alpha * logp2)
    torch.testing.assert_close(target_a, expected.detach())
    for _ in range(300):
        sac.update(batch)
    loss1, _ = sac.critic_loss(batch)
    assert loss1 < 0.1 * loss0, (float(loss0), float(loss1))
    terminal = batch["terminated"] > 0  # terminal transitions: Q(s, a) → r exactly
    q1, _ = sac.critic(policy.features(obs), batch["action"])
    assert (q1[terminal] - batch["reward"][terminal]).abs().mean() < 0.1


def test_replay_buffer_wraps_and_keeps_final_obs():
    buf = ReplayBuffer(10, torch.device("cpu"))
    for i in range(4):
        obs = {"state": torch.full((4, 2), float(i))}
        buf.add(obs, torch.full((4, 1), float(i)), torch.full((4,), float(i)), {"state": obs["state"] + 0.5},
                torch.zeros(4, dtype=torch.bool))
    assert len(buf) == 10 and buf.pos == 6
    batch = buf.sample(64, torch.Generator().manual_seed(0))
    torch.testing.assert_close(batch["next_obs"]["state"], batch["obs"]["state"] + 0.5)
    assert set(batch["action"].flatten().tolist()) <= {1.0, 2.0, 3.0}  # step 0 (and half of 1) overwritten


def test_progressive_exploration_schedule():
    cfg = config_from_dict({**BIASED_REACH, "train": {**BIASED_REACH["train"], "algorithm": "sac", "run_dir": "/tmp/unused"},
                            "sac": {"seed_steps": 100, "progressive_steps": 1000}})
    probs = [exploration_prob(cfg.sac, collected) for collected in (0, 99, 100, 600, 1100, 5000)]
    assert probs == [0.0, 0.0, 0.0, 0.5, 1.0, 1.0]


def test_residual_config_errors(tmp_path):
    bad = [({"policy": {"kind": "residual"}}, "residual.base"),
           ({"policy": {"kind": "residual"}, "residual": {"base": "expert", "inputs": "rgb"}}, "residual.inputs"),
           ({"policy": {"kind": "residual"}, "residual": {"base": "expert", "base_bias": [1.0]}}, "4 values"),
           ({"policy": {"kind": "residual"}, "residual": {"base": "no_such_module:f"}}, "cannot import"),
           ({"policy": {"kind": "residual"}, "residual": {"base": str(tmp_path / "act")}},
            "does not exist: train the base first"),
           ({"env": {"controller": "joint_pos"}, "policy": {"kind": "residual"}, "residual": {"base": "expert"}},
            "ee_delta_pos"),
           ({"env": {"id": "mujoco/PickPlace"}, "policy": {"kind": "residual"},
             "residual": {"base": str(_checkpoint_base(tmp_path))}}, "trained on mujoco/Reach")]
    for data, message in bad:
        with pytest.raises(UserError, match=message):
            build(config_from_dict(data), torch.device("cpu"))
    with pytest.raises(UserError, match="sac trains residual and gaussian policies"):
        Runner(config_from_dict({"policy": {"kind": "diffusion"}, "train": {"algorithm": "sac", "run_dir": str(tmp_path)}}))
    with pytest.raises(UserError, match="sac.crm needs a reward machine"):
        Runner(config_from_dict({**BIASED_REACH, "train": {"algorithm": "sac", "run_dir": str(tmp_path)},
                                       "sac": {"crm": True}}))
    with pytest.raises(UserError, match="available: ppo, sac"):
        Runner(config_from_dict({"train": {"algorithm": "td3"}}))


def _run(tmp_path, name, overrides):
    import yaml

    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(BIASED_REACH))
    proc = roborl_in_process("train", str(path), f"train.run_dir={tmp_path}", f"train.name={name}", *overrides)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((tmp_path / name / "summary.json").read_text())


@pytest.mark.learning
def test_residual_ppo_fixes_a_biased_base(tmp_path):
    s = _run(tmp_path, "ppo", ["train.total_steps=64000", "train.eval_every=10", "algo.lr=1e-3"])
    base_success, final = s["eval_history"][0][2], s["success_rate"]
    assert s["eval_history"][0][0] == 0 and base_success <= 0.2, s["eval_history"]
    assert final >= 0.8, s["eval_history"]


@pytest.mark.learning
def test_residual_sac_fixes_a_biased_base(tmp_path):
    s = _run(tmp_path, "sac", SAC_REACH)
    base_success, final = s["eval_history"][0][2], s["success_rate"]
    assert base_success <= 0.2 and final >= 0.8, s["eval_history"]


def test_sac_resumed_after_sigkill_continues_from_its_checkpoint(tmp_path):
    """SAC killed mid-run: `resume=` restores the critics, target critics, temperature, optimizers, replay
    and counters exactly, and the resumed run finishes the budget with every transition in its replay (half the
    learning budget of test_residual_sac_fixes_a_biased_base: that one checks the learning)."""
    import signal
    import subprocess
    import sys
    import time

    import yaml
    from helpers import ROOT
    from test_training import checkpoint_iteration

    from roborl.checkpoint import Checkpoint
    from roborl.config import load_config

    path = tmp_path / "sac.yaml"
    path.write_text(yaml.safe_dump(BIASED_REACH))
    last = tmp_path / "sac" / "checkpoints" / "last.safetensors"
    proc = subprocess.Popen([sys.executable, "-m", "roborl.cli", "train", str(path), f"train.run_dir={tmp_path}",
                             "train.name=sac", "train.save_every=1", *SAC_REACH, "train.total_steps=4000"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while checkpoint_iteration(last) < 4 and time.time() < deadline:  # seeding ended at iteration 2
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    ckpt = Checkpoint(last)
    killed_at = ckpt.trainer_state["iteration"]
    assert 4 <= killed_at < 10, killed_at
    state = ckpt.algo_state
    assert state["updates"] > 0 and state["replay"]["size"] == killed_at * 400 == state["collected"]

    runner = Runner(load_config(None, [f"resume={last}", "train.progress=false"]))
    sac = runner.algo
    assert runner.iteration == killed_at and runner.env_steps == killed_at * 400
    for name, value in sac.critic.state_dict().items():
        assert torch.equal(value, state["critic"][name]), name
    for name, value in sac.target.state_dict().items():
        assert torch.equal(value, state["target"][name]), name
    assert torch.equal(sac.log_alpha.detach(), state["log_alpha"]) and sac.updates == state["updates"]
    assert len(sac.replay) == state["replay"]["size"] and sac.replay.pos == state["replay"]["pos"]
    torch.testing.assert_close(sac.replay.data["action"][:len(sac.replay)], state["replay"]["data"]["action"])
    assert sac.critic_opt.state_dict()["state"][0]["exp_avg"].equal(state["critic_opt"]["state"][0]["exp_avg"])
    runner.close()

    done = roborl_in_process("train", f"resume={last}", "train.progress=false")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "sac" / "summary.json").read_text())
    assert summary["env_steps"] == 4000 and summary["iterations"] == 10
    final = Checkpoint(last).algo_state
    assert final["replay"]["size"] == final["collected"] == 4000 and final["updates"] == 0.5 * (4000 - 800)
    torch.testing.assert_close(final["replay"]["data"]["action"][:len(sac.replay)], state["replay"]["data"]["action"])
