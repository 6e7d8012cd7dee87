"""`roborl export`: artifacts reproduce the policies (torch and onnxruntime, ≤ 1e-5), run without
roborl, carry their shields and metadata, and refuse what they cannot reproduce."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from deploy_helpers import write_checkpoint
from helpers import roborl_in_process

from roborl.builder import make_env, make_policy, make_shield
from roborl.checkpoint import Checkpoint
from roborl.config import config_from_dict
from roborl.deploy.artifact import Artifact
from roborl.deploy.export import export_checkpoint
from roborl.errors import UserError

FORMATS = ["torchscript", "onnx"]


def rollout_states(cfg, steps: int = 12, envs: int = 8) -> dict[str, torch.Tensor]:
    """Observations the policy meets: a few random-action steps of its own env (history included)."""
    env = make_env(cfg.env, envs, 3, torch.device("cpu"))
    obs = env.reset(seed=3)
    gen = torch.Generator().manual_seed(0)
    seen = []
    for _ in range(steps):
        seen.append({k: v for k, v in obs.items() if k in ("state", "rgb")})
        shape = (envs, *env.action_space.shape)
        obs, *_ = env.step(torch.rand(shape, generator=gen) * 2 - 1)
    env.close()
    return {k: torch.cat([o[k] for o in seen]) for k in seen[0]}


def framework_actions(path, obs) -> torch.Tensor:
    """What the policy does in roborl: deterministic act, the executed K actions, then the env's shields."""
    ckpt = Checkpoint(path)
    cfg = config_from_dict(ckpt.config)
    env = make_env(cfg.env, 1, 0, torch.device("cpu"))
    policy = make_policy(cfg.policy, env, cfg.env.action_chunk)
    ckpt.load_policy(policy)
    shield = make_shield(cfg.env, env.unwrapped)
    frame = env.unwrapped.observation_space["state"].shape[0]
    env.close()
    with torch.no_grad():
        action = policy.eval().act(obs, deterministic=True).action
    action = (action if action.dim() == 3 else action[:, None])[:, :cfg.env.action_chunk].clamp(-1, 1)
    if shield is not None:
        newest = {"state": obs["state"][:, -frame:]}
        action = torch.stack([shield(newest, action[:, k])[0] for k in range(action.shape[1])], 1)
    return action


@pytest.mark.parametrize("kind", ["gaussian", "diffusion", "flow", "rgb"])
def test_exported_artifacts_reproduce_the_policy(tmp_path, kind):
    ckpt = write_checkpoint(tmp_path, kind)
    cfg = config_from_dict(Checkpoint(ckpt).config)
    obs = rollout_states(cfg, steps=3 if kind == "rgb" else 12)
    expected = framework_actions(ckpt, obs).numpy()
    for fmt in FORMATS:
        meta = export_checkpoint(ckpt, fmt, tmp_path / f"{kind}.{fmt}")
        artifact = Artifact(tmp_path / f"{kind}.{fmt}")
        out = artifact({k: v.numpy() for k, v in obs.items()})
        assert out["action"].shape == expected.shape == (len(obs["state"]), cfg.env.action_chunk, 4)
        assert np.abs(out["action"] - expected).max() <= 1e-5, (kind, fmt)
        scale, offset = np.array(meta["action"]["scale"]), np.array(meta["action"]["offset"])
        np.testing.assert_allclose(out["command"], out["action"] * scale + offset, atol=1e-6)
        assert {k: v["shape"] for k, v in meta["observation"].items()} == {k: list(v.shape[1:]) for k, v in obs.items()}
        assert meta["obs_history"] == cfg.env.obs_history and meta["action"]["chunk"] == cfg.env.action_chunk
    assert np.abs(expected).max() > 0.05  # the comparison is not between two zero outputs


def test_shields_in_the_artifact_and_in_the_metadata(tmp_path):
    ckpt = write_checkpoint(tmp_path, "gaussian")
    meta = export_checkpoint(ckpt, "onnx", tmp_path / "g.onnx")
    assert meta["shields"]["in_artifact"] == ["max_speed", "workspace"]
    obs = rollout_states(config_from_dict(Checkpoint(ckpt).config))
    action = Artifact(tmp_path / "g.onnx")({"state": obs["state"].numpy()})["action"][:, 0]
    speed_limit = 0.4 * 0.05 / 0.04  # max_speed · control_dt / max_ee_step, as a norm of the xyz action
    assert np.linalg.norm(action[:, :3], axis=-1).max() <= speed_limit + 1e-5
    ra = write_checkpoint(tmp_path, "reach_avoid")
    meta = export_checkpoint(ra, "torchscript", tmp_path / "ra.pt")
    assert meta["shields"]["robot_side"] == ["keep_out"] and meta["shields"]["specs"][0]["spheres"] == [[0.5, 0.0, 0.2, 0.07]]


RUN_WITHOUT_ROBORL = r"""
import sys, json
for name in ("roborl", "policies", "sim", "tasks", "diffusers"):
    sys.modules[name] = None  # any import of them fails
import numpy as np
inputs = np.load(sys.argv[1])
out = {}
import torch
module = torch.jit.load(sys.argv[2])
with torch.no_grad():
    out["torch"] = module(torch.from_numpy(inputs["state"]))[0].numpy().tolist()
import onnxruntime
session = onnxruntime.InferenceSession(sys.argv[3], providers=["CPUExecutionProvider"])
out["onnx"] = session.run(["action"], {"state": inputs["state"]})[0].tolist()
print(json.dumps(out))
"""


def test_artifacts_run_without_roborl(tmp_path):
    ckpt = write_checkpoint(tmp_path, "flow")
    export_checkpoint(ckpt, "torchscript", tmp_path / "f.pt")
    export_checkpoint(ckpt, "onnx", tmp_path / "f.onnx")
    obs = rollout_states(config_from_dict(Checkpoint(ckpt).config), steps=3)
    np.savez(tmp_path / "in.npz", state=obs["state"].numpy())
    script = tmp_path / "run.py"
    script.write_text(RUN_WITHOUT_ROBORL)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "in.npz"), str(tmp_path / "f.pt"),
                           str(tmp_path / "f.onnx")], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    expected = framework_actions(ckpt, obs).numpy()
    assert np.abs(np.array(out["torch"]) - expected).max() <= 1e-5
    assert np.abs(np.array(out["onnx"]) - expected).max() <= 1e-5


def test_export_errors_are_one_line_and_leave_nothing_behind(tmp_path):
    ckpt = write_checkpoint(tmp_path, "gaussian")
    out = tmp_path / "out" / "g.pt"
    proc = roborl_in_process("export", str(ckpt), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["max_abs_diff"] <= 1e-5
    data = bytearray(out.read_bytes())
    data[len(data) // 2] ^= 0xFF
    out.write_bytes(bytes(data))
    with pytest.raises(UserError, match="sha256"):
        Artifact(out)
    proc = roborl_in_process("serve", str(out), "--port", "0")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "re-export" in proc.stderr
    proc = roborl_in_process("export", str(tmp_path / "missing.safetensors"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    (tmp_path / "junk.safetensors").write_bytes(b"not a checkpoint")
    proc = roborl_in_process("export", str(tmp_path / "junk.safetensors"), "--format", "onnx")
    assert proc.returncode == 2 and "corrupt" in proc.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["g.pt", "g.pt.json"]  # no temporary files
