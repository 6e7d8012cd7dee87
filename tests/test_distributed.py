"""Several learner processes (resources.learners) and torch.compile of the hot paths (resources.compile)."""
import copy
import json

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from helpers import ROOT, roborl, roborl_in_process

from roborl import compiling
from roborl.algos.advantages import gae
from roborl.algos.ppo import PPO
from roborl.buffer import RolloutBuffer
from roborl.compiling import maybe_compile
from roborl.config import PPOConfig
from roborl.learners import LearnerComm, free_port
from roborl.policies import GaussianActorCritic
from roborl.sim.batch import take

REACH = str(ROOT / "configs" / "ppo_reach.yaml")


def rollout_batch() -> tuple[GaussianActorCritic, dict]:
    """A policy and a flat batch of 2 × 16 rows whose halves differ (so that per-half advantage
    statistics would give other gradients), collected by an earlier version of the policy."""
    torch.manual_seed(0)
    policy = GaussianActorCritic(5, 2, [16, 16])
    buf = RolloutBuffer(8, 4, torch.device("cpu"))
    for _t in range(8):
        obs = {"state": torch.randn(4, 5) + torch.tensor([0.0, 0.0, 3.0, 3.0])[:, None]}
        with torch.no_grad():
            act = policy.act(obs)
        buf.add(obs, act, torch.randn(4) + torch.arange(4.0), torch.rand(4) < 0.2)
    buf.finish(torch.randn(4), 0.9, 0.95)
    policy.update_normalizer(buf.obs)
    with torch.no_grad():  # the policy moved since: ratios leave the clip range
        for p in policy.parameters():
            p.add_(0.3 * torch.randn_like(p))
    data = buf.flat()
    order = torch.argsort(torch.arange(32) % 4, stable=True)  # envs 0-1 first, then envs 2-3
    return policy, take(data, order)


def gradients(ppo: PPO, mb: dict) -> list[torch.Tensor]:
    ppo.optimizer.zero_grad()
    loss, _ = ppo.minibatch_loss(mb)
    ppo.backward(loss)
    return [p.grad.clone() for p in ppo.params]


def learner(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        policy, data = rollout_batch()
        cfg = PPOConfig(clip=0.1)
        single = gradients(PPO(copy.deepcopy(policy), cfg), data)
        comm = LearnerComm(torch.device("cpu"))
        shared = gradients(PPO(policy, cfg, comm=comm), take(data, torch.arange(16 * rank, 16 * (rank + 1))))
        for a, b in zip(shared, single):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
        alone = gradients(PPO(copy.deepcopy(policy), cfg), take(data, torch.arange(16 * rank, 16 * (rank + 1))))
        assert not all(torch.allclose(a, b, atol=1e-4) for a, b in zip(alone, single))
        task = torch.arange(32) % 3  # the halves hold the tasks in other proportions
        half = torch.arange(16 * rank, 16 * (rank + 1))
        by_task, std = PPO(policy, cfg).normalize_advantages_by_task(data["advantages"], task)
        shared_by_task, shared_std = PPO(policy, cfg, comm=comm).normalize_advantages_by_task(data["advantages"][half],
                                                                                             task[half])
        torch.testing.assert_close(shared_by_task, by_task[half])
        torch.testing.assert_close(shared_std, std)
    finally:
        dist.destroy_process_group()


def test_two_learners_average_to_the_gradient_of_the_whole_batch():
    """Each learner's PPO loss on its half, all-reduced, is the single-process gradient of the full
    batch (advantages normalized over both halves); one half alone is not. Per-task advantage statistics
    (algo.norm_adv_by_task) are taken over both halves too."""
    mp.start_processes(learner, (free_port(),), nprocs=2, start_method="spawn")


def test_compiled_gae_and_act_equal_eager():
    torch.manual_seed(0)
    rewards, values, last = torch.randn(6, 5), torch.randn(6, 5), torch.randn(5)
    dones = torch.rand(6, 5) < 0.3
    compiled_gae = maybe_compile(gae, True)
    expected = gae(rewards, values, dones, last, 0.9, 0.95)
    for got, want in zip(compiled_gae(rewards, values, dones, last, 0.9, 0.95), expected):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)

    policy = GaussianActorCritic(5, 2, [16, 16])
    act = maybe_compile(policy.act, True)
    obs = {"state": torch.randn(7, 5)}
    for _ in range(2):  # the second time with other normalizer statistics: read, not baked in
        with torch.no_grad():
            torch.manual_seed(1)
            got = act(obs)
            torch.manual_seed(1)
            want = policy.act(obs)
        for a, b in ((got.action, want.action), (got.log_prob, want.log_prob), (got.value, want.value)):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
        policy.update_normalizer({"state": 5 * torch.randn(64, 5) + 2})
    assert not compiling._failure, compiling._failure


