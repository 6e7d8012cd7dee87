"""A run SIGKILLed at random moments, some of them while a checkpoint is being written, and carried on each
time as a user would: the same command while it has no checkpoint yet, `resume=` after. The counters only
grow, every kill leaves a readable checkpoint (or none yet), the run finishes its budget, TensorBoard has one
point per step, `summary.json` agrees with the checkpoint, the wall time counts the killed segments too, and
no temporary file is left behind."""
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

from helpers import ROOT, roborl_in_process, wait_until
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from roborl.checkpoint import Checkpoint

REACH = str(ROOT / "configs" / "ppo_reach.yaml")
KILLS = 12


def kill_at(proc: subprocess.Popen, seconds: float, checkpoints, during_write: bool) -> bool:
    """SIGKILL `proc` after `seconds`, or (`during_write`) at the first moment a checkpoint is being written over
    an earlier one: the kill that could lose the whole run if saving were not atomic. How long a run takes to
    reach its first checkpoint depends on the machine (imports, compiled kernels), so these kills wait for it.
    Whether the kill was sent while a checkpoint's temporary file was there."""
    deadline = time.time() + (120 if during_write else seconds)
    writing = False
    while time.time() < deadline and proc.poll() is None:
        writing = (checkpoints / "last.safetensors").exists() and any(checkpoints.glob(".*.tmp-*"))
        if during_write and writing:
            break
        time.sleep(0.0005 if during_write else 0.01)
    killed = proc.poll() is None
    if killed:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return killed and writing


def test_killed_anywhere_the_run_carries_on(tmp_path):
    command = ["train", REACH, f"train.run_dir={tmp_path}", "train.name=r", "env.num_envs=8",
               "train.rollout_steps=10", "train.total_steps=8000", "train.save_every=1", "train.eval_every=7",
               "train.eval_episodes=8", "train.eval_envs=8", "train.video=false", "train.progress=false"]
    run = tmp_path / "r"
    last = run / "checkpoints" / "last.safetensors"
    rng = random.Random(0)
    seen = {"iteration": 0, "env_steps": 0, "wall_time_s": 0.0}
    clocks = []
    during_writes = 0
    for kill in range(KILLS):
        args = ["train", f"resume={last}", "train.progress=false"] if last.exists() else command
        proc = subprocess.Popen([sys.executable, "-m", "roborl.cli", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        during_writes += kill_at(proc, rng.uniform(0.5, 6.0), run / "checkpoints", during_write=kill % 3 == 2)
        assert proc.returncode in (-signal.SIGKILL, 0), proc.stderr.read().decode()[-2000:]
        if (run / "clock.json").exists():
            clocks.append(json.loads((run / "clock.json").read_text())["wall_time_s"])
        if proc.returncode != 0 and (run / "summary.json").exists():  # the run so far, unless it had ended
            summary = json.loads((run / "summary.json").read_text())  # (a kill can land as a finished run exits)
            assert summary["finished"] is False or summary["env_steps"] == 8000, summary
        if last.exists():
            state = Checkpoint(last).trainer_state  # whole and readable, whenever the kill came
            for key in seen:
                assert state[key] >= seen[key], (kill, key, state[key], seen[key])
                seen[key] = state[key]
    assert during_writes >= 1 and seen["iteration"] > 0, (during_writes, seen)  # a kill in a write, at least

    refused = roborl_in_process(*command)  # the same command once a checkpoint exists: what to run instead
    assert refused.returncode == 2 and f"continue it with resume={last}" in refused.stderr, refused.stderr
    done = roborl_in_process("train", f"resume={last}", "train.progress=false")
    assert done.returncode == 0, done.stderr[-2000:]

    summary = json.loads((run / "summary.json").read_text())
    state = Checkpoint(last).trainer_state
    assert summary["finished"] is True
    assert summary["env_steps"] == state["env_steps"] == 8000 and summary["iterations"] == state["iteration"] == 100
    assert summary["wall_time_s"] >= round(max(clocks), 2) >= round(seen["wall_time_s"], 2)  # killed segments count
    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    for tag in acc.Tags()["scalars"]:
        steps = [e.step for e in acc.Scalars(tag)]
        assert len(steps) == len(set(steps)), (tag, sorted(s for s in steps if steps.count(s) > 1))
    assert [e.step for e in acc.Scalars("train/policy_loss")] == list(range(80, 8001, 80))
    assert not list(run.rglob(".*.tmp-*")) and not list(run.rglob("*.tmp"))


def test_a_resumed_run_made_in_its_predecessors_second_keeps_its_points(tmp_path):
    """TensorBoard reads event files in name order (creation second, host, process id). A killed predecessor
    whose file sorts after the resumed run's would purge the resumed run's points as it is read."""
    from roborl.logger import Logger

    predecessor = Logger(tmp_path, 10, progress=False, purge_step=5)
    for step in (5, 6):
        predecessor.scalars("train", {"loss": 1.0}, step)
    predecessor.close()
    (written,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    written.rename(written.with_name(f"events.out.tfevents.{int(time.time()) + 1}.{socket.gethostname()}.99999999.0"))

    resumed = Logger(tmp_path, 10, 4, progress=False, purge_step=5)
    for step in range(5, 11):
        resumed.scalars("train", {"loss": 2.0}, step)
    resumed.close()

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(step, 2.0) for step in range(5, 11)]


def test_sigterm_saves_the_run_where_it_stands(tmp_path):
    """A scheduler's SIGTERM (preemption, `timeout`) is handled as Ctrl-C: the run saves its `last` checkpoint at
    the iteration it reached, though no periodic save was due, says it is not finished, exits 0, and carries on
    from there."""
    run = tmp_path / "r"
    proc = subprocess.Popen(
        [sys.executable, "-m", "roborl.cli", "train", REACH, f"train.run_dir={tmp_path}", "train.name=r",
         "env.num_envs=8", "train.rollout_steps=10", "train.total_steps=800000", "train.save_every=100000",
         "train.eval_every=100000", "train.video=false", "train.progress=false"], cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    clock = run / "clock.json"  # written (atomically) at the end of every iteration
    wait_until(clock.exists, 120, "the run's first iteration")
    first = clock.read_text()
    wait_until(lambda: clock.read_text() != first, 120, "the run's second iteration")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    state = Checkpoint(run / "checkpoints" / "last.safetensors").trainer_state
    assert summary["finished"] is False and summary["iterations"] == state["iteration"] > 1
    assert summary["env_steps"] == state["env_steps"] == 80 * state["iteration"]
    done = roborl_in_process("train", f"resume={run / 'checkpoints' / 'last.safetensors'}", "train.total_steps="
                             f"{state['env_steps'] + 160}", "train.progress=false")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((run / "summary.json").read_text())["iterations"] == state["iteration"] + 2
