import subprocess
import sys

import pytest

from roborl.config import load_config
from roborl.errors import UserError


def test_yaml_and_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("env:\n  id: mujoco/Push\n  num_envs: 8\nalgo:\n  lr: 1\n")
    cfg = load_config(f, ["env.num_envs=16", "policy.hidden=[32,32]", "train.device=cpu"])
    assert cfg.env.id == "mujoco/Push" and cfg.env.num_envs == 16
    assert cfg.algo.lr == 1.0 and isinstance(cfg.algo.lr, float)
    assert cfg.policy.hidden == [32, 32] and cfg.train.device == "cpu"


def test_exponent_floats_without_a_dot_and_nested_sections():
    cfg = load_config(None, ["algo.lr=1e-4", "policy.kind=flow", "policy.fpo.samples=4"])
    assert cfg.algo.lr == 1e-4 and cfg.policy.fpo.samples == 4
    assert load_config(None, ["policy.kind=diffusion", "policy.dppo.clip_base=2e-3"]).policy.dppo.clip_base == 2e-3
    with pytest.raises(UserError, match=r"'algo.lr' must be float"):
        load_config(None, ["algo.lr=fast"])
    with pytest.raises(UserError, match=r"unknown config key 'policy.fpo.sample'; did you mean 'samples'"):
        load_config(None, ["policy.fpo.sample=4"])


@pytest.mark.parametrize("override,message", [
    ("algo.clp=0.3", r"unknown config key 'algo.clip'|unknown config key 'algo.clp'; did you mean 'clip'"),
    ("trian.seed=1", r"unknown config key 'trian'; did you mean 'train'"),
    ("env.num_envs=many", r"'env.num_envs' must be int, got str"),
    ("policy.hidden=64", r"'policy.hidden' must be a list of int"),
    ("algo.norm_adv=3", r"'algo.norm_adv' must be bool"),
    ("justtext", r"must look like key=value"),
    ("algo.clip_high=-0.1", r"config key 'algo.clip_high' must be > 0, got -0.1"),
    ("policy.dppo.finetune=3", r"unknown config key 'policy.dppo.finetune'; did you mean 'finetune_steps'"),
])
def test_bad_keys_and_types_are_named(override, message):
    with pytest.raises(UserError, match=message):
        load_config(None, [override])


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: [unclosed\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_config(bad)


def test_reading_a_config_does_not_import_the_policy_models():
    """A config error is reported before diffusers, transformers and the models load (seconds saved)."""
    code = ("import sys, roborl.config; heavy = [m for m in ('diffusers', 'transformers', 'roborl.policies.diffusion') "
            "if m in sys.modules]; assert not heavy, heavy; from roborl.policies import FlowPolicy; "
            "assert 'roborl.policies.flow' in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-500:]


def test_every_algorithm_and_policy_kind_is_registered_once():
    """The config's choices (what each algorithm and policy kind reads) name exactly what the code builds."""
    from roborl.algos import ALGORITHMS, algorithm_class
    from roborl.config_rules import ALGORITHM_READS, POLICY_READS

    assert list(ALGORITHM_READS) == list(ALGORITHMS)
    assert [algorithm_class(name).name for name in ALGORITHMS] == list(ALGORITHMS)
    assert set(POLICY_READS) == {"gaussian", "residual", "diffusion", "flow", "token_vla", "flow_vla", "pi0", "lerobot"}


@pytest.mark.parametrize("overrides,message", [
    (["algo.gamma=1.5"], "config key 'algo.gamma' must be in [0, 1], got 1.5"),
    (["algo.clip=-0.2"], "config key 'algo.clip' must be in (0, 1), got -0.2"),
    (["algo.epochs=0"], "config key 'algo.epochs' must be >= 1, got 0"),
    (["algo.lr=-0.001"], "config key 'algo.lr' must be > 0, got -0.001"),
    (["algo.lr=.nan"], "config key 'algo.lr' must be a finite number, got nan"),
    (["algo.gamma=.inf"], "config key 'algo.gamma' must be a finite number, got inf"),
    (["algo.minibatches=0"], "config key 'algo.minibatches' must be >= 1, got 0"),
    (["algo.minibatches=1000000"], "algo.minibatches (1000000) must be at most the rows of one rollout"),
    (["env.num_envs=1000000000"], "this run needs at least"),
    (["train.total_steps=2000", "train.rollout_steps=100000"], "train.total_steps (2000) is less than one iteration"),
    (["sac.lr=0.1"], "config key 'sac.lr' is not read by train.algorithm ppo (it is read by sac)"),
    (["policy.dppo.clip_base=0.1"], "config key 'policy.dppo.clip_base' is not read by policy.kind gaussian"),
    (["policy.hidden=[64, 0]"], "config key 'policy.hidden[1]' must be >= 1, got 0"),
    (["train.best_metric=loss"], "train.best_metric 'loss' is unknown; available: auto, success, return"),
    (["train.algorithm=sac", "resources.learners=3", "env.num_envs=6"],
     "sac.batch_size (256) must be divisible by resources.learners (3)"),
    (["train.algorithm=bc", "resources.env_workers=2", "env.num_envs=16"],
     "train.algorithm bc learns from demonstrations and steps no envs"),
    (["train.algorithm=grpo", "resources.learners=2", "env.num_envs=16"],
     "GRPO's vary with its episodes and dynamic sampling"),
])
def test_values_are_checked_where_they_are_declared(overrides, message):
    with pytest.raises(UserError) as err:
        load_config(None, overrides)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_replay_of_images_that_cannot_fit_is_refused_before_anything_is_allocated():
    """SAC's replay keeps each transition's observation and next observation: with images a buffer that fits
    as states does not (it would be killed for memory once filled, or swap for minutes first)."""
    replay = ["train.algorithm=sac", "sac.buffer_size=10000000", "env.num_envs=1"]
    load_config(None, replay)
    with pytest.raises(UserError, match=r"this run needs at least \d+\.\d GiB \(.*sac.buffer_size=10000000, 128×128 rgb "
                                        r"observations\), more than the .* GiB this machine has available"):
        load_config(None, [*replay, "env.obs_mode=rgb"])


@pytest.mark.parametrize("content,message", [
    (b"\x8b\x1f\xff\xfe binary", "is not UTF-8 text"),
    (b"- env\n- train\n", "must hold a mapping of sections"),
    (b"", "is empty"),
    (b"   \n# only a comment\n", "is empty"),
])
def test_unreadable_files_are_refused(tmp_path, content, message):
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    with pytest.raises(UserError, match=message):
        load_config(path)
    with pytest.raises(UserError, match="is a directory"):
        load_config(tmp_path)
