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
    cfg = load_config(None, ["algo.lr=1e-4", "policy.kind=flow", "policy.fpo.samples=4", "policy.dppo.clip_base=2e-3"])
    assert cfg.algo.lr == 1e-4 and cfg.policy.fpo.samples == 4 and cfg.policy.dppo.clip_base == 2e-3
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
    ("algo.clip_high=-0.1", r"algo.clip_high must be positive"),
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
