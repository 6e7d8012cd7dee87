"""Real training runs through the CLI: learning, artifacts, checkpoints, kill and resume."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers import ROOT, roborl, roborl_in_process
from safetensors import safe_open
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import roborl.collectors as collectors_module
import roborl.runner as runner_module
from roborl.algos.advantages import gae
from roborl.buffer import RolloutBuffer
from roborl.checkpoint import Checkpoint, save_checkpoint
from roborl.collect import EpisodeLog
from roborl.config import load_config
from roborl.errors import UserError
from roborl.evaluate import load_for_eval
from roborl.runner import Runner
from roborl.tasks.language import TASK_NAMES
from roborl.tasks.reach import ReachEnv

REACH = str(ROOT / "configs" / "ppo_reach.yaml")


def scalars(run_dir, tag):
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.mark.learning
@pytest.mark.realtime  # with test_franka.py, which drives the FR3 with this run's policy (one session fixture)
def test_ppo_learns_reach(reach_run):
    run, proc = reach_run
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    for key in ("success_rate", "mean_return", "env_steps", "wall_time_s"):
        assert key in summary
    assert summary["env_steps"] >= 80000
    assert summary["success_rate"] >= 0.8, summary
    returns = [v for _, v in scalars(run, "rollout/return")]
    assert returns[-1] > returns[0] + 10, returns  # the learning curve rises
    evals = [v for _, v in scalars(run, "eval/success_rate")]
    assert evals[-1] > evals[0]
    assert {"train/policy_loss", "train/approx_kl", "train/entropy", "train/sps"} <= set(
        EventAccumulator(str(run / "tb")).Reload().Tags()["scalars"])
    videos = sorted((run / "videos").glob("*.mp4"))
    assert videos and videos[-1].stat().st_size > 1000
    best = run / "checkpoints" / "best.safetensors"
    assert (run / "checkpoints" / "last.safetensors").exists() and best.exists()
    # the eval CLI reproduces the trained behaviour from the checkpoint alone
    ev = roborl_in_process("eval", str(best), "--episodes", "16", "--json")
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout.strip().splitlines()[-1])["success_rate"] >= 0.8


def collect_rollout(runner: Runner) -> RolloutBuffer:
    """One rollout of the runner's PPO from `runner.obs`, with its advantages."""
    runner.obs = runner.algo.collect(runner.env, runner.obs, EpisodeLog())
    return runner.algo.buffer


def checkpoint_iteration(path) -> int:
    try:
        with safe_open(str(path), "pt") as f:
            return json.loads(f.metadata()["trainer_state"])["iteration"]
    except Exception:
        return -1


def test_kill_and_resume_continues_the_run(tmp_path):
    args = [sys.executable, "-m", "roborl.cli", "train", REACH, f"train.run_dir={tmp_path}", "train.name=r",
            "env.num_envs=8", "train.rollout_steps=10", "train.total_steps=4000", "train.save_every=1",
            "train.eval_every=1000", "train.eval_episodes=8", "train.video=false", "train.progress=false"]
    last = tmp_path / "r" / "checkpoints" / "last.safetensors"
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while checkpoint_iteration(last) < 5 and time.time() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    ckpt = Checkpoint(last)  # a kill at any moment leaves a whole checkpoint (atomic rename)
    killed_at = ckpt.trainer_state["iteration"]
    assert 5 <= killed_at < 50

    # resuming restores weights, optimizer and counters exactly
    trainer = Runner(load_config(None, [f"resume={last}", "train.progress=false"]))
    assert trainer.iteration == killed_at and trainer.env_steps == killed_at * 80
    for name, value in trainer.policy.state_dict().items():
        assert torch.equal(value, ckpt.policy_state[name]), name
    assert trainer.algo.optimizer.state_dict()["state"][0]["exp_avg"].equal(ckpt.algo_state["optimizer"]["state"][0]["exp_avg"])
    trainer.close()

    done = roborl("train", f"resume={last}", "train.progress=false")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["env_steps"] == 4000 and summary["iterations"] == 50
    steps = [s for s, _ in scalars(tmp_path / "r", "train/policy_loss")]
    assert steps[-1] == 4000 and max(steps) == 4000


