"""Demonstrations on disk (robomimic-style HDF5), BC from them through the CLI, and RL fine-tuning that
starts from the BC checkpoint."""
import json
import shutil

import h5py
import pytest
import torch
from helpers import ROOT, roborl_in_process

from roborl.demos import load_demos, record_demos
from roborl.demos_hdf5 import demos_file
from roborl.errors import UserError


@pytest.fixture(scope="module")
def reach_demos(tmp_path_factory):
    out = tmp_path_factory.mktemp("demos") / "reach"
    proc = roborl_in_process("demos", "Reach", "--episodes", "40", "--out", str(out), "--envs", "20", "--quiet")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["episodes"] == 40 and result["success_rate"] >= 0.95
    return out


def test_demo_file_layout(reach_demos):
    with h5py.File(reach_demos / "demos.hdf5") as f:
        data = f["data"]
        assert data.attrs["num_episodes"] == 40 and data.attrs["total"] == 40 * 50
        env_args = json.loads(data.attrs["env_args"])
        assert env_args["env_id"] == "mujoco/Reach" and env_args["controller"] == "ee_delta_pos"
        demo = data["demo_0"]
        assert demo["obs/state"].shape == (50, 24) and demo["obs/state"].dtype == "float32"
        assert demo["actions"].shape == (50, 4) and abs(demo["actions"][()]).max() <= 1
        assert demo["dones"][()].tolist() == [False] * 49 + [True]
        assert demo.attrs["instruction"] and bool(demo.attrs["success"]) == bool(demo["success"][-1])


def test_windows_pad_history_and_future_within_each_episode(reach_demos):
    w = load_demos(reach_demos, obs_history=3, horizon=4, max_episodes=2)
    assert w.episodes == 2 and w.obs.shape == (100, 72) and w.actions.shape == (100, 4, 4)
    with h5py.File(reach_demos / "demos.hdf5") as f:
        s0, a0 = torch.from_numpy(f["data/demo_0/obs/state"][()]), torch.from_numpy(f["data/demo_0/actions"][()])
        s1 = torch.from_numpy(f["data/demo_1/obs/state"][()])
    assert torch.equal(w.obs[0], torch.cat([s0[0], s0[0], s0[0]]))  # padded with the first state
    assert torch.equal(w.obs[7], torch.cat([s0[5], s0[6], s0[7]]))
    assert torch.equal(w.obs[50], torch.cat([s1[0], s1[0], s1[0]]))  # never crosses into the previous episode
    assert torch.equal(w.actions[49], a0[49].expand(4, -1))  # padded with the last action
    assert torch.equal(w.actions[10], a0[10:14])


def test_bad_demo_files_are_clear_errors(tmp_path):
    with pytest.raises(UserError, match="roborl demos TASK"):
        load_demos(tmp_path / "nothing")
    (tmp_path / "demos.hdf5").write_bytes(b"not hdf5 at all")
    with pytest.raises(UserError, match="not a readable HDF5"):
        load_demos(tmp_path)
    with pytest.raises(UserError, match="no scripted expert"):
        record_demos("gym/Pusher-v5", 1, tmp_path / "x")
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())
    named = tmp_path / "demos.h5"  # an existing file is read whatever its name
    named.write_bytes(b"not hdf5 at all")
    with pytest.raises(UserError, match=f"demonstrations '{named}' are not a readable HDF5"):
        load_demos(named)


def test_demo_files_from_elsewhere_name_what_they_lack(reach_demos, tmp_path):
    """A group that is not an episode, or an episode without states: one UserError naming it, for every reader."""
    from roborl.demos import load_demo_transitions
    from roborl.reward_classifier import labelled_frames

    foreign, stateless = tmp_path / "foreign.hdf5", tmp_path / "stateless.hdf5"
    for path in (foreign, stateless):
        shutil.copy(demos_file(reach_demos), path)
    with h5py.File(foreign, "a") as f:
        f["data"].create_group("episode")
    with h5py.File(stateless, "a") as f:
        del f["data/demo_0/obs/state"]
    for read in (load_demos, load_demo_transitions, labelled_frames):
        with pytest.raises(UserError, match="'data/episode', which is not an episode"):
            read(foreign)
        with pytest.raises(UserError, match="episode 'demo_0' has no .*obs/state"):
            read(stateless)


