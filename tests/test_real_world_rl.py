"""Real-world RL on the twin (`resources.actor: robot`): a learner process (`roborl train`) and an actor process
(`roborl actor`) over loopback TCP. Each is killed with SIGKILL mid-run and restarted: the learner resumes from
its checkpoint and asks the actor for exactly what it lacks, so every transition the actor had acknowledged is
in the learner's buffer once, and the operator's interventions are in its demonstration buffer too."""
import json
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml
from deploy_helpers import running_twin
from helpers import ROOT, wait_until

from roborl.checkpoint import Checkpoint
from roborl.config import config_from_dict
from roborl.demos import load_demo_transitions, record_demos
from roborl.replay import sample_mixed
from roborl.robot.link import ActorLink, LearnerLink, parse_address

TO_GOAL = slice(21, 24)  # Reach's state ends with the goal and the TCP's offset to it


def steer_to_goal():
    """A scripted operator (robot.operator tests.test_real_world_rl:steer_to_goal) who takes over in periods
    5-9 of every episode and drives the TCP toward the goal."""
    def rule(obs):
        if not 5 <= obs["episode_step"] < 10:
            return None
        return operator_action(obs["state"])
    return rule


def operator_action(state: np.ndarray) -> np.ndarray:
    offset = state[..., TO_GOAL]
    norm = np.maximum(np.linalg.norm(offset, axis=-1, keepdims=True), 0.04)
    return np.concatenate([offset / norm, np.ones_like(norm)], -1).astype(np.float32)


@pytest.fixture(scope="module")
def twin():
    yield from running_twin("mujoco/Reach")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def absorbed(checkpoint) -> int:
    """Transitions the learner's newest checkpoint holds (0 before the first)."""
    if not checkpoint.exists():
        return 0
    return Checkpoint(checkpoint).trainer_state["collector"]["rows"]


def test_actor_and_learner_survive_each_others_kills(twin, tmp_path):
    address = f"127.0.0.1:{free_port()}"
    config = tmp_path / "hil.yaml"
    config.write_text(yaml.safe_dump({
        "env": {"id": "mujoco/Reach", "num_envs": 1},
        "policy": {"kind": "gaussian", "hidden": [32, 32]},
        "train": {"algorithm": "sac", "total_steps": 440, "rollout_steps": 20, "save_every": 1, "eval_every": 1000,
                  "eval_episodes": 2, "eval_envs": 2, "video": False, "progress": False, "run_dir": str(tmp_path),
                  "name": "hil", "threads": 1},
        "sac": {"seed_steps": 40, "batch_size": 32, "utd_ratio": 0.5},
        "resources": {"actor": "robot"},
        "robot": {"address": twin, "learner": address, "spawn_actor": False, "episode_steps": 30,
                  "operator": "test_real_world_rl:steer_to_goal", "reconnect_s": 60}}))
    last = tmp_path / "hil" / "checkpoints" / "last.safetensors"
    learner = spawn("-m", "roborl.cli", "train", str(config))
    actor = spawn("-m", "roborl.cli", "actor", address)
    try:
        wait_until(lambda: absorbed(last) >= 80, 120, "the first transitions")
        actor.send_signal(signal.SIGKILL)  # mid-episode, batches in flight
        actor.wait()
        actor = spawn("-m", "roborl.cli", "actor", address)
        wait_until(lambda: absorbed(last) >= 240, 120, "the restarted actor's transitions")
        learner.send_signal(signal.SIGKILL)
        learner.wait()
        held = Checkpoint(last).trainer_state["collector"]
        learner = spawn("-m", "roborl.cli", "train", str(config), f"train.resume={last}")
        try:
            out, err = learner.communicate(timeout=180)
        except subprocess.TimeoutExpired:  # say what both sides were doing, not only that time ran out
            learner.kill()
            actor.kill()
            pytest.fail(f"the resumed learner did not finish in 180 s (it holds {absorbed(last)} transitions)\n"
                        f"learner:\n{learner.communicate()[1][-3000:]}\nactor:\n{actor.communicate()[1][-3000:]}")
        assert learner.returncode == 0, err[-2000:]
        actor_out, actor_err = actor.communicate(timeout=60)
        assert actor.returncode == 0, actor_err[-2000:]
    finally:
        for proc in (learner, actor):
            proc.kill()
    report = json.loads(actor_out.strip().splitlines()[-1])
    final = Checkpoint(last)
    collector = final.trainer_state["collector"]
    replay, offline = final.algo_state["replay"], final.algo_state["offline"]

    # counted on both sides: what the second actor had acknowledged is exactly what the learner holds of it
    assert not report["learner_lost"]
    assert (report["unacknowledged_batches"] == 0) == (report["acknowledged_transitions"] == report["transitions"])
    assert collector["rows_by_session"][report["session"]] == report["acknowledged_transitions"] > 0
    assert sum(collector["rows_by_session"].values()) == collector["rows"] == replay["size"] >= 440
    assert len(collector["rows_by_session"]) == 2  # the killed actor's transitions stayed, the new one's joined
    assert collector["rows"] > held["rows"]  # the resumed learner took up where its checkpoint left off
    rows = torch.cat([replay["data"]["obs.state"], replay["data"]["action"]], 1)
    assert len(torch.unique(rows, dim=0)) == len(rows)  # no batch absorbed twice (resends after the kills)

    # the operator's steps are in the demonstration buffer with the operator's actions
    n = offline["size"]
    assert 0 < n < replay["size"]
    taken = offline["data"]["action"][:n].numpy()
    np.testing.assert_allclose(taken, operator_action(offline["data"]["obs.state"][:n].numpy()), atol=1e-6)
    online_rows = {tuple(r) for r in rows.numpy().round(6).tolist()}
    offline_rows = torch.cat([offline["data"]["obs.state"][:n], offline["data"]["action"][:n]], 1)
    assert all(tuple(r) in online_rows for r in offline_rows.numpy().round(6).tolist())  # and in the online one