def test_checkpoint_write_is_atomic(tmp_path):
    """A checkpoint either exists whole or not at all; a failing write keeps the previous one."""
    policy = torch.nn.Linear(3, 2)
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, policy, None, {"a": 1}, {"iteration": 1})
    before = path.read_bytes()

    class Boom(torch.nn.Module):
        def state_dict(self, *a, **k):
            return {"w": torch.zeros(2), "bad": object()}

    with pytest.raises(Exception, match="object"):  # safetensors cannot store a Python object
        save_checkpoint(path, Boom(), None, {"a": 2}, {"iteration": 2})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.safetensors"]
    assert Checkpoint(path).trainer_state["iteration"] == 1


def test_same_seed_same_training(tmp_path):
    """Seeding makes a run reproducible: two runs with one seed end with identical weights."""
    def run(name: str, seed: int):
        cfg = load_config(REACH, [f"train.run_dir={tmp_path}", f"train.name={name}", f"train.seed={seed}",
                                  "env.num_envs=8", "train.rollout_steps=10", "train.total_steps=800",
                                  "train.eval_every=1000", "train.eval_episodes=8", "train.video=false",
                                  "train.progress=false"])
        trainer = Runner(cfg)
        trainer.train()
        return trainer.policy.state_dict()

    a, b, c = run("a", 1), run("b", 1), run("c", 2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_anneal_lr_decays_the_policy_lr_linearly(tmp_path):
    cfg = load_config(REACH, [f"train.run_dir={tmp_path}", "train.name=anneal", "env.num_envs=8",
                              "train.rollout_steps=4", "train.total_steps=128", "train.eval_every=100",
                              "train.eval_episodes=2", "train.eval_envs=2", "train.video=false",
                              "train.progress=false", "algo.anneal_lr=true", "algo.lr=0.001"])
    Runner(cfg).train()
    lrs = [v for _, v in scalars(tmp_path / "anneal", "train/lr")]
    assert torch.allclose(torch.tensor(lrs), torch.tensor([1e-3, 7.5e-4, 5e-4, 2.5e-4]))


@pytest.mark.parametrize("overrides, update", [([], "all"), (["train.update_threads=3"], 3),
                                               (["resources.env_workers=2"], 1)])
def test_the_update_takes_the_cores_the_idle_simulator_leaves(tmp_path, monkeypatch, overrides, update):
    """Rollouts keep train.threads; the update gets every core (the local physics threads are idle then), an
    explicit train.update_threads, or train.threads where Ray env workers go on stepping envs meanwhile. The
    thread counts are the runner's choice from the config alone, so the envs here step locally (test_ray.py
    runs the Ray workers themselves)."""
    cfg = load_config(REACH, [f"train.run_dir={tmp_path}", "train.name=threads", "env.num_envs=8",
                              "train.rollout_steps=4", "train.total_steps=64", "train.eval_every=100",
                              "train.eval_episodes=2", "train.eval_envs=2", "train.video=false",
                              "train.progress=false", "train.threads=1", *overrides])
    seen = {"collect": [], "update": []}
    monkeypatch.setattr(runner_module, "make_collector", lambda cfg, device: collectors_module.LocalCollector(
        collectors_module.make_run_env(cfg, cfg.env.num_envs, cfg.train.seed, device)))
    runner = Runner(cfg)
    def threads_seen(phase: str, fn):
        def call(*args):
            if not (phase == "update" and args):  # the update calls itself on its buffer
                seen[phase].append(torch.get_num_threads())
            return fn(*args)
        return call

    for phase in seen:
        monkeypatch.setattr(runner.algo, phase, threads_seen(phase, getattr(runner.algo, phase)))
    runner.train()
    expected = (os.cpu_count() or 1) if update == "all" else update
    assert seen["collect"] == [1, 1] and seen["update"] == [expected, expected]
    assert torch.get_num_threads() == 1


def test_one_env_per_process_simulator_is_evaluated_in_its_training_envs(tmp_path, monkeypatch):
    """Isaac Lab allows one env per process: the trainer must not build a second one for evaluation, and
    training goes on from fresh episodes after each evaluation."""
    monkeypatch.setattr(ReachEnv, "one_per_process", True, raising=False)
    built = []
    make = runner_module.make_run_env
    for module in (runner_module, collectors_module):
        monkeypatch.setattr(module, "make_run_env", lambda *a, **k: built.append(a[1]) or make(*a, **k))
    cfg = load_config(REACH, [f"train.run_dir={tmp_path}", "train.name=one", "env.num_envs=4",
                              "train.rollout_steps=10", "train.total_steps=120", "train.eval_every=1",
                              "train.eval_episodes=4", "train.video=false", "train.progress=false"])
    trainer = Runner(cfg)
    summary = trainer.train()
    assert built == [4], f"envs built: {built}"  # the training envs only
    assert trainer.eval_env is trainer.env and len(summary["eval_history"]) == 3
    assert summary["env_steps"] == 120


def test_task_weights_shape_training_episodes_but_not_evaluation(tmp_path):
    """Push-only training (reach and lift weigh 0) still evaluates on all three tasks, equally often."""
    cfg = load_config(REACH, [f"train.run_dir={tmp_path}", "train.name=weights", "train.video=false",
                              "env.id=mujoco/LangTabletopFixed-ReachPushLift", "env.obs_mode=state", "env.num_envs=48",
                              "env.task_weights={reach: 0, lift: 0}", "train.eval_episodes=48", "train.eval_envs=48",
                              "train.progress=false"])
    trainer = Runner(cfg)
    assert set(trainer.env.reset(seed=0)["task_id"].tolist()) == {TASK_NAMES.index("push")}
    trainer.run_eval(0.0)
    evaluated = trainer.eval_env.reset(seed=0)["task_id"]
    assert set(evaluated.tolist()) == {TASK_NAMES.index(t) for t in ("reach", "push", "lift")}
    path = trainer.save("last", 0.0)
    assert Checkpoint(path).config["env"]["task_weights"] == {"reach": 0.0, "lift": 0.0}
    env, _ = load_for_eval(Checkpoint(path), 4, torch.device("cpu"), env_id="mujoco/LangTabletopFixed-Reach")
    assert set(env.reset(seed=0)["task_id"].tolist()) == {TASK_NAMES.index("reach")}  # per-task evals too


def test_norm_adv_by_task_gives_every_task_unit_advantages(tmp_path):
    """On LangTabletop the tasks' GAE advantages differ in scale; `algo.norm_adv_by_task` standardizes
    each task's over the rollout, logs each task's std, and trains. A single-task env is refused."""
    cfg = load_config(REACH, [f"train.run_dir={tmp_path}", "train.name=by_task", "train.video=false",
                              "env.id=mujoco/LangTabletopFixed-ReachPushLift", "env.obs_mode=state", "env.num_envs=24",
                              "env.episode_length=30", "train.rollout_steps=30", "algo.norm_adv_by_task=true",
                              "train.progress=false"])
    trainer = Runner(cfg)
    trainer.obs = trainer.env.reset(seed=0)
    buffer = collect_rollout(trainer)
    task, adv = buffer.obs["task_id"].flatten(), buffer.advantages.flatten()
    raw_std = torch.stack([adv[task == k].std() for k in range(3)])
    assert raw_std.max() > 1.5 * raw_std.min()  # the scales one batch-wide std would mix
    normalized, std = trainer.algo.normalize_advantages_by_task(adv, task)
    torch.testing.assert_close(std, raw_std)
    for k in range(3):
        assert abs(float(normalized[task == k].mean())) < 1e-5 and abs(float(normalized[task == k].std()) - 1) < 1e-5
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    stats = trainer.algo.update(buffer, torch.Generator().manual_seed(0))
    assert [stats[f"adv_std/task{k}"] for k in range(3)] == pytest.approx(raw_std.tolist(), rel=1e-5)
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters()))
    reach = Runner(load_config(REACH, [f"train.run_dir={tmp_path}", "train.name=reach", "train.video=false",
                                        "env.num_envs=4", "algo.norm_adv_by_task=true", "train.progress=false"]))
    reach.obs = reach.env.reset(seed=0)
    with pytest.raises(UserError, match=r"algo.norm_adv_by_task needs a multi-task env that gives obs\['task_id'\]"):
        reach.algo.update(collect_rollout(reach))
    with pytest.raises(UserError, match=r"config key 'algo.norm_adv_by_task' is not read by train.algorithm grpo \(it "
                                        r"is read by ppo\)"):
        load_config(REACH, ["algo.norm_adv_by_task=true", "train.algorithm=grpo"])


