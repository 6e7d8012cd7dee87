"""`roborl export CHECKPOINT --format pretrained`: a pi0 or LeRobot policy back in its own format, a
directory that transformers' `PI0ForConditionalGeneration.from_pretrained` or LeRobot's `from_pretrained`
loads without roborl (roborl's heads beside it). Written to a temporary directory and renamed: an existing
directory is never half-overwritten."""
from __future__ import annotations

from pathlib import Path

import torch

from roborl.errors import UserError
from roborl.files import atomic_write

KINDS = ("pi0", "lerobot")


def export_pretrained(checkpoint: str | Path, out: str | Path | None = None) -> dict:
    from roborl.builder import make_env, make_policy
    from roborl.checkpoint import Checkpoint
    from roborl.config import config_from_dict

    ckpt = Checkpoint(checkpoint)
    cfg = config_from_dict(ckpt.config)
    if cfg.policy.kind not in KINDS:
        raise UserError(f"--format pretrained writes {' or '.join(KINDS)} policies in their own format; this checkpoint "
                        f"holds a {cfg.policy.kind} policy: use --format torchscript or onnx")
    target = Path(out) if out else Path(checkpoint).with_suffix("")
    if target.exists() and any(target.iterdir()):
        raise UserError(f"'{target}' exists and is not empty: pass --out to a new directory")
    env = make_env(cfg.env, 1, 0, torch.device("cpu"))
    try:
        policy = make_policy(cfg.policy, env, cfg.env.action_chunk)
    finally:
        env.close()
    ckpt.load_policy(policy)
    with atomic_write(target) as tmp:
        policy.eval().save_pretrained(tmp)
    return {"directory": str(target), "kind": cfg.policy.kind, "files": sorted(p.name for p in target.iterdir())}
