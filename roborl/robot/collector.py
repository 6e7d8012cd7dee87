"""Data from a robot actor (`resources.actor: robot`): the learner's side of real-world RL.

The runner's loop is unchanged: each iteration this collector publishes the newest weights, takes every
transition the actor (roborl/robot/actor.py, a process of its own beside the robot) has sent, waiting for
`train.rollout_steps` of them at least, and hands them to the algorithm's `absorb` (SAC: online buffer, the
operator's steps into the demonstration buffer too, then `sac.utd_ratio` updates per transition of at most
`train.rollout_steps`). The robot does not wait for the learner: a learner slower than its robot absorbs the
backlog at a lower update-to-data ratio (train/updates_per_transition) instead of training ever further behind
the robot on ever older weights, and the run ends once `train.total_steps` transitions are absorbed. The actor's
episode statistics go to the logs (rollout/return, success, length, interventions).

What the learner has absorbed is acknowledged to the actor only once a checkpoint holds it (`on_checkpoint`),
and the checkpoint records how far each actor session got (`state_dict`), so a learner killed and resumed
from its checkpoint asks the actor for exactly what it lacks (roborl/robot/link.py).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from roborl.algos.base import Algorithm
from roborl.builder import make_run_env
from roborl.collect import EpisodeLog
from roborl.collector import Collector
from roborl.config import Config, config_to_dict
from roborl.errors import UserError
from roborl.robot.actor import check_loadable
from roborl.robot.judged_reward import CORRECTIONS
from roborl.robot.link import LearnerLink, parse_address

EPISODE_KEYS = ("return", "success", "length", "interventions", "vetoes")  # vetoes: with robot.judge only


def _tensors(rows: dict, device: torch.device) -> tuple:
    obs = {k: torch.from_numpy(np.array(v)).to(device) for k, v in rows["obs"].items()}
    next_obs = {k: torch.from_numpy(np.array(v)).to(device) for k, v in rows["next_obs"].items()}
    action, reward, terminated = (torch.from_numpy(np.array(rows[k])).to(device)
                                  for k in ("action", "reward", "terminated"))
    return obs, action, reward, next_obs, terminated


class RobotCollector(Collector):
    def __init__(self, cfg: Config, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        try:
            self.host, self.port = parse_address(cfg.robot.learner)
        except ValueError as exc:
            raise UserError(f"robot.learner: {exc}") from exc
        if cfg.robot.spawn_actor:
            check_loadable(cfg.robot)
        # the task's spaces for the policy, and the simulated evaluation
        self.env = make_run_env(cfg, 1, cfg.train.seed, device)
        self.link: LearnerLink | None = None
        self.actor: subprocess.Popen | None = None
        self.received: dict[str, int] = {}  # actor session -> the last batch absorbed
        self.rows_by_session: dict[str, int] = {}  # actor session -> transitions absorbed
        self.episodes = 0  # the actor's episodes that ended
        self.version = 0
        self.run_dir: Path | None = None

    def on_run_dir(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def start(self, policy: torch.nn.Module) -> None:
        """Listen for the actor (with the first weights ready for it), and start it unless it runs elsewhere."""
        cfg = config_to_dict(self.cfg)
        if cfg["robot"]["corrections"] is None and self.run_dir is not None:  # where a judge's verdicts are kept
            cfg["robot"]["corrections"] = str(self.run_dir / CORRECTIONS)
        try:
            self.link = LearnerLink(self.host, self.port, cfg)
        except OSError as exc:
            raise UserError(f"robot.learner {self.cfg.robot.learner}: cannot listen there ({exc})") from exc
        self.link.restore(self.received)
        self.publish(policy)
        if self.cfg.robot.spawn_actor:
            # the actor reads its stdin to the end: when this learner dies, the pipe closes and the actor stops
            self.actor = subprocess.Popen([sys.executable, "-m", "roborl.cli", "actor", self.link.address,
                                           "--exit-with-stdin"], stdin=subprocess.PIPE)

    def publish(self, policy: torch.nn.Module) -> None:
        self.version += 1
        weights = {k: v.detach().cpu().numpy() for k, v in policy.state_dict().items()}
        self.link.publish(self.version, weights)

    def collect(self, algo: Algorithm, obs: dict, log: EpisodeLog) -> dict:
        if self.link is None:
            self.start(algo.policy)
        else:
            self.publish(algo.policy)
        parts = []
        for batch in self.link.take(self.cfg.train.rollout_steps, self.check_actor):
            session = batch["session"]
            self.episodes += len(batch["episodes"])
            for episode in batch["episodes"]:
                for key in EPISODE_KEYS:
                    if key in episode:
                        log.extend(key, [float(episode[key])])
            rows = batch["rows"]
            if rows:
                n = len(rows["reward"])
                parts.append({"transitions": _tensors(rows, self.device), "env_rows": n,
                              "intervened": torch.from_numpy(np.array(rows["intervened"])).to(self.device)})
                self.rows_by_session[session] = self.rows_by_session.get(session, 0) + n
        self.received = dict(self.link.received)
        algo.absorb(parts, obs, log, update_rows=self.cfg.train.rollout_steps)
        return obs

    def budget_spent(self) -> bool:
        return self.rows * self.cfg.env.action_chunk >= self.cfg.train.total_steps

    def check_actor(self) -> None:
        """The actor this learner started must be alive while it waits for it (one it did not start may come
        and go: the learner waits for it)."""
        if self.actor is not None and self.actor.poll() is not None:
            if not self.rows:
                raise UserError(f"the actor process exited with code {self.actor.returncode} before it sent anything "
                                "(its error is above)")
            raise UserError(f"the actor process exited with code {self.actor.returncode} (its error is above); the "
                            "last checkpoint holds what it sent: resume with train.resume=RUN/checkpoints/last.safetensors")

    @property
    def rows(self) -> int:
        """Transitions absorbed, of every actor session (this process and the runs it resumed)."""
        return sum(self.rows_by_session.values())

    def on_checkpoint(self) -> None:
        """A checkpoint holds everything absorbed so far: the actor may forget it."""
        if self.link is not None:
            self.link.acknowledge()

    def state_dict(self) -> dict:
        return {"received": self.received, "rows": self.rows, "rows_by_session": self.rows_by_session,
                "episodes": self.episodes}

    def load_state_dict(self, state: dict) -> None:
        self.received = dict(state.get("received", {}))
        self.rows_by_session = dict(state.get("rows_by_session", {}))
        self.episodes = int(state.get("episodes", 0))

    def stats(self) -> dict[str, float]:
        return {"actor_connections": float(self.link.connections if self.link else 0),
                "transitions_received": float(self.rows)}

    def summary(self) -> dict:
        return {"transitions_received": self.rows, "transitions_by_actor_session": self.rows_by_session,
                "actor_episodes": self.episodes,
                "actor_connections": self.link.connections if self.link else 0}

    def close(self) -> None:
        if self.link is not None:
            self.link.finish()
        if self.actor is not None:
            try:
                self.actor.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.actor.kill()
        if self.link is not None:
            self.link.close()
        self.env.close()