def test_ppo_group_resets_center_each_step_on_its_group(tmp_path):
    """`algo.group_size` G: every iteration starts groups of G envs from one initial state (seeded by the
    iteration), and each step's GAE advantage less its group's mean at that step is what PPO trains on;
    the critic's returns stay GAE's. Settings that cannot work are refused in one line."""
    base = [f"train.run_dir={tmp_path}", "train.video=false", "train.progress=false", "env.obs_mode=state",
            "env.id=mujoco/LangTabletopFixed-ReachPushLift", "env.num_envs=16", "env.episode_length=30",
            "train.rollout_steps=30"]
    trainer = Runner(load_config(REACH, [*base, "train.name=groups", "algo.group_size=4"]))
    assert trainer.env.unwrapped.group_size == 4
    trainer.obs = trainer.env.reset(seed=0)
    buffer = collect_rollout(trainer)
    start = buffer.obs["state"][0].clone()  # the buffer is refilled in place by the next rollout
    first = start.view(4, 4, -1)  # groups × members × features at the episode's start
    assert torch.equal(first, first[:, :1].expand_as(first))
    assert len({tuple(g[0].tolist()) for g in first}) == 4  # the groups start apart
    a = trainer.cfg.algo
    with torch.no_grad():
        adv, returns = gae(buffer.rewards, buffer.values, buffer.dones, trainer.policy.value(trainer.obs), a.gamma,
                           a.gae_lambda)
    grouped = adv.view(30, 4, 4)
    torch.testing.assert_close(buffer.advantages, (grouped - grouped.mean(dim=2, keepdim=True)).reshape(30, 16))
    torch.testing.assert_close(buffer.returns, returns)
    assert buffer.advantages.abs().max() > 1e-3 and (adv - buffer.advantages).abs().max() > 1e-3
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    trainer.algo.update(buffer, torch.Generator().manual_seed(0))
    assert any(not torch.equal(x, y) for x, y in zip(before, trainer.policy.parameters()))
    trainer.algo.iteration = 1
    again = collect_rollout(trainer).obs["state"][0]
    assert not torch.equal(again, start)  # a new draw each iteration
    trainer.env.close()
    with pytest.raises(UserError, match=r"config key 'algo.group_size' must be >= 1, got 0"):
        load_config(REACH, ["algo.group_size=0"])
    with pytest.raises(UserError, match=r"config key 'algo.group_size' is not read by train.algorithm grpo"):
        load_config(REACH, ["algo.group_size=4", "train.algorithm=grpo"])
    with pytest.raises(UserError, match=r"env.num_envs \(16\) must be a multiple of algo.group_size \(3\)"):
        Runner(load_config(REACH, [*base, "train.name=odd", "algo.group_size=3"]))
    with pytest.raises(UserError, match=r"algo.group_size needs whole episodes per iteration: set "
                                        r"train.rollout_steps to the episode length \(30\)"):
        Runner(load_config(REACH, [*base, "train.name=short", "algo.group_size=4", "train.rollout_steps=20"]))


