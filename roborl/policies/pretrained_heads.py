"""What roborl writes beside a library's own pretrained directory (pi0's, a LeRobot policy's): the heads it adds
(value, noise std, normalizer) as safetensors, and the settings that rebuild the policy as JSON."""
from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_model
from torch import nn

from roborl.files import atomic_write

HEADS_FILE = "roborl_heads.safetensors"


def write_heads(out: Path, heads: nn.Module, meta: dict, meta_file: str) -> None:
    """The heads (written to a temporary name and renamed) and the settings, into `out`."""
    with atomic_write(out / HEADS_FILE) as tmp:
        save_model(heads, str(tmp))
    (out / meta_file).write_text(json.dumps(meta, indent=2))


def read_meta(directory: str | Path, meta_file: str, what: str) -> tuple[Path, dict]:
    """The directory and the settings roborl saved in it; FileNotFoundError naming `what` where there are none."""
    src = Path(directory).expanduser()
    if not (src / meta_file).is_file():
        raise FileNotFoundError(f"'{directory}' has no {meta_file}: not a {what} policy saved by roborl")
    return src, json.loads((src / meta_file).read_text())