def test_a_failing_compiler_falls_back_with_one_warning(monkeypatch, capsys):
    monkeypatch.setattr(compiling, "_failure", [])

    def broken_backend(graph, example_inputs):
        raise RuntimeError("no compiler here\nsecond line")

    double = maybe_compile(lambda x: 2 * x, True, backend=broken_backend)
    triple = maybe_compile(lambda x: 3 * x, True, backend=broken_backend)
    assert double(torch.ones(2)).tolist() == [2.0, 2.0] and triple(torch.ones(2)).tolist() == [3.0, 3.0]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "torch.compile failed" in err[0] and "no compiler here" in err[0], err


def test_train_with_two_learners_through_the_cli(tmp_path):
    proc = roborl("train", REACH, f"train.run_dir={tmp_path}", "train.name=two", "resources.learners=2",
                  "env.num_envs=8", "train.rollout_steps=10", "train.total_steps=320", "train.eval_every=2",
                  "train.eval_episodes=2", "train.eval_envs=2", "train.video=false", "train.progress=false")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary == json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["env_steps"] == 320 and summary["iterations"] == 4
    saved = yaml.safe_load((tmp_path / "two" / "config.yaml").read_text())
    assert saved["env"]["num_envs"] == 8 and saved["resources"]["learners"] == 2  # the run's, not a learner's
    assert (tmp_path / "two" / "checkpoints" / "last.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["two"]


@pytest.mark.parametrize("overrides,message", [
    (["resources.learners=0"], "config key 'resources.learners' must be >= 1, got 0"),
    (["resources.learners=3", "env.num_envs=8"], "env.num_envs (8) must be divisible by resources.learners (3)"),
])
def test_bad_learner_counts_are_one_line_errors(overrides, message):
    proc = roborl_in_process("train", REACH, *overrides)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"roborl: error: {message}"), proc.stderr


def test_sac_with_two_learners_runs_through_the_cli(tmp_path):
    """Residual SAC in two learner processes: each steps half of the envs into its own replay and samples half of
    every batch (test_two_learners_average_to_the_gradient_of_the_whole_batch checks the averaged update; the
    learning is checked in one process, test_residual.py::test_residual_sac_fixes_a_biased_base)."""
    from test_residual import BIASED_REACH, SAC_REACH

    from roborl.checkpoint import Checkpoint

    path = tmp_path / "sac.yaml"
    path.write_text(yaml.safe_dump(BIASED_REACH))
    proc = roborl("train", str(path), f"train.run_dir={tmp_path}", "train.name=sac2", "resources.learners=2",
                  *SAC_REACH, "train.total_steps=1600", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "sac2" / "summary.json").read_text())
    state = Checkpoint(tmp_path / "sac2" / "checkpoints" / "last.safetensors").algo_state
    assert summary["env_steps"] == 1600 and summary["iterations"] == 4, summary
    assert state["replay"]["size"] == 800 and state["collected"] == 1600, (state["replay"]["size"], state["collected"])
    assert state["updates"] == 0.5 * (1600 - 800), state["updates"]  # together, per transition of all envs past seeding


def test_ppo_lagrangian_with_two_learners_agrees_on_one_multiplier(tmp_path):
    """PPO-Lagrangian over two learners: λ comes from the mean episode cost of both learners' episodes, so
    both keep one multiplier (it is logged by rank 0 and the run finishes without the learners parting)."""
    from test_training import scalars

    config = str(ROOT / "configs" / "ppo_lagrangian_reachavoid.yaml")
    proc = roborl("train", config, f"train.run_dir={tmp_path}", "train.name=lag", "resources.learners=2",
                  "env.num_envs=8", "train.rollout_steps=50", "train.total_steps=1600", "train.eval_every=100",
                  "train.eval_episodes=2", "train.eval_envs=2", "train.video=false", "train.progress=false",
                  "algo.cost_limit=0.0", "algo.lagrange_kp=0.0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    multipliers = [v for _, v in scalars(tmp_path / "lag", "train/lagrange_multiplier")]
    assert len(multipliers) == 4 and multipliers == sorted(multipliers), multipliers  # integral only, limit 0: λ grows