@pytest.mark.learning
def test_bc_then_rl_fine_tuning_through_the_cli(reach_demos, tmp_path):
    common = [f"train.run_dir={tmp_path}", "train.progress=false", "env.id=mujoco/Reach", "env.obs_history=1",
              "env.action_chunk=2", "policy.horizon=4", "train.eval_episodes=32", "train.eval_envs=32"]
    proc = roborl_in_process("bc", str(ROOT / "configs" / "bc_flow_push.yaml"), *common, "train.name=bc",
                             f"bc.demos={reach_demos}", "bc.max_episodes=40", "bc.steps=1500", "bc.eval_every=1500",
                             "policy.hidden=[128,128]")
    assert proc.returncode == 0, proc.stderr[-2000:]
    bc = json.loads((tmp_path / "bc" / "summary.json").read_text())
    assert bc["success_rate"] >= 0.5, bc  # the cloned policy reaches
    assert (tmp_path / "bc" / "eval_curve.png").stat().st_size > 1000
    init = tmp_path / "bc" / "checkpoints" / "last.safetensors"
    for mode in ("flow_noise", "flow_sde", "fpo"):
        proc = roborl_in_process("train", str(ROOT / "configs" / f"{mode}_push.yaml"), *common, f"train.name={mode}",
                                 f"policy.init={init}", "policy.hidden=[128,128]", "env.num_envs=16", "train.rollout_steps=8",
                                 "train.total_steps=512", "train.eval_every=2", "train.video=false", "algo.critic_warmup=1")
        assert proc.returncode == 0, (mode, proc.stderr[-2000:])
        summary = json.loads((tmp_path / mode / "summary.json").read_text())
        first = summary["eval_history"][0]
        assert first[0] == 0 and abs(first[2] - bc["success_rate"]) <= 0.1, (mode, summary)  # starts at BC
        assert summary["env_steps"] == 512


def test_rl_init_that_does_not_fit_is_one_line(reach_demos, tmp_path):
    proc = roborl_in_process("bc", str(ROOT / "configs" / "bc_flow_push.yaml"), f"train.run_dir={tmp_path}", "train.name=bc",
                             "env.id=mujoco/Reach", f"bc.demos={reach_demos}", "bc.steps=10", "bc.eval_every=10",
                             "train.eval_episodes=2", "train.progress=false")
    assert proc.returncode == 0, proc.stderr[-2000:]
    init = tmp_path / "bc" / "checkpoints" / "last.safetensors"
    proc = roborl_in_process("train", str(ROOT / "configs" / "flow_noise_push.yaml"), f"train.run_dir={tmp_path}",
                             "env.id=mujoco/Reach", f"policy.init={init}", "policy.hidden=[64,64]", "train.name=rl")
    assert proc.returncode == 2 and "does not fit this policy" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    proc = roborl_in_process("train", str(ROOT / "configs" / "ppo_reach.yaml"), f"train.run_dir={tmp_path}",
                             f"policy.init={init}", "train.name=gaussian")  # a flow policy's weights
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "size mismatch for" in proc.stderr and "give policy the kind and sizes it was trained with" in proc.stderr
    proc = roborl_in_process("bc", str(ROOT / "configs" / "bc_flow_push.yaml"), f"train.run_dir={tmp_path}", "train.name=bc2",
                             f"bc.demos={reach_demos}")
    assert proc.returncode == 2 and "recorded on 'mujoco/Reach'" in proc.stderr, proc.stderr


