"""Checkpoints of untrained policies for the deployment tests, with a non-trivial observation
normalizer, written through the real checkpoint code so `roborl export` rebuilds them from config."""
from __future__ import annotations

from pathlib import Path

import torch

from roborl.builder import make_env, make_policy
from roborl.checkpoint import save_checkpoint
from roborl.config import config_from_dict, config_to_dict

POLICIES = {
    "gaussian": {"env": {"id": "mujoco/Push", "shield": {"max_speed": 0.4, "workspace": [0.3, -0.3, 0.02, 0.7, 0.3, 0.3]}},
                 "policy": {"kind": "gaussian", "hidden": [64, 64]}},
    "diffusion": {"env": {"id": "mujoco/Push", "action_chunk": 4, "obs_history": 2},
                  "policy": {"kind": "diffusion", "horizon": 8, "hidden": [64, 64], "critic_hidden": [32], "steps": 5}},
    "flow": {"env": {"id": "mujoco/Push", "action_chunk": 4, "obs_history": 2},
             "policy": {"kind": "flow", "horizon": 8, "hidden": [64, 64], "critic_hidden": [32], "steps": 4}},
    "rgb": {"env": {"id": "mujoco/Reach", "obs_mode": "rgb", "render_size": [64, 64]},
            "policy": {"kind": "gaussian", "hidden": [32]}},
    "proprio_rgb": {"env": {"id": "mujoco/Push", "obs_mode": "rgb", "render_size": [48, 48], "proprio_only": True},
                    "policy": {"kind": "gaussian", "hidden": [32]}},
    "joint_reach": {"env": {"id": "mujoco/Reach", "controller": "joint_pos"}, "policy": {"kind": "gaussian", "hidden": [32]}},
    "reach_avoid": {"env": {"id": "mujoco/ReachAvoid", "shield": {"keep_out": [[0.5, 0.0, 0.2, 0.07]]}},
                    "policy": {"kind": "gaussian", "hidden": [32]}},
}


def write_checkpoint(tmp_path: Path, kind: str, seed: int = 0) -> Path:
    cfg = config_from_dict(POLICIES[kind])
    torch.manual_seed(seed)
    env = make_env(cfg.env, 1, 0, torch.device("cpu"))
    policy = make_policy(cfg.policy, env, cfg.env.action_chunk)
    env.close()
    dim = policy.normalizer.mean.shape[0]
    policy.normalizer.mean.copy_(torch.randn(dim) * 0.3)
    policy.normalizer.var.copy_(torch.rand(dim) + 0.5)
    if hasattr(policy, "actor"):  # an untrained Gaussian's mean is ~0.01: make its actions large enough to shield
        policy.actor[-1].weight.data.mul_(100)
    if hasattr(policy, "normalizer_fitted"):
        policy.normalizer_fitted.fill_(True)
    path = tmp_path / f"{kind}.safetensors"
    save_checkpoint(path, policy, None, config_to_dict(cfg), {"step": 0})
    return path


def running_twin(env_id: str):
    """A twin of `env_id` in its own process for the duration of a fixture; yields its URI."""
    from roborl.robot.twin import TwinSettings, start_twin

    proc, uri = start_twin(TwinSettings(env_id=env_id, command_timeout=0.5))
    yield uri
    proc.kill()
    proc.wait()


def exported_artifact(tmp_path_factory, kind: str, fmt: str = "torchscript") -> Path:
    """An untrained `kind` policy (POLICIES) written as a checkpoint and exported to `fmt`, for a module fixture."""
    from roborl.deploy.export import export_checkpoint

    tmp = tmp_path_factory.mktemp(kind)
    path = tmp / f"{kind}.{'onnx' if fmt == 'onnx' else 'pt'}"
    export_checkpoint(write_checkpoint(tmp, kind), fmt, path)
    return path
