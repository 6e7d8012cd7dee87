"""What the runner (roborl/runner.py) asks of a collector, the piece that gets an iteration's data: the
learner's own envs (roborl/collectors.py), Ray env workers (roborl/ray_collector.py) or a robot's actor
process (roborl/robot/collector.py)."""
from __future__ import annotations

from pathlib import Path

from roborl.algos.base import Algorithm
from roborl.collect import EpisodeLog
from roborl.sim import VecEnv


class Collector:
    """What the runner asks of a collector: `env` (the envs the policy is built for), `collect`, and the
    statistics, state and hooks below (defaults: nothing to say or keep)."""
    env: VecEnv

    def collect(self, algo: Algorithm, obs: dict, log: EpisodeLog) -> dict:
        """One iteration's data, handed to the algorithm; returns the observation the next one starts from."""
        raise NotImplementedError

    def budget_spent(self) -> bool:
        """Whether `train.total_steps` are collected before the planned iterations are over (a collector whose
        iterations vary in size ends the run so)."""
        return False

    def stats(self) -> dict[str, float]:
        """Per-iteration statistics of the collection itself, for the logs."""
        return {}

    def summary(self) -> dict:
        """What the run's summary says of the collection."""
        return {}

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the collection (JSON), for `load_state_dict` on resume."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """The collection's state as a checkpoint kept it."""

    def on_run_dir(self, run_dir: Path) -> None:
        """Called once the run's directory exists (before the first `collect`)."""

    def on_checkpoint(self) -> None:
        """Called once a checkpoint holds everything collected so far."""

    def close(self) -> None:
        self.env.close()
