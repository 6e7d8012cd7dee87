"""A whole VLA policy in one directory, loadable offline:

    vla.json            kind, the VLASpec and the policy's constructor arguments
    model.safetensors   every parameter and buffer (LoRA adapters, heads, expert, normalizer included)
    vision/config.json  the vision encoder's config
    language/config.json  the language model's config
    tokenizer/          the tokenizer

Loading builds the architecture from the saved configs (no hub, no original checkpoint needed) and then
reads the weights strictly.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model
from torch import nn

from roborl.files import atomic_write
from roborl.policies.vla.backbone import build_backbone
from roborl.policies.vla.spec import VLASpec

FILES = ("vla.json", "model.safetensors", "vision/config.json", "language/config.json", "tokenizer")


def save_policy(policy: nn.Module, directory: str | Path) -> None:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    bb = policy.backbone
    bb.vision.config.save_pretrained(out / "vision")
    bb.language_config().save_pretrained(out / "language")
    bb.tokenizer.save_pretrained(out / "tokenizer")
    with atomic_write(out / "model.safetensors") as tmp:
        save_model(policy, str(tmp))  # drops the duplicates of tied weights
    meta = {"kind": policy.kind, "spec": dataclasses.asdict(policy.spec), "args": policy.init_args}
    (out / "vla.json").write_text(json.dumps(meta, indent=2))


def load_policy(cls: type, directory: str | Path) -> nn.Module:
    src = Path(directory).expanduser()
    missing = [name for name in FILES if not (src / name).exists()]
    if missing:
        raise FileNotFoundError(f"'{directory}' is not a saved VLA policy: it lacks {', '.join(missing)} "
                                f"(expected {', '.join(FILES)}, written by save_pretrained)")
    meta = json.loads((src / "vla.json").read_text())
    if meta["kind"] != cls.kind:
        raise ValueError(f"'{directory}' holds a {meta['kind']} policy, not {cls.kind}")
    spec = VLASpec(**meta["spec"])
    backbone = build_backbone(spec, meta["args"]["state_dim"], saved=src)
    policy = cls(spec, backbone=backbone, **meta["args"])
    load_model(policy, str(src / "model.safetensors"), strict=True)
    return policy


class BackbonePolicy:
    """What both VLA families do the same way through their `backbone`: the proprio normalizer, and saving
    and loading the whole policy as one directory (mixed in before the policy's base class)."""

    def update_normalizer(self, obs: dict) -> None:
        self.backbone.update_normalizer(obs)

    def encode_text(self, instructions: list[str], device: torch.device) -> torch.Tensor:
        return self.backbone.encode_text(instructions, device)

    def backbone_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.backbone.parameters() if p.requires_grad]

    def fit_normalizer(self, states: torch.Tensor) -> None:
        self.backbone.fit_normalizer(states)

    def save_pretrained(self, directory: str) -> None:
        save_policy(self, directory)

    @classmethod
    def from_pretrained(cls, directory: str) -> nn.Module:
        return load_policy(cls, directory)
