"""Ray env workers (resources.env_workers) on a local Ray cluster: learning, worker death, placement,
asynchronous rollouts and their importance correction."""
import os
import signal
import threading
import time

import pytest
import ray
import torch
from contract import check_vecenv_contract
from helpers import ROOT, roborl, roborl_in_process

from roborl.algos.ppo import PPO, correct_off_policy
from roborl.buffer import RolloutBuffer
from roborl.builder import make_env, make_run_policy
from roborl.config import PPOConfig, load_config
from roborl.policies import GaussianActorCritic
from roborl.ray_collector import RayCollector
from roborl.ray_vec_env import RayVecEnv
from roborl.ray_workers import WorkerPool
from roborl.runner import Runner

REACH = str(ROOT / "configs" / "ppo_reach.yaml")
QUIET = ["train.video=false", "train.progress=false", "train.eval_episodes=32"]


@pytest.fixture(scope="module")
def local_cluster():
    """One local Ray instance for the module (the pool joins it and leaves it running)."""
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


def train(tmp_path, name: str, *overrides: str) -> tuple[Runner, dict]:
    cfg = load_config(REACH, [f"train.run_dir={tmp_path}", f"train.name={name}", *QUIET, *overrides])
    trainer = Runner(cfg)
    return trainer, trainer.train()


@pytest.mark.learning
def test_two_env_workers_learn_like_one_process(tmp_path, local_cluster):
    budget = ["train.total_steps=48000", "train.eval_every=5"]
    _, single = train(tmp_path, "single", *budget)
    # the learner-inference mode (the learner acts, the workers only simulate) runs whole, a worker killed, in
    # test_a_killed_worker_is_replaced_and_the_run_finishes; here the modes whose rollouts the workers act
    runs = {mode: train(tmp_path, mode, *budget, "resources.env_workers=2", *extra)
            for mode, extra in {"sync": [], "async": ["resources.async_rollouts=true"]}.items()}
    assert single["success_rate"] >= 0.8, single
    for mode, (trainer, summary) in runs.items():
        assert isinstance(trainer.collector, RayCollector)
        assert summary["env_steps"] == single["env_steps"] == 48000, mode
        assert summary["success_rate"] >= 0.8 and abs(summary["success_rate"] - single["success_rate"]) <= 0.2, \
            (mode, summary["success_rate"], single["success_rate"])
        curve = [s for _, _, s in summary["eval_history"]]
        assert curve[-1] > curve[0] + 0.5, (mode, curve)
        assert summary["worker_restarts"] == 0 and summary["lost_env_steps"] == 0


@pytest.mark.parametrize("mode", [[], ["resources.async_rollouts=true"], ["resources.inference=learner"]],
                         ids=["sync", "async", "learner-inference"])
def test_a_killed_worker_is_replaced_and_the_run_finishes(tmp_path, local_cluster, mode):
    cfg = load_config(REACH, [f"train.run_dir={tmp_path}", "train.name=kill", *QUIET, "env.num_envs=16",
                              "train.total_steps=4000", "train.eval_every=100", "resources.env_workers=2", *mode])
    trainer = Runner(cfg)
    victim = trainer.collector.pool.pids()[0]
    killed = threading.Event()

    def kill_at_iteration_2() -> None:
        while trainer.iteration < 2:
            time.sleep(0.01)
        os.kill(victim, signal.SIGKILL)
        killed.set()

    killer = threading.Thread(target=kill_at_iteration_2, daemon=True)
    killer.start()
    summary = trainer.train()
    assert killed.is_set()
    assert summary["env_steps"] == 4000 and summary["iterations"] == 5
    assert summary["worker_restarts"] == 1 and summary["lost_env_steps"] > 0, summary
    from test_training import scalars
    restarts = scalars(tmp_path / "kill", "train/worker_restarts")
    assert restarts[0][1] == 0 and restarts[-1][1] == 1  # the loss is in the logs
    assert [v for _, v in scalars(tmp_path / "kill", "train/lost_env_steps")][-1] == summary["lost_env_steps"]


def test_placement_is_configuration_and_the_shards_keep_the_vecenv_contract(local_cluster):
    cfg = load_config(REACH, ["env.num_envs=4", "resources.env_workers=2", "resources.worker_cpus=0.5"])
    pool = WorkerPool(cfg)
    try:
        assert pool.describe()["resources"] == {"CPU": 0.5}
        assert len(set(pool.pids())) == 2 and os.getpid() not in pool.pids()
        env = RayVecEnv(pool, torch.device("cpu"))
        assert env.num_envs == 4 and env.sizes == [2, 2]
        check_vecenv_contract(env, steps=60)
        first = env.reset(seed=5)["state"]
        assert not torch.equal(first[:2], first[2:])  # the workers' envs are seeded apart
        assert torch.equal(env.reset(seed=5)["state"], first)
    finally:
        pool.close()


