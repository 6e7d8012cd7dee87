"""Checkpoints: one safetensors file holding the policy weights (normalizer buffers included) and the
optimizer tensors, with the run config and trainer state as JSON in its metadata header. Written to a
temporary file and renamed over the old one, so a crash never leaves a half-written checkpoint."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from roborl.errors import UserError

FORMAT = "roborl-checkpoint-1"


def _flatten_optimizer(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, scalars = {}, {}
    for pid, pstate in state["state"].items():
        for key, value in pstate.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{pid}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{pid}.{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        _, pid, key = name.split(".", 2)
        state.setdefault(int(pid), {})[key] = value
    for name, value in meta["scalars"].items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(path: str | Path, policy: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                    config: dict, trainer_state: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {f"policy.{k}": v.detach().cpu().contiguous() for k, v in policy.state_dict().items()}
    optim_meta: dict = {}
    if optimizer is not None:
        optim_tensors, optim_meta = _flatten_optimizer(optimizer.state_dict())
        tensors.update(optim_tensors)
    metadata = {"format": FORMAT, "config": json.dumps(config), "trainer_state": json.dumps(trainer_state),
                "optimizer": json.dumps(optim_meta)}
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        save_file(tensors, str(tmp), metadata=metadata)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class Checkpoint:
    """A loaded checkpoint: `config` (dict), `trainer_state` (dict), `policy_state`, `optimizer_state`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise UserError(f"checkpoint '{self.path}' does not exist")
        try:
            with safe_open(str(self.path), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
            if meta.get("format") != FORMAT:
                raise ValueError("missing roborl metadata")
            self.config = json.loads(meta["config"])
            self.trainer_state = json.loads(meta["trainer_state"])
            optim_meta = json.loads(meta["optimizer"])
        except Exception as exc:
            raise UserError(f"checkpoint '{self.path}' is corrupt or not a roborl checkpoint "
                            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'unreadable'})") from exc
        self.policy_state = {k[len("policy."):]: v for k, v in tensors.items() if k.startswith("policy.")}
        optim = {k: v for k, v in tensors.items() if k.startswith("optim.")}
        self.optimizer_state = _unflatten_optimizer(optim, optim_meta) if optim_meta else None

    def load_policy(self, policy: torch.nn.Module) -> None:
        try:
            policy.load_state_dict(self.policy_state)
        except RuntimeError as exc:
            raise UserError(f"checkpoint '{self.path}' does not fit this policy: {str(exc).splitlines()[0]}") from exc