def test_demonstrations_become_success_rewarded_transitions(tmp_path):
    record_demos("mujoco/Reach", 4, tmp_path, num_envs=4, progress=False)
    obs, action, reward, next_obs, terminated = load_demo_transitions(tmp_path, reward="success")
    assert len(action) == len(reward) == len(obs["state"]) == len(next_obs["state"]) > 0
    assert torch.equal(reward, terminated) and int(terminated.sum()) == 4  # each episode ends at its first success
    ends = terminated.nonzero().flatten()
    assert ends[-1] == len(reward) - 1
    starts = torch.cat([torch.zeros(1, dtype=torch.long), ends[:-1] + 1])
    for s, e in zip(starts.tolist(), ends.tolist()):
        assert torch.equal(next_obs["state"][s:e], obs["state"][s + 1:e + 1])  # steps of an episode chain
    env_obs, _, env_reward, _, env_terminated = load_demo_transitions(tmp_path, reward="env")
    assert len(env_reward) > len(reward) and not env_terminated.any()  # the whole episodes, the env's rewards


def test_bad_actor_and_learner_addresses_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        parse_address("localhost")
    actor = spawn("-m", "roborl.cli", "actor", "127.0.0.1:notaport")
    _, err = actor.communicate(timeout=60)
    assert actor.returncode == 2 and err.strip().splitlines() == ["roborl: error: '127.0.0.1:notaport' is not "
                                                                  "HOST:PORT (e.g. 127.0.0.1:7100)"]


def test_a_reward_machine_on_the_robot_is_one_line_error(tmp_path):
    learner = spawn("-m", "roborl.cli", "train", str(ROOT / "configs" / "hil_sac_push.yaml"),
                    "env.rm.ltlf=F(at_a)", f"train.run_dir={tmp_path}")
    _, err = learner.communicate(timeout=120)
    assert learner.returncode == 2 and err.strip().splitlines()[-1].startswith(
        "roborl: error: resources.actor robot: the robot's actor runs no reward machine"), err[-2000:]
    assert not list(tmp_path.iterdir())  # nothing half-written


def twin_processes() -> set[int]:
    """Pids of the twin processes running on this machine (an actor's own twin runs as `roborl.robot.twin`)."""
    pids = set()
    for proc in os.listdir("/proc"):
        try:
            with open(f"/proc/{proc}/cmdline", "rb") as f:
                if b"roborl.robot.twin" in f.read():
                    pids.add(int(proc))
        except (OSError, ValueError):
            continue
    return pids


@pytest.mark.parametrize("setting, error", [
    ("robot.operator=test_real_world_rl:no_such_rule",
     "roborl: error: robot.operator 'test_real_world_rl:no_such_rule': cannot import no_such_rule from "
     "test_real_world_rl (module 'test_real_world_rl' has no attribute 'no_such_rule')"),
    ("robot.reward=no/such/classifier", "roborl: error: 'no/such/classifier' is not a reward classifier written by "
                                        "`roborl reward-classifier` (No such file or directory: no/such/classifier)")])