def test_a_chunked_env_in_the_workers_builds_the_policy_it_builds_here(local_cluster):
    """env.action_chunk 2 behind Ray env workers: a step is K×A as in this process, a control step's action A,
    so a chunk policy (flow, diffusion, the VLAs) gets the same sizes and a checkpoint trained in one loads in the
    other."""
    cfg = load_config(ROOT / "configs" / "flow_noise_push.yaml",
                      ["policy.init=null", "env.action_chunk=2", "env.num_envs=4", "resources.env_workers=2",
                       "resources.worker_cpus=0.5"])
    here = make_env(cfg.env, 4, 0, torch.device("cpu"))
    pool = WorkerPool(cfg)
    try:
        there = RayVecEnv(pool, torch.device("cpu"))
        assert there.action_space.shape == here.action_space.shape == (2, 4)
        assert there.action_dim == here.action_dim == 4
        shapes = {name: p.shape for name, p in make_run_policy(cfg, here).state_dict().items()}
        assert {name: p.shape for name, p in make_run_policy(cfg, there).state_dict().items()} == shapes
    finally:
        pool.close()
        here.close()


def stale_buffer() -> tuple[GaussianActorCritic, RolloutBuffer]:
    """A rollout collected by a policy that has since moved on."""
    torch.manual_seed(0)
    policy = GaussianActorCritic(5, 2, [16, 16])
    buf = RolloutBuffer(6, 4, torch.device("cpu"))
    for _ in range(6):
        obs = {"state": torch.randn(4, 5)}
        with torch.no_grad():
            buf.add(obs, policy.act(obs), torch.randn(4), torch.zeros(4, dtype=torch.bool))
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return policy, buf


def test_off_policy_correction_is_the_truncated_likelihood_ratio():
    policy, buf = stale_buffer()
    behaviour = buf.log_probs.clone()
    with torch.no_grad():
        correct_off_policy(policy, buf, is_clip=1.0)
    state = {"state": buf.obs["state"].reshape(24, 5)}
    mean, std = policy.actor(policy.features(state)), policy.log_std.exp()
    learner = torch.distributions.Normal(mean, std).log_prob(buf.actions.reshape(24, 2)).sum(-1).reshape(6, 4)
    torch.testing.assert_close(buf.log_probs, learner)
    torch.testing.assert_close(buf.behaviour_weights, (learner - behaviour).exp().clamp(max=1.0))
    assert (buf.behaviour_weights < 1).any() and (buf.behaviour_weights == 1).any()
    torch.testing.assert_close(buf.values, policy.value(state).reshape(6, 4))


def test_unit_behaviour_weights_leave_the_ppo_loss_unchanged():
    policy, buf = stale_buffer()
    buf.finish(torch.zeros(4), 0.9, 0.95)
    ppo = PPO(policy, PPOConfig())
    plain = buf.flat()
    loss, _ = ppo.minibatch_loss(plain)
    buf.behaviour_weights = torch.ones(6, 4)
    weighted, _ = ppo.minibatch_loss(buf.flat())
    torch.testing.assert_close(weighted, loss)
    buf.behaviour_weights = torch.full((6, 4), 0.5)
    _, terms = ppo.minibatch_loss(buf.flat())
    torch.testing.assert_close(terms["policy_loss"], 0.5 * ppo.minibatch_loss(plain)[1]["policy_loss"])


@pytest.mark.parametrize("overrides,message", [
    (["resources.env_workers=3"], "env.num_envs (64) must be divisible by resources.env_workers (3)"),
    (["resources.env_workers=2", "resources.inference=learner", "resources.async_rollouts=true"],
     "resources.async_rollouts needs resources.inference collocated"),
    (["resources.env_workers=2", "resources.inference=remote"], "resources.inference 'remote' is unknown"),
    (["resources.env_workers=2", "resources.learners=2"], "resources.env_workers and resources.learners > 1"),
])
def test_bad_ray_settings_are_one_line_errors(overrides, message):
    proc = roborl_in_process("train", REACH, *overrides, "train.progress=false")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"roborl: error: {message}"), proc.stderr


def test_an_unreachable_ray_address_is_one_line_error():
    """In a process of its own: this test process may already be a Ray driver (`local_cluster`)."""
    proc = roborl("train", REACH, "resources.env_workers=2", "resources.ray_address=127.0.0.1:1", "train.progress=false")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and lines[-1].startswith("roborl: error: resources.ray_address '127.0.0.1:1'"), \
        proc.stderr[-1500:]
    assert len([line for line in lines if not line.startswith("20")]) == 1, proc.stderr  # only Ray's own log lines


