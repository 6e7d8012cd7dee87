"""`roborl export CHECKPOINT --format torchscript|onnx`: a trained policy as one self-contained file.

The artifact maps the observation the policy was trained on (`state`, with its observation history, and
`rgb` where the policy sees images) to `action` (B×K×A: the K actions of one decision, in [-1, 1]) and
`command` (the same actions in the controller's units: scale·a + offset). Inside it: the observation
normalizer, the deterministic sampler of diffusion / flow policies (zero initial noise, zero step noise,
the trained number of steps: the actions `roborl eval` scores), the chunk the env executes, and the
stateless shields (speed, workspace, joint limits) applied to every action of the chunk against the
newest state. Stateful or solver-based shields (action rate, keep-out CBF, automata) cannot live in a
traced graph: they are listed in the metadata, and `roborl.robot` applies the whole chain per step.

Beside it, `ARTIFACT.json` holds the metadata: observation keys, shapes and dtypes, control rate, action
space and scaling, shields, sampler, and the artifact's sha256. Both are written to temporary files and
renamed only after the artifact has been reloaded and checked against the in-framework policy.
"""
from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from roborl.deploy.artifact import load_runner, sha256
from roborl.errors import UserError
from roborl.files import atomic_write

FORMATS = {"torchscript": ".pt", "onnx": ".onnx"}
METADATA_FORMAT = "roborl-policy-1"


