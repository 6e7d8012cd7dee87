"""Bad input: one line that says what is wrong, exit code 2, no traceback, nothing written."""
import importlib.util
import json

import pytest
from helpers import ROOT, roborl, roborl_in_process

from roborl.checkpoint import Checkpoint
from roborl.config import load_config
from roborl.errors import UserError
from roborl.runner import Runner

REACH = str(ROOT / "configs" / "ppo_reach.yaml")


def assert_one_line_error(proc, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("roborl: error: ")
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("overrides,fragments", [
    (["algo.lerning_rate=0.1"], ["unknown config key 'algo.lerning_rate'", "valid keys here"]),
    (["algo.clp=0.1"], ["unknown config key 'algo.clp'", "did you mean 'clip'"]),
    (["env.num_envs=lots"], ["'env.num_envs' must be int"]),
    (["env.id=mujoco/Pusj"], ["unknown environment 'mujoco/Pusj'", "did you mean mujoco/Push", "mujoco/Stack"]),
    (["env.id=isaac/Lift"], ["unknown environment 'isaac/Lift'", "available:"]),
    (["env.id=isaaclab/Isaac-Lift-Cube-Franka-v0"], ["Isaac Lab is not installed", "Python 3.12 and a CUDA GPU"]),
    (["env.controller=torque"], ["unknown controller 'torque'", "ee_delta_pos"]),
    (["train.device=cuda:3"], ["no CUDA device"]),
    (["policy.kind=transformer"], ["policy.kind 'transformer' is unknown", "diffusion, flow"]),
    (["policy.kind=flow", "policy.rl_mode=dppo"], ["'dppo' does not apply to flow", "flow_noise"]),
    (["env.action_chunk=4"], ["needs a chunk-predicting policy"]),
    (["policy.kind=flow", "env.action_chunk=4", "policy.horizon=2"], ["policy.horizon (2) must be >= env.action_chunk (4)"]),
    (["policy.kind=diffusion", "policy.init=/nonexistent.safetensors"],
     ["policy.init '/nonexistent.safetensors' does not exist: train it first"]),
    (["policy.init_modules=[backbone]"], ["policy.init_modules ['backbone'] takes parts of policy.init, which is unset"]),
    (["env.task_weights.push=2"], ["env.task_weights weighs the tasks of a multi-task env", "mujoco/Reach samples no tasks"]),
    (["env.id=mujoco/LangTabletopFixed-ReachPushLift", "env.obs_mode=state", "env.task_weights.stack=2"],
     ["env.task_weights: task weights name ['stack']", "its tasks: reach, push, lift"]),
    (["env.task_weights=[2, 1]"], ["'env.task_weights' must be a mapping of str to float"]),
])
def test_bad_config_is_one_line(tmp_path, overrides, fragments):
    proc = roborl_in_process("train", REACH, f"train.run_dir={tmp_path}", "train.name=bad", *overrides)
    assert_one_line_error(proc, *fragments)
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").rglob("*.safetensors"))


def test_missing_config_file(tmp_path):
    """Through the real executable: its exit status and stderr (the other checks call the CLI in this process)."""
    assert_one_line_error(roborl("train", str(tmp_path / "none.yaml")), "does not exist")


def test_corrupt_checkpoint_is_refused(tmp_path):
    bad = tmp_path / "last.safetensors"
    bad.write_bytes(b"\x00garbage" * 100)
    assert_one_line_error(roborl_in_process("eval", str(bad)), str(bad), "corrupt")
    assert_one_line_error(roborl_in_process("train", f"resume={bad}"), str(bad), "corrupt")
    assert_one_line_error(roborl_in_process("eval", str(tmp_path / "missing.safetensors")), "does not exist")


def test_resume_past_the_time_budget_is_refused(tmp_path):
    """train.max_minutes counts the run's whole wall time, so carrying on a run it stopped needs a larger one."""
    run = roborl_in_process("train", REACH, f"train.run_dir={tmp_path}", "train.name=r", "env.num_envs=8",
                            "train.rollout_steps=10", "train.total_steps=160", "train.eval_episodes=8", "train.video=false",
                            "train.progress=false", "train.max_minutes=0.0001")
    assert run.returncode == 0, run.stderr[-2000:]
    last = tmp_path / "r" / "checkpoints" / "last.safetensors"
    assert Checkpoint(last).trainer_state["iteration"] == 1  # the budget stopped it after one of two iterations
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["finished"] is True  # its budget is its end
    before = last.read_bytes()
    assert_one_line_error(roborl_in_process("train", f"resume={last}", "train.total_steps=400"),
                          "spends train.max_minutes=0.0001", "across resumes", "carry it on with a larger one")
    assert last.read_bytes() == before
    again = roborl_in_process("train", f"resume={last}", "train.max_minutes=5", "train.progress=false")
    assert again.returncode == 0, again.stderr[-2000:]
    assert Checkpoint(last).trainer_state["iteration"] == 2


def test_missing_video_writer_is_refused_before_the_run_starts(tmp_path, monkeypatch):
    """Without imageio-ffmpeg, imageio hands the mp4 to another plugin that fails after the first eval's
    episodes; the trainer says what is missing before it makes the run directory."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr("roborl.evaluate.importlib.util.find_spec",
                        lambda name, *a: None if name == "imageio_ffmpeg" else find_spec(name, *a))
    cfg = load_config(REACH, [f"train.run_dir={tmp_path}", "train.name=novideo"])
    with pytest.raises(UserError, match=r"pip install imageio-ffmpeg .*train\.video=false") as err:
        Runner(cfg)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "novideo").exists()
    assert importlib.util.find_spec("imageio_ffmpeg") is None  # the patch is what the trainer saw


def test_no_offscreen_gl_is_one_line_with_the_fix(tmp_path, monkeypatch):
    """A machine without EGL fails in MuJoCo's renderer; camera observations say what to install, no traceback."""
    def no_gl(*args, **kwargs):
        raise RuntimeError("gladLoadGL error")

    monkeypatch.setattr("mujoco.gl_context.GLContext", no_gl)
    proc = roborl_in_process("demos", "Push", "--episodes", "1", "--envs", "1", "--rgb", "--quiet",
                             "--out", str(tmp_path / "demos"))
    assert_one_line_error(proc, "MuJoCo could not open an offscreen GL context (gladLoadGL error)",
                          "apt-get install libegl1 libgl1", "MUJOCO_GL=osmesa")
    assert not (tmp_path / "demos").exists()  # nothing half-written, not even the folder


def test_checkpoint_messages_say_what_is_wrong(tmp_path):
    """A directory, a policy-only checkpoint given to resume, and weights that do not fit their config are each
    one line that says which and what to do."""
    import torch

    from roborl.builder import build
    from roborl.checkpoint import save_checkpoint
    from roborl.config import config_to_dict

    assert_one_line_error(roborl_in_process("eval", str(tmp_path)), "is a directory, not a checkpoint file")
    cfg = load_config(REACH, ["env.num_envs=2"])
    env, policy = build(cfg, torch.device("cpu"))
    env.close()
    bare = tmp_path / "bare.safetensors"
    save_checkpoint(bare, policy, None, config_to_dict(cfg), {})
    assert_one_line_error(roborl_in_process("train", f"resume={bare}"), "holds a policy without the state of a training run",
                          f"policy.init={bare}")
    other = config_to_dict(load_config(REACH, ["env.num_envs=2", "policy.hidden=[32, 32]"]))
    mismatch = tmp_path / "mismatch.safetensors"
    save_checkpoint(mismatch, policy, None, other, {})
    assert_one_line_error(roborl_in_process("eval", str(mismatch), "--episodes", "2", "--envs", "2"), "does not fit this policy: "
                          "size mismatch for ", "more)")


def test_an_optimizer_state_that_does_not_fit_the_runs_parameters_is_one_line(tmp_path):
    """Resuming where the optimizer's parameter groups differ (another roborl's trainable parameters, or a
    critic_lr that splits them) is refused in one line that says how to start from the weights instead."""
    import torch

    from roborl.algos import make_algorithm
    from roborl.builder import build
    from roborl.checkpoint import save_checkpoint
    from roborl.config import config_to_dict

    cfg = load_config(REACH, ["env.num_envs=2"])
    split = load_config(REACH, ["env.num_envs=2", "algo.critic_lr=1e-3"])
    env, policy = build(cfg, torch.device("cpu"))
    saved = make_algorithm(split, policy, env, torch.device("cpu"))
    path = tmp_path / "split.safetensors"
    save_checkpoint(path, policy, saved.state_dict(), config_to_dict(split), {})
    with pytest.raises(UserError, match=r"optimizer state that does not fit .*policy\.init=") as err:
        Checkpoint(path).load_algo(make_algorithm(cfg, policy, env, torch.device("cpu")))
    env.close()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("args,fragments", [
    (["eval", "x.safetensors", "--episodes", "abc"], ["roborl eval: argument --episodes: invalid int value: 'abc'",
                                                       "see roborl eval --help"]),
    (["bc"], ["roborl bc: the following arguments are required: config"]),
    (["train"], ["needs a config file", "or resume=PATH"]),
    (["train", "resume="], ["needs a config file"]),
    (["train", REACH, "train=5"], ["config section 'train' must be a mapping, got 5"]),
    (["serve", "x.pt", "--port", "70000"], ["--port must be in 0..65535"]),
    (["serve", "x.pt", "--max-batch", "0"], ["--max-batch must be >= 1"]),
    (["actor", "127.0.0.1:99999"], ["the port must be in 0..65535"]),
    (["demos", "Push", "--episodes", "0", "--out", "unused"], ["--episodes must be >= 1"]),
    (["demos", "Push", "--noise", "-1", "--out", "unused"], ["--noise is a standard deviation: it must be >= 0"]),
    (["demos", "Push", "--rgb", "--size", "0", "--out", "unused"], ["--size must be >= 8 pixels"]),
    (["reward-classifier", "unused", "--out", "unused", "--epochs", "0"], ["--epochs must be >= 1"]),
])
def test_a_bad_command_line_is_one_line_before_any_work(args, fragments):
    """argparse's own errors, a missing config, and numbers out of their range: refused in one line, exit 2."""
    assert_one_line_error(roborl_in_process(*args), *fragments)


def test_a_config_file_with_a_bad_section_is_refused_even_under_an_override(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("train: 5\n")
    assert_one_line_error(roborl_in_process("train", str(config), "train.seed=1"), "config section 'train' must be a mapping")


def test_outputs_that_cannot_be_written_are_refused_before_the_work(tmp_path):
    """A path under a file, a file where a folder goes and the reverse: refused at once, nothing recorded or written."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep")
    assert_one_line_error(roborl_in_process("demos", "Push", "--episodes", "1", "--envs", "1", "--quiet", "--out",
                                            str(a_file)), f"--out: '{a_file}' is a file; give a folder")
    assert_one_line_error(roborl_in_process("eval", "x.safetensors", "--video-path", str(a_file / "v.mp4")),
                          f"--video-path: '{a_file}' is a file, so nothing can be written under it")
    assert_one_line_error(roborl_in_process("export", "x.safetensors", "--out", str(tmp_path)),
                          f"--out: '{tmp_path}' is a folder; give a file")
    assert a_file.read_text() == "keep" and [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_recording_over_existing_demos_is_refused_and_keeps_them(tmp_path):
    first = roborl_in_process("demos", "Reach", "--episodes", "1", "--envs", "1", "--quiet", "--out", str(tmp_path))
    assert first.returncode == 0, first.stderr
    recorded = (tmp_path / "demos.hdf5").read_bytes()
    assert_one_line_error(roborl_in_process("demos", "Reach", "--episodes", "2", "--envs", "1", "--quiet", "--out",
                                            str(tmp_path)), "demos.hdf5' exists", "record to a new --out directory")
    assert (tmp_path / "demos.hdf5").read_bytes() == recorded


def test_an_os_error_nobody_foresaw_is_one_line_with_its_path(tmp_path, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device", str(tmp_path / "demos.hdf5"))

    monkeypatch.setattr("roborl.demos.record_demos", full_disk)
    assert_one_line_error(roborl_in_process("demos", "Reach", "--out", str(tmp_path)),
                          f"'{tmp_path / 'demos.hdf5'}': No space left on device", "free space")