def test_sac_and_grpo_train_with_env_workers(tmp_path, local_cluster):
    """SAC with 2 Ray env workers, with the learner acting (the workers simulate) and collocated (each worker acts
    with its copy of the policy and sends its transitions): every transition reaches the learner's replay and the
    updates follow at the configured ratio (the learning itself is checked in one process,
    test_residual.py::test_residual_sac_fixes_a_biased_base); GRPO's group resets reach the workers (each group
    lies in one worker's shard)."""
    import yaml
    from test_residual import BIASED_REACH, SAC_REACH

    path = tmp_path / "sac.yaml"
    path.write_text(yaml.safe_dump(BIASED_REACH))
    for name, extra in {"learner": ["resources.env_workers=2", "resources.inference=learner"],
                        "collocated": ["resources.env_workers=2"]}.items():
        cfg = load_config(str(path), [f"train.run_dir={tmp_path}", f"train.name=sac_{name}", *SAC_REACH,
                                      "train.total_steps=1600", *extra])
        runner = Runner(cfg)
        before = [p.detach().clone() for p in runner.policy.parameters()]
        workers = runner.train()  # the workers simulate (and, collocated, act and keep the transitions)
        sac = runner.algo
        assert workers["env_steps"] == 1600 and workers["worker_restarts"] == 0, name
        assert len(sac.replay) == 1600 and sac.updates == 0.5 * (1600 - 800), (name, len(sac.replay), sac.updates)
        obs, nxt = sac.replay.data["obs.state"][:1600], sac.replay.data["next_obs.state"][:1600]
        chained = (nxt[:, None] == obs[None]).all(-1).any(1)  # each next state is some transition's state...
        assert chained.float().mean() >= 0.95 and not (nxt == obs).all(-1).any(), name  # ...but not its own
        assert any(not torch.equal(a, b) for a, b in zip(before, runner.policy.parameters())), name

    grpo = ["env.id=mujoco/LangTabletop-Reach", "env.obs_mode=state", "env.num_envs=32", "env.episode_length=20",
            "train.rollout_steps=20", "train.algorithm=grpo", "grpo.group_size=8", "grpo.reward=return",
            "policy.hidden=[32]", "train.total_steps=1280", "train.eval_every=1000", "train.eval_episodes=8", "train.eval_envs=8",
            "train.video=false", "train.progress=false", f"train.run_dir={tmp_path}", "resources.env_workers=2"]
    learner = Runner(load_config(None, [*grpo, "train.name=grpo_learner", "resources.inference=learner"]))
    start = learner.env.reset(seed=0)["state"].view(4, 8, -1)
    assert torch.equal(start, start[:, :1].expand_as(start)) and len({tuple(g[0].tolist()) for g in start}) == 4
    for runner in (learner, Runner(load_config(None, [*grpo, "train.name=grpo_collocated"]))):
        before = [p.detach().clone() for p in runner.policy.parameters()]
        summary = runner.train()  # collocated: each worker runs the rounds, the learner joins their kept groups
        assert summary["iterations"] == 2 and summary["env_steps"] >= 2 * 32 * 2 and summary["worker_restarts"] == 0
        assert any(not torch.equal(a, b) for a, b in zip(before, runner.policy.parameters())), "nothing trained"


def test_per_machine_actors_of_a_hierarchy_stepped_in_the_env_workers(tmp_path, local_cluster):
    """policy.actors per_machine learns from the option columns the workers' hierarchy envs publish: the learner
    gets each column's machine through the workers' description, as from a hierarchy env of its own."""
    from roborl.builder import make_env
    from roborl.policies.per_machine import PerMachineActor
    from roborl.rm.hierarchy_env import HierarchyEnv

    overrides = [f"train.run_dir={tmp_path}", "train.name=hrm_workers", *QUIET, "env.num_envs=8",
                 "train.rollout_steps=16", "train.total_steps=256", "train.eval_every=1000", "train.eval_envs=8",
                 "train.eval_episodes=8"]
    cfg = load_config(ROOT / "configs" / "hrm_tour_options.yaml", [*overrides, "resources.env_workers=2"])
    local = make_env(cfg.env, 2, 0, torch.device("cpu"))
    try:
        assert isinstance(local, HierarchyEnv)
        machines = local.options.machine_of
    finally:
        local.close()
    runner = Runner(cfg)
    assert isinstance(runner.env, RayVecEnv) and runner.env.option_machines == machines
    assert isinstance(runner.policy.actor, PerMachineActor) and runner.policy.actor.machines == len(set(machines))
    before = [p.detach().clone() for p in runner.policy.actor.parameters()]
    summary = runner.train()
    assert summary["env_steps"] == 256 and summary["worker_restarts"] == 0
    assert any(not torch.equal(a, b) for a, b in zip(before, runner.policy.actor.parameters()))