def test_what_the_learners_own_actor_cannot_load_is_one_line_before_the_run(setting, error, tmp_path):
    before = twin_processes()
    learner = spawn("-m", "roborl.cli", "train", str(ROOT / "configs" / "hil_sac_push.yaml"), setting,
                    f"train.run_dir={tmp_path}")
    _, err = learner.communicate(timeout=120)
    assert learner.returncode == 2 and err.strip().splitlines() == [error], err[-2000:]
    assert not list(tmp_path.iterdir()) and twin_processes() == before  # nothing written, no robot started


def test_an_actor_that_cannot_load_its_operator_starts_no_robot(tmp_path):
    """An actor on another machine than its learner finds the operator missing there: it says so in one line
    and exits, and the twin it would have driven is never started (a twin left running would go on stepping)."""
    address = f"127.0.0.1:{free_port()}"
    config = tmp_path / "hil.yaml"
    config.write_text(yaml.safe_dump({
        "env": {"id": "mujoco/Reach", "num_envs": 1}, "policy": {"kind": "gaussian", "hidden": [32, 32]},
        "train": {"algorithm": "sac", "total_steps": 100, "rollout_steps": 20, "video": False, "progress": False,
                  "run_dir": str(tmp_path), "name": "hil", "threads": 1},
        "resources": {"actor": "robot"},
        "robot": {"learner": address, "spawn_actor": False, "operator": "test_real_world_rl:no_such_rule"}}))
    before = twin_processes()
    learner = spawn("-m", "roborl.cli", "train", str(config))
    try:
        wait_until(lambda: (tmp_path / "hil").exists(), 120, "the learner's run")
        actor = spawn("-m", "roborl.cli", "actor", address)
        _, err = actor.communicate(timeout=120)
    finally:
        learner.kill()
    leaked = twin_processes() - before
    for pid in leaked:
        os.kill(pid, signal.SIGKILL)
    assert actor.returncode == 2 and err.strip().splitlines() == [
        "roborl: error: robot.operator 'test_real_world_rl:no_such_rule': cannot import no_such_rule from "
        "test_real_world_rl (module 'test_real_world_rl' has no attribute 'no_such_rule')"], err[-2000:]
    assert not leaked


def test_the_link_resends_what_the_learner_lacks_and_forgets_what_it_acknowledged():
    rows = lambda n: {"reward": np.zeros(n, np.float32), "action": np.zeros((n, 2), np.float32)}  # noqa: E731
    learner = LearnerLink("127.0.0.1", 0, {"env": {}})
    learner.publish(1, {"w": np.ones(3, np.float32)})
    actor = ActorLink(learner.address, "s1", reconnect_s=10)
    assert actor.welcomed.wait(10) and actor.weights[0] == 1 and actor.config == {"env": {}}
    for n in (10, 10, 0, 5):  # the third: an episode that ended with a success right after a batch went out
        actor.send(rows(n) if n else {}, [{"success": 1.0}] if n == 0 else [])
    got = learner.take(25)
    assert [len(b["rows"].get("reward", ())) for b in got] == [10, 10, 0, 5] and learner.received == {"s1": 3}
    learner.acknowledge()
    wait_until(lambda: actor.unacknowledged() == 0, 10, "the acknowledgement")
    assert actor.acknowledged_rows == actor.sent_rows == 25

    actor.send(rows(7), [])  # the learner dies with this batch unacknowledged; a new one resumes from seq 3
    wait_until(lambda: learner.queued.get("s1") == 4, 10, "the batch")
    learner.close()
    resumed = LearnerLink("127.0.0.1", parse_address(learner.address)[1], {"env": {}})
    resumed.restore({"s1": 3})
    got = resumed.take(7)
    assert [b["seq"] for b in got] == [4] and resumed.batches.empty()  # resent once, nothing twice
    actor.close()
    resumed.close()


def test_a_learner_behind_its_actor_takes_the_whole_backlog():
    learner = LearnerLink("127.0.0.1", 0, {"env": {}})
    actor = ActorLink(learner.address, "s1", reconnect_s=10)
    assert actor.welcomed.wait(10)
    for _ in range(4):  # sent while the learner was updating
        actor.send({"reward": np.zeros(10, np.float32)}, [])
    wait_until(lambda: learner.queued.get("s1") == 3, 10, "the batches")
    got = learner.take(5)
    assert [b["seq"] for b in got] == [0, 1, 2, 3] and learner.received == {"s1": 3}
    actor.send({"reward": np.zeros(3, np.float32)}, [])
    actor.send({"reward": np.zeros(3, np.float32)}, [])
    got = learner.take(5)  # waits for the second batch: 3 transitions are fewer than asked for
    assert [b["seq"] for b in got] == [4, 5]
    actor.close()
    learner.close()