def test_best_checkpoint_follows_the_return_where_the_env_reports_no_success(tmp_path):
    """Gymnasium's Pusher has no success signal: `train.best_metric` auto keeps the evaluation with the highest
    mean return as best.safetensors (by success it would stay at the first evaluation, every rate being 0)."""
    base = [f"train.run_dir={tmp_path}", "env.num_envs=4", "train.rollout_steps=16", "train.total_steps=320",
            "train.eval_every=1", "train.eval_episodes=4", "train.eval_envs=4", "train.progress=false",
            "algo.minibatches=4", "env.episode_length=20"]
    config = str(ROOT / "configs" / "ppo_gym_pusher.yaml")
    auto = Runner(load_config(config, [*base, "train.name=auto"])).train()
    assert auto["best_metric"] == "mean_return" and auto["best_success_rate"] == 0.0
    returns = [v for _, v in scalars(tmp_path / "auto", "eval/mean_return")]
    assert len(returns) == 5 and len(set(returns)) > 1
    best = Checkpoint(tmp_path / "auto" / "checkpoints" / "best.safetensors").trainer_state
    assert best["last_eval"]["mean_return"] == pytest.approx(max(returns)) == pytest.approx(auto["best_score"])
    by_success = Runner(load_config(config, [*base, "train.name=success", "train.best_metric=success"])).train()
    first = Checkpoint(tmp_path / "success" / "checkpoints" / "best.safetensors").trainer_state
    assert by_success["best_metric"] == "success_rate" and first["env_steps"] == 64
