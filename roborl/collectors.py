"""Where an iteration's data comes from, chosen by `resources.*`: the learner's own envs (here), Ray env
workers (roborl/ray_collector.py), or a robot's actor process (roborl/robot/collector.py). The runner asks a
collector for data and does not know which it has."""
from __future__ import annotations

import dataclasses

import torch

from roborl.algos import algorithm_class
from roborl.algos.base import Algorithm
from roborl.builder import make_run_env, refuse_spread_choices
from roborl.collect import EpisodeLog
from roborl.collector import Collector
from roborl.config import Config
from roborl.sim import VecEnv


class LocalCollector(Collector):
    """The learner's own envs, stepped in its process by the algorithm's `collect`."""

    def __init__(self, env: VecEnv) -> None:
        self.env = env

    def collect(self, algo: Algorithm, obs: dict, log: EpisodeLog) -> dict:
        return algo.collect(self.env, obs, log)


def make_collector(cfg: Config, device: torch.device) -> Collector:
    """A robot's actor where `resources.actor` is robot, Ray env workers where `resources.env_workers` > 0,
    else this process's `env.num_envs` envs; for an algorithm that steps no envs (BC), the evaluation envs."""
    t = cfg.train
    refuse_spread_choices(cfg)
    if not algorithm_class(t.algorithm).steps_envs:
        evaluation = dataclasses.replace(cfg, env=cfg.env.for_evaluation())
        return LocalCollector(make_run_env(evaluation, min(t.eval_envs, t.eval_episodes), t.seed + 1, device))
    if cfg.resources.actor == "robot":
        from roborl.robot.collector import RobotCollector

        return RobotCollector(cfg, device)
    if cfg.resources.env_workers:
        from roborl.ray_collector import RayCollector  # Ray is imported only by the runs that use it

        return RayCollector(cfg, device)
    return LocalCollector(make_run_env(cfg, cfg.env.num_envs, cfg.train.seed, device))