class DeployedPolicy(nn.Module):
    """The traced computation: policy (deterministic) → first K actions → stateless shields → scaling."""

    def __init__(self, policy: nn.Module, execute: int, shields: list, frame: slice,
                 scale: list[float], offset: list[float]) -> None:
        super().__init__()
        self.policy, self.execute, self.shields, self.frame = policy, execute, shields, frame
        self.register_buffer("scale", torch.tensor(scale, dtype=torch.float32))
        self.register_buffer("offset", torch.tensor(offset, dtype=torch.float32))

    def forward(self, state: torch.Tensor, rgb: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        obs = {"state": state} if rgb is None else {"state": state, "rgb": rgb}
        action = self.policy.act(obs, deterministic=True).action
        if action.dim() == 2:
            action = action[:, None]
        action = action[:, :self.execute].clamp(-1, 1)
        newest = {"state": state[:, self.frame]}
        steps = []
        for k in range(self.execute):
            a = action[:, k]
            for shield in self.shields:
                a = shield(newest, a)[0]
            steps.append(a)
        action = torch.stack(steps, 1)
        return action, action * self.scale + self.offset


def _example_obs(env, seed: int = 0) -> dict[str, torch.Tensor]:
    obs = env.reset(seed=seed)
    return {k: v for k, v in obs.items() if isinstance(v, torch.Tensor) and k in ("state", "rgb")}


def policy_io(cfg, env) -> dict:
    """What the robot side (roborl/robot/control_loop.py) must know of a policy of `cfg` for `env`: the control
    rate and episode length, the observation keys, shapes and history, the action space and its scaling, and
    the shields (with those a traced artifact holds)."""
    from roborl.builder import shield_specs
    from roborl.shields.specs import TRACEABLE

    raw = env.unwrapped
    obs = _example_obs(env)
    spaces = env.observation_space.spaces
    specs = shield_specs(cfg.env, env)
    return {
        "env": {"id": cfg.env.id, "controller": cfg.env.controller, "control_freq": cfg.env.control_freq,
                "control_dt": raw.control_dt, "episode_length": raw.max_episode_steps,
                "instruction": getattr(raw, "instruction", ""), "proprio_only": cfg.env.proprio_only},
        "observation": {k: {"shape": list(spaces[k].shape), "dtype": str(obs[k].numpy().dtype)} for k in obs},
        "obs_history": cfg.env.obs_history, "state_frame_dim": raw.observation_space["state"].shape[0],
        "action": {"dim": raw.action_dim, "chunk": cfg.env.action_chunk, "low": -1.0, "high": 1.0,
                   **raw.action_scaling()},
        "shields": {"specs": specs, "in_artifact": [s["type"] for s in specs if s["type"] in TRACEABLE],
                    "robot_side": [s["type"] for s in specs if s["type"] not in TRACEABLE]},
    }


def _write_artifact(module: DeployedPolicy, inputs: tuple, fmt: str, path: Path) -> None:
    names = ["state", "rgb"][:len(inputs)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about Python-side constants (chunk sizes, steps)
        if fmt == "torchscript":
            traced = torch.jit.trace(module, inputs, check_trace=False)
            torch.jit.save(traced, str(path))
        else:
            axes = {name: {0: "batch"} for name in [*names, "action", "command"]}
            torch.onnx.export(module, inputs, str(path), input_names=names, output_names=["action", "command"],
                              dynamic_axes=axes, dynamo=False, opset_version=17)


def export_checkpoint(checkpoint: str | Path, fmt: str = "torchscript", out: str | Path | None = None,
                      tolerance: float = 1e-5) -> dict:
    """Writes the artifact and its metadata; returns the metadata. Refuses what cannot be reproduced."""
    from roborl.builder import make_env, make_policy
    from roborl.checkpoint import Checkpoint
    from roborl.config import config_from_dict
    from roborl.shields.specs import TRACEABLE, build_shield

    if fmt not in FORMATS:
        raise UserError(f"export format '{fmt}' is unknown; available: {', '.join(FORMATS)}")
    ckpt = Checkpoint(checkpoint)
    cfg = config_from_dict(ckpt.config)
    if cfg.policy.kind == "residual":
        raise UserError("a residual policy acts on its base's action, which runs outside the policy; "
                        "export supports gaussian, diffusion and flow policies")
    env = make_env(cfg.env, 2, 0, torch.device("cpu"))
    try:
        policy = make_policy(cfg.policy, env, cfg.env.action_chunk)
        ckpt.load_policy(policy)
        policy.eval().requires_grad_(False)
        io = policy_io(cfg, env)
        obs = _example_obs(env)
    finally:
        env.close()
    specs, frame_dim, scaling = io["shields"]["specs"], io["state_frame_dim"], io["action"]
    traced_shields = [build_shield(s) for s in specs if s["type"] in TRACEABLE]
    state_dim = obs["state"].shape[1]
    module = DeployedPolicy(policy, cfg.env.action_chunk, traced_shields, slice(state_dim - frame_dim, state_dim),
                            scaling["scale"], scaling["offset"]).eval()
    inputs = tuple(obs[k] for k in ("state", "rgb") if k in obs)

    path = Path(out) if out else Path(checkpoint).with_suffix(FORMATS[fmt])
    sidecar = path.with_name(path.name + ".json")
    with atomic_write(sidecar) as tmp_meta, atomic_write(path) as tmp:  # the artifact is renamed first
        _write_artifact(module, inputs, fmt, tmp)
        # check the reloaded artifact on a fresh batch of observations against the policy in the framework
        probe = {k: v.numpy() for k, v in obs.items()}
        if "state" in probe:
            rng = np.random.default_rng(1)
            probe["state"] = (probe["state"] + rng.normal(0, 0.01, probe["state"].shape)).astype(np.float32)
        with torch.no_grad():
            expected = module(*[torch.from_numpy(probe[k]) for k in ("state", "rgb") if k in probe])
        got = load_runner(tmp, fmt)(probe)
        max_diff = max(float(np.abs(got["action"] - expected[0].numpy()).max()),
                       float(np.abs(got["command"] - expected[1].numpy()).max()))
        if not max_diff <= tolerance:
            raise UserError(f"the exported {fmt} artifact differs from the policy by {max_diff:.2e} "
                            f"(tolerance {tolerance:.0e}); nothing was written")
        metadata = {
            "format": METADATA_FORMAT, "artifact": path.name, "runtime": fmt, "sha256": sha256(tmp),
            "exported_from": str(checkpoint), "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **io,
            "outputs": {"action": "B×K×A in [-1, 1]", "command": "B×K×A: scale·action + offset"},
            "policy": {"kind": cfg.policy.kind, "sampler": _sampler(cfg)},
            "check": {"max_abs_diff": max_diff, "batch": int(inputs[0].shape[0])},
        }
        tmp_meta.write_text(json.dumps(metadata, indent=2))
    return metadata


def _sampler(cfg) -> dict:
    if cfg.policy.kind == "gaussian":
        return {"type": "mean"}
    return {"type": "ode" if cfg.policy.kind == "flow" else "ddim", "steps": cfg.policy.steps,
            "initial_noise": "zeros", "step_noise": "none", "horizon": cfg.policy.horizon}
