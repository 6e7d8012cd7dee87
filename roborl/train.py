"""`roborl train`: one run of a config, in as many learner processes as `resources.learners` asks for."""
from __future__ import annotations

import dataclasses
import os

from roborl.config import Config
from roborl.errors import UserError
from roborl.runner import Runner


def train_bc(cfg: Config) -> dict:
    """`roborl bc`: behaviour cloning of the config's policy on its demonstrations (train.algorithm bc)."""
    return Runner(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, algorithm="bc"))).train()


def train(cfg: Config) -> dict | None:
    """Trains `cfg` with `resources.learners` processes: one (this one), spawned ones, or those torchrun
    started. The summary; None in the processes of ranks > 0 under torchrun."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        world = int(os.environ["WORLD_SIZE"])
        if world != cfg.resources.learners:
            raise UserError(f"torchrun started {world} processes but resources.learners is "
                            f"{cfg.resources.learners}; make them equal")
        if world > 1:
            from roborl.learners import run_learner

            return run_learner(cfg, int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", 0)), "env://")
    if cfg.resources.learners == 1:
        return Runner(cfg).train()
    from roborl.learners import spawn

    return spawn(cfg)
