"""What `Policy.act` returns (roborl/policies/base.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Act:
    action: torch.Tensor
    log_prob: torch.Tensor
    value: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