def test_bc_runs_on_the_runner_and_resumes(reach_demos, tmp_path):
    """BC is an algorithm of the one runner: its checkpoints hold the training state, so `resume=` with a larger
    bc.steps carries the same optimizer and schedule on; the logs' x-axis is gradient steps."""
    from test_training import scalars

    from roborl.checkpoint import Checkpoint

    common = [f"train.run_dir={tmp_path}", "train.name=bc", "env.id=mujoco/Reach", f"bc.demos={reach_demos}",
              "bc.eval_every=10", "train.eval_episodes=2", "train.eval_envs=2", "train.progress=false"]
    first = roborl_in_process("bc", str(ROOT / "configs" / "bc_flow_push.yaml"), *common, "bc.steps=20")
    assert first.returncode == 0, first.stderr[-2000:]
    last = tmp_path / "bc" / "checkpoints" / "last.safetensors"
    state = Checkpoint(last)
    assert state.trainer_state["iteration"] == 2 and state.trainer_state["step"] == 20
    assert state.algo_state["bc_step"] == 20 and state.trainer_state["env_steps"] == 0
    more = roborl_in_process("train", f"resume={last}", "bc.steps=40", "train.progress=false")
    assert more.returncode == 0, more.stderr[-2000:]
    summary = json.loads((tmp_path / "bc" / "summary.json").read_text())
    assert summary["bc_steps"] == 40 and summary["iterations"] == 4 and summary["demo_episodes"] == 40
    adam = Checkpoint(last).algo_state["optimizer"]["state"][0]
    assert float(adam["step"]) == 40  # one optimizer across both sittings
    assert [s for s, _ in scalars(tmp_path / "bc", "train/loss")] == [10, 20, 30, 40]
    assert [s for s, _, _ in summary["eval_history"]] == [10, 20, 30, 40]


def test_dart_executes_the_noisy_action_and_records_the_experts(tmp_path):
    def record(name: str, **kw) -> tuple[torch.Tensor, torch.Tensor]:
        record_demos("mujoco/Reach", 4, tmp_path / name, num_envs=4, seed=5, progress=False, episode_length=5, **kw)
        with h5py.File(tmp_path / name / "demos.hdf5") as f:
            return torch.from_numpy(f["data/demo_0/actions"][()]), torch.from_numpy(f["data/demo_0/obs/state"][()])

    clean_a, clean_s = record("clean")
    dart_a, dart_s = record("dart", action_noise=0.3, dart=True)
    noisy_a, _ = record("noisy", action_noise=0.3)
    assert torch.equal(dart_a[0], clean_a[0])  # the first state is the same: the expert's action is recorded
    assert not torch.allclose(noisy_a[0], clean_a[0], atol=1e-3)  # without dart the noisy action is
    assert not torch.allclose(dart_s[1], clean_s[1], atol=1e-4)  # ... while the noisy one was executed
    with pytest.raises(UserError, match="--noise"):
        record_demos("mujoco/Reach", 1, tmp_path / "x", dart=True, progress=False)


def test_the_same_recording_twice_gives_identical_demos(tmp_path):
    """Demos are a function of their arguments (seed included): recorded twice with images, noise and DART, every
    dataset is bit-identical, so an SFT trained on them twice on one machine gives the same weights; another seed
    records others."""
    def datasets(name: str, seed: int) -> dict[str, bytes]:
        record_demos("mujoco/LangTabletopFixed-ReachPushLift", 4, tmp_path / name, num_envs=2, seed=seed, rgb=True,
                     action_noise=0.3, dart=True, episode_length=8, progress=False)
        found: dict[str, bytes] = {}
        with h5py.File(tmp_path / name / "demos.hdf5") as f:
            f.visititems(lambda key, item: found.update({key: item[()].tobytes()}) if isinstance(item, h5py.Dataset)
                         else None)
        return found

    first, again, other = datasets("a", 0), datasets("b", 0), datasets("c", 1)
    assert any(key.endswith("obs/rgb") for key in first), sorted(first)
    assert first == again
    assert first.keys() == other.keys() and any(first[key] != other[key] for key in first)
