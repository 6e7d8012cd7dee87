"""The algorithms the runner drives (roborl/algos/base.py), by `train.algorithm`. Each module imports on
first use, so that reading a config does not pay for the others."""
from __future__ import annotations

from importlib import import_module

import torch
from torch import nn

from roborl.algos.base import Algorithm, Comm
from roborl.config import Config
from roborl.errors import UserError
from roborl.sim import VecEnv

ALGORITHMS = {"ppo": "roborl.algos.ppo:PPO", "sac": "roborl.algos.sac:SAC", "grpo": "roborl.algos.grpo:GRPO",
              "bc": "roborl.algos.bc:BC"}


def algorithm_class(name: str) -> type[Algorithm]:
    if name not in ALGORITHMS:
        raise UserError(f"train.algorithm '{name}' is unknown; available: {', '.join(ALGORITHMS)}")
    module, cls = ALGORITHMS[name].split(":")
    return getattr(import_module(module), cls)


def make_algorithm(cfg: Config, policy: nn.Module, env: VecEnv, device: torch.device,
                   comm: Comm | None = None) -> Algorithm:
    """The run's `train.algorithm`, built for `policy` acting in `env`."""
    return algorithm_class(cfg.train.algorithm).from_config(cfg, policy, env, device, comm)
