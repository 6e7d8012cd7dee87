"""Checkpoints: one safetensors file holding the policy weights (normalizer buffers included) and the
algorithm's state (optimizers, critics, replay: `Algorithm.state_dict()`, its tensors in the file and its
structure as JSON), with the run config and the runner's state as JSON in its metadata header. Written to
a temporary file and renamed over the old one, so a crash never leaves a half-written checkpoint."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from roborl.errors import UserError
from roborl.files import atomic_write


class LoadsState(Protocol):
    """What a checkpoint restores an algorithm's state into (`Algorithm`; named here, since algorithms import
    the config, which imports this module)."""

    def load_state_dict(self, state: dict) -> None: ...


FORMAT = "roborl-checkpoint-1"


def _encode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """`value` (nested dicts, lists, tensors, numbers, strings) as JSON, its tensors moved to `tensors`."""
    if isinstance(value, torch.Tensor):
        name = f"algo.{len(tensors)}"
        tensors[name] = value.detach().cpu().contiguous()
        return {"__tensor__": name}
    if isinstance(value, dict):  # keys keep their type (an optimizer's state is keyed by int)
        return {"__dict__": [[k, _encode(v, tensors)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return [_encode(v, tensors) for v in value]
    return value


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, dict) and "__tensor__" in value:
        return tensors[value["__tensor__"]]
    if isinstance(value, dict):
        return {k: _decode(v, tensors) for k, v in value["__dict__"]}
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    return value


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    """The optimizer state of a checkpoint written before algorithms had a state of their own."""
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        _, pid, key = name.split(".", 2)
        state.setdefault(int(pid), {})[key] = value
    for name, value in meta["scalars"].items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(path: str | Path, policy: torch.nn.Module, algo_state: dict | None,
                    config: dict, trainer_state: dict) -> None:
    """`policy`'s weights, the algorithm's `algo_state` (None: none), the run's config and the runner's state."""
    path = Path(path)
    tensors = {f"policy.{k}": v.detach().cpu().contiguous() for k, v in policy.state_dict().items()}
    algo_tensors: dict[str, torch.Tensor] = {}
    algo_meta = _encode(algo_state or {}, algo_tensors)
    tensors.update(algo_tensors)
    metadata = {"format": FORMAT, "config": json.dumps(config), "trainer_state": json.dumps(trainer_state),
                "algo": json.dumps(algo_meta)}
    write_safetensors(path, tensors, metadata)


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """`tensors` and `metadata` as a safetensors file, written to a temporary file, synced and renamed over
    `path`: a reader (or a kill) never sees half a file."""
    with atomic_write(path, sync=True) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


class Checkpoint:
    """A loaded checkpoint: `config` (dict), `trainer_state` (the runner's, dict), `policy_state`, `algo_state`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            what = "is a directory, not a checkpoint file" if self.path.is_dir() else "does not exist"
            raise UserError(f"checkpoint '{self.path}' {what} (checkpoints are RUN/checkpoints/last.safetensors "
                            "and best.safetensors)")
        try:
            with safe_open(str(self.path), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
            if meta.get("format") != FORMAT:
                raise ValueError("missing roborl metadata")
            self.config = json.loads(meta["config"])
            self.trainer_state = json.loads(meta["trainer_state"])
            algo_meta = json.loads(meta["algo"]) if "algo" in meta else None
            optim_meta = json.loads(meta.get("optimizer", "{}"))
        except Exception as exc:
            raise UserError(f"checkpoint '{self.path}' is corrupt or not a roborl checkpoint "
                            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'unreadable'})") from exc
        self.policy_state = {k[len("policy."):]: v for k, v in tensors.items() if k.startswith("policy.")}
        if algo_meta is not None:
            self.algo_state = _decode(algo_meta, tensors)
        else:  # the older layout: the optimizer's tensors, the lr and multiplier in the trainer state
            optim = {k: v for k, v in tensors.items() if k.startswith("optim.")}
            st = self.trainer_state
            self.algo_state = {"optimizer": _unflatten_optimizer(optim, optim_meta) if optim_meta else None,
                               **{k: st[k] for k in ("lr", "lagrangian") if k in st}}

    def load_policy(self, policy: torch.nn.Module) -> None:
        try:
            policy.load_state_dict(self.policy_state)
        except RuntimeError as exc:
            raise UserError(f"checkpoint '{self.path}' does not fit this policy: {state_dict_mismatch(exc)}") from exc

    def load_algo(self, algo: LoadsState) -> None:
        """The algorithm's state (its optimizers above all); refused in one line where the optimizer's parameter
        groups differ from this run's: other trainable parameters (another roborl version, other fine-tune
        settings) or other `algo` settings that split them (critic_lr, backbone_lr)."""
        try:
            algo.load_state_dict(self.algo_state)
        except ValueError as exc:
            raise UserError(f"checkpoint '{self.path}' holds an optimizer state that does not fit this run's trainable "
                            f"parameters ({str(exc).splitlines()[0] if str(exc) else 'mismatch'}): resume it with the "
                            f"config and roborl version it was saved with, or start a new run from its weights with "
                            f"policy.init={self.path}") from exc

    def training_state(self) -> dict:
        """The runner's state to resume from; refused in one line for checkpoints that hold a policy alone."""
        missing = [k for k in ("env_steps", "iteration", "run_dir") if k not in self.trainer_state]
        if missing:
            raise UserError(f"checkpoint '{self.path}' holds a policy without the state of a training run (no "
                            f"{', '.join(missing)}; written by hand?): start a new run from it with "
                            f"policy.init={self.path}")
        return self.trainer_state


def state_dict_mismatch(exc: RuntimeError) -> str:
    """torch's load_state_dict error in one line: its first concrete mismatch and how many there are."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    details = [line for line in lines[1:] if line]
    if not details:
        return lines[0] if lines else "unknown mismatch"
    more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
    return f"{details[0].rstrip('.')}{more}"
