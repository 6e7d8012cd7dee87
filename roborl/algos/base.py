"""What every algorithm is to the runner (roborl/runner.py), which drives it without knowing which it is.

One training iteration is

    algo.start_iteration(i, total)          the schedule (learning rate, critic warm-up)
    obs = collector.collect(algo, obs, log) the data: in process `algo.collect(env, obs, log)`, which steps the
                                            envs through `roborl.collect.run_steps`; elsewhere (Ray env
                                            workers) the collector gathers it and hands it to `algo.absorb`
    stats = algo.update()                   the gradient steps on what was collected

and `state_dict` / `load_state_dict` carry everything a resumed run needs beyond the policy's weights
(optimizers, learning rate, multipliers, critics, replay). An algorithm owns its storage and optimizers;
`comm` (roborl/learners.py) is how it agrees with other learner processes, the identity in one process.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from torch import nn

from roborl.collect import EpisodeLog
from roborl.config import Config
from roborl.sim import VecEnv


class Comm:
    """How learners agree: here, one learner alone (roborl/learners.py has several)."""
    rank, world = 0, 1

    def mean(self, x: Any) -> Any:
        """The mean of `x` over the whole minibatch, every learner's share included."""
        return x.mean()

    def reduce(self, x: Any, op: str = "sum") -> Any:
        """`x` summed (op "sum") or maxed ("max") over the learners."""
        return x

    def average_gradients(self, params: list[nn.Parameter]) -> None:
        """Every learner's gradients replaced by their mean over the learners."""

    def gather_state(self, obs: dict) -> dict:
        """`obs` of every learner, for the normalizer: all policies normalize `state` alone."""
        return obs

    def gather_log(self, log: EpisodeLog) -> EpisodeLog:
        """The episode statistics of every learner, merged."""
        return log

    def broadcast_module(self, module: nn.Module) -> None:
        """Rank 0's weights in every learner."""

    def broadcast_object(self, value: Any) -> Any:
        """Rank 0's `value` (picklable) in every learner."""
        return value

    def agree(self, stop: bool) -> bool:
        """Whether to stop after this iteration: rank 0 decides for all."""
        return stop


@dataclass
class Schedule:
    """How the runner paces an algorithm: iterations, the progress units each adds (the x-axis of logs and
    curves), and how many iterations pass between evaluations and between `last` checkpoints."""
    iterations: int
    units_per_iteration: int
    eval_every: int
    save_every: int
    unit: str = "env steps"


class Algorithm(ABC):
    name = ""  # train.algorithm
    env_steps = 0  # env steps the last `collect` (or `absorb`) took in this process
    steps_envs = True  # False: learns from stored data (BC); the runner's envs then serve evaluation alone
    in_worker = False  # set in a Ray env worker's copy: `collect` gathers for `rollout_part` and learns nothing

    def schedule(self, cfg: Config) -> Schedule:
        """`train.total_steps` env steps in iterations of env.num_envs × train.rollout_steps × env.action_chunk."""
        t = cfg.train
        per_iteration = cfg.env.num_envs * t.rollout_steps * cfg.env.action_chunk  # all learners' steps
        return Schedule(math.ceil(t.total_steps / per_iteration), per_iteration, t.eval_every, t.save_every)

    @property
    def progress(self) -> int:
        """Progress units of the last iteration in this process (env steps here)."""
        return self.env_steps

    def summary(self) -> dict:
        """What the run's summary adds about this algorithm."""
        return {}

    def __init__(self, policy: nn.Module, comm: Comm | None = None) -> None:
        self.policy = policy
        self.comm = comm or Comm()

    def start_iteration(self, iteration: int, total_iterations: int) -> None:
        """Called before each iteration's collection (learning-rate schedules, warm-ups)."""

    @abstractmethod
    def collect(self, env: VecEnv, obs: dict, log: EpisodeLog) -> dict:
        """Steps `env` from `obs` for one iteration's data, recording episodes in `log`; returns the next obs."""

    def absorb(self, parts: list[dict], obs: dict, log: EpisodeLog, update_rows: int | None = None) -> None:
        """One iteration's data collected elsewhere (`parts` of Ray env workers, see roborl/ray_collector.py, or
        of a robot's actor, roborl/robot/collector.py); the updates of at most `update_rows` transitions of them
        where it is given (off-policy algorithms)."""
        raise NotImplementedError(f"train.algorithm {self.name} collects in the learner's process")

    @abstractmethod
    def update(self) -> dict[str, float]:
        """The update on the collected data; its statistics for the logs."""

    def state_dict(self) -> dict:
        """What a resumed run needs beyond the policy's weights (tensors, numbers, nested dicts and lists)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """The state of `state_dict`."""

    @property
    def lr(self) -> float:
        """The learning rate, for logs."""
        return float("nan")