def test_sac_updates_for_at_most_the_rows_it_is_given_and_logs_the_ratio(tmp_path):
    """A robot learner slower than its robot absorbs the backlog with the updates of one iteration's worth
    of transitions: its update-to-data ratio falls (train/updates_per_transition) instead of its data aging."""
    from roborl.collect import EpisodeLog
    from roborl.runner import Runner

    cfg = config_from_dict({"env": {"id": "mujoco/Reach", "num_envs": 1},
                            "policy": {"kind": "gaussian", "hidden": [16, 16]},
                            "train": {"algorithm": "sac", "total_steps": 400, "rollout_steps": 20, "video": False,
                                      "progress": False, "run_dir": str(tmp_path), "name": "sac"},
                            "sac": {"seed_steps": 0, "batch_size": 16, "utd_ratio": 1.0}})
    algo = Runner(cfg).algo
    gen = torch.Generator().manual_seed(0)

    def part(n):
        state = lambda: {"state": torch.randn(n, 24, generator=gen)}  # noqa: E731
        return {"transitions": (state(), torch.rand(n, 4, generator=gen) * 2 - 1, torch.zeros(n), state(),
                                torch.zeros(n, dtype=torch.bool)), "env_rows": n}

    for update_rows, updates in ((20, 20), (None, 100)):
        before = algo.updates
        algo.absorb([part(60), part(40)], {}, EpisodeLog(), update_rows=update_rows)
        assert algo.updates - before == updates and algo.env_steps == 100
        stats = algo.iteration_stats()
        assert stats["transitions_absorbed"] == 100 and stats["updates_per_transition"] == updates / 100


def test_a_run_ends_when_its_collector_has_spent_the_budget(tmp_path):
    """A robot's iterations vary in size (each takes the backlog), so the collector says when train.total_steps
    are in, before the planned iterations are over."""
    from roborl.runner import Runner

    cfg = config_from_dict({"env": {"id": "mujoco/Reach", "num_envs": 1},
                            "policy": {"kind": "gaussian", "hidden": [16, 16]},
                            "train": {"algorithm": "sac", "total_steps": 400, "rollout_steps": 20, "eval_every": 100,
                                      "eval_episodes": 1, "eval_envs": 1, "video": False, "progress": False,
                                      "run_dir": str(tmp_path), "name": "sac"},
                            "sac": {"seed_steps": 1000}})
    runner = Runner(cfg)
    runner.collector.budget_spent = lambda: runner.iteration >= 3
    summary = runner.train()
    assert summary["iterations"] == 3 and summary["env_steps"] == 60  # of 20 planned iterations


def test_sac_trains_a_squashed_gaussian_with_demonstrations_in_its_second_buffer(tmp_path):
    from roborl.runner import Runner

    record_demos("mujoco/Reach", 3, tmp_path / "demos", num_envs=3, progress=False)
    demo_rows = len(load_demo_transitions(tmp_path / "demos")[1])
    cfg = config_from_dict({"env": {"id": "mujoco/Reach", "num_envs": 4},
                            "policy": {"kind": "gaussian", "hidden": [32, 32]},
                            "train": {"algorithm": "sac", "total_steps": 400, "rollout_steps": 25, "eval_every": 100,
                                      "eval_episodes": 2, "eval_envs": 2, "video": False, "progress": False,
                                      "run_dir": str(tmp_path), "name": "sac"},
                            "sac": {"seed_steps": 100, "batch_size": 32, "demos": str(tmp_path / "demos"),
                                    "critic_layer_norm": True}})
    runner = Runner(cfg)
    policy = runner.policy
    obs = runner.env.reset(seed=0)
    with torch.no_grad():
        action, log_prob, _ = policy.sample(obs)
        mean = policy.distribution(policy.features(obs)).mean
        assert torch.equal(policy.act(obs, deterministic=True).action, torch.tanh(mean))
    assert action.abs().max() < 1 and torch.isfinite(log_prob).all()
    algo = runner.algo
    assert sum(isinstance(m, torch.nn.LayerNorm) for m in algo.critic.modules()) == 4  # RLPD's critics: 2 × 2 hidden
    summary = runner.train()
    assert summary["env_steps"] == 400 and algo.updates > 0
    assert len(algo.offline) == demo_rows and len(algo.replay) == 400  # demos alone in the second buffer
    batch = sample_mixed(algo.replay, algo.offline, 64, 0.5, torch.Generator().manual_seed(0))
    demo_states = algo.offline.data["obs.state"][:demo_rows]
    from_demos = (batch["obs"]["state"][:, None] == demo_states[None]).all(-1).any(-1)
    assert int(from_demos.sum()) == 32  # RLPD: half of every batch from the demonstrations
