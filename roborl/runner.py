"""The one training loop. It drives any algorithm (roborl/algos/) through the same calls, and data from any
collector (this process, or Ray env workers), with one learner or several (roborl/learners.py):

    for each iteration:  algo.start_iteration → collector.collect(algo) → algo.update
                         → log → evaluate → checkpoint → stop (total steps, time budget, success)

Evaluation, logging, checkpoints, resume, the time budget and the progress bar live here, once. With
several learners, rank 0 alone evaluates, logs and writes; the others follow its decisions.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path

import torch
import yaml

from roborl.algos import make_algorithm
from roborl.algos.base import Comm
from roborl.builder import build, load_pretrained, make_run_env, resolve_device, use_call_chooser
from roborl.checkpoint import Checkpoint, save_checkpoint
from roborl.collect import EpisodeLog
from roborl.collectors import make_collector
from roborl.config import Config, config_to_dict
from roborl.config_rules import check_trainable
from roborl.errors import UserError
from roborl.evaluate import evaluate, require_video_writer
from roborl.logger import Logger, SilentLogger
from roborl.plots import plot_curves
from roborl.run_dir import claim, new_run_dir, release, write_json
from roborl.termination import sigterm_as_interrupt


def check_time_left(trained_s: float, max_minutes: float | None) -> None:
    """train.max_minutes bounds the run's whole wall time, across resumes: a run it stopped cannot be carried
    on under the same budget (it would stop again after one iteration), so that is refused up front."""
    if max_minutes and trained_s >= 60 * max_minutes:
        raise UserError(f"this run has trained {trained_s / 60:.1f} min, which spends train.max_minutes={max_minutes:g} "
                        f"(the run's whole wall time, across resumes): carry it on with a larger one, e.g. "
                        f"train.max_minutes={math.ceil(trained_s / 60) + max_minutes:g}")


def update_threads(cfg: Config, learners: int, threads: int) -> int:
    """Torch threads for the update. The local simulator's threads are idle then (the loop is synchronous), so
    the update may take the cores it leaves; not so where Ray env workers keep stepping envs meanwhile. During
    rollouts torch keeps `threads`: its idle workers spin for a while and would slow the physics threads."""
    if cfg.train.update_threads:
        return cfg.train.update_threads
    if cfg.resources.env_workers:
        return threads
    return max(threads, (os.cpu_count() or 1) // max(1, learners))


class Runner:
    def __init__(self, cfg: Config, shard: Config | None = None, comm: Comm | None = None) -> None:
        """`cfg` is the run's config, saved with it; `shard`, where given, what this process trains with
        (one learner's share of the envs and its own seeds, roborl/learners.py); `comm`, how it agrees with
        the other learners."""
        self.run_cfg = cfg
        self.cfg = cfg = shard or cfg
        self.comm = comm = comm or Comm()
        self.is_main = comm.rank == 0
        self.records_video = cfg.train.video and cfg.env.id.startswith("mujoco/")  # eval videos
        if self.records_video:
            require_video_writer()  # before the run dir exists, not at the first eval
        resume = Checkpoint(cfg.train.resume) if cfg.train.resume else None
        st = resume.training_state() if resume is not None else {}
        check_time_left(st.get("wall_time_s", 0.0), cfg.train.max_minutes)
        self.device = resolve_device(cfg.train.device)
        self.threads = cfg.train.threads or max(1, (os.cpu_count() or 1) // 2)
        self.update_threads = update_threads(cfg, comm.world, self.threads)
        torch.set_num_threads(self.threads)
        torch.manual_seed(cfg.train.seed)
        self.collector = make_collector(cfg, self.device)
        self.env, self.policy = build(cfg, self.device, self.collector.env)
        self.algo = make_algorithm(cfg, self.policy, self.env, self.device, comm)
        self.plan = self.algo.schedule(self.run_cfg)  # iterations, progress units, evaluation and save cadence
        comm.broadcast_module(self.policy)
        self.env_steps = 0  # env steps trained on
        self.step = 0  # progress in the algorithm's unit (env steps; gradient steps for BC): the logs' x-axis
        self.iteration = 0
        self.best_score: float | None = None  # of train.best_metric; the first evaluation is the best so far
        self.last_eval: dict[str, float] = {}
        self.eval_history: list[list[float]] = []  # [step, wall_s, success_rate]
        self.wall_time_prev = 0.0
        self.train_violations = 0.0
        run_dir = None
        if resume is not None:
            resume.load_policy(self.policy)
            resume.load_algo(self.algo)
            self.env_steps, self.iteration = st["env_steps"], st["iteration"]
            self.step = st.get("step", self.env_steps)
            self.best_score = st.get("best_score", st.get("best_success"))
            self.last_eval, self.wall_time_prev = st.get("last_eval", {}), st.get("wall_time_s", 0.0)
            self.eval_history = st.get("eval_history", [])
            self.train_violations = st.get("train_violation_steps", 0.0)
            self.collector.load_state_dict(st.get("collector", {}))
            run_dir = Path(st["run_dir"])
            torch.manual_seed(cfg.train.seed + self.iteration)
        elif cfg.policy.init:
            load_pretrained(self.policy, cfg.policy.init, cfg.policy.init_modules)
        check_trainable(cfg)  # last of the checks, before anything is written
        self.run_dir = self.open_run_dir(run_dir)
        self.collector.on_run_dir(self.run_dir)
        self.eval_env = None

    # ---- what only rank 0 does; the other learners take its word -------------------------------
    def open_run_dir(self, resumed: Path | None) -> Path:
        """The directory of a resumed run, or a new one (claimed by this process); with the run's config.yaml.
        The run's wall time counts segments that a kill cut short too (`clock.json`, written every iteration)."""
        path = None
        if self.is_main:
            t = self.cfg.train
            if resumed is not None:
                claim(resumed)
                path = resumed
                clock = path / "clock.json"
                if clock.exists():
                    self.wall_time_prev = max(self.wall_time_prev, json.loads(clock.read_text())["wall_time_s"])
            else:
                path = new_run_dir(t.name, t.run_dir, self.cfg.env.id.replace("/", "_"))
            (path / "config.yaml").write_text(yaml.safe_dump(config_to_dict(self.run_cfg), sort_keys=False))
        return Path(self.comm.broadcast_object(str(path) if path else None))

    def make_logger(self, total_steps: int) -> Logger | SilentLogger:
        """TensorBoard and the progress bar. A resumed run drops what its killed predecessor logged after the
        checkpoint it resumes from (TensorBoard's purge step), so every step has one point."""
        if not self.is_main:
            return SilentLogger()
        purge = self.step + 1 if self.iteration > 0 else None
        return Logger(self.run_dir, total_steps, self.step, self.cfg.train.progress, purge_step=purge)

    def write_summary(self, summary: dict) -> None:
        if self.is_main:
            write_json(self.run_dir / "summary.json", summary)

    def trainer_state(self, wall: float) -> dict:
        return {"env_steps": self.env_steps, "step": self.step, "iteration": self.iteration, "best_score": self.best_score,
                "lr": self.algo.lr, "run_dir": str(self.run_dir), "last_eval": self.last_eval, "wall_time_s": wall,
                "eval_history": self.eval_history, "train_violation_steps": self.train_violations,
                "collector": self.collector.state_dict()}

    def save(self, name: str, wall: float) -> Path:
        path = self.run_dir / "checkpoints" / f"{name}.safetensors"
        if self.is_main:
            save_checkpoint(path, self.policy, self.algo.state_dict(), config_to_dict(self.run_cfg),
                            self.trainer_state(wall))
            self.collector.on_checkpoint()
        return path

    def run_eval(self, wall: float) -> dict[str, float]:
        result = self.evaluate(wall) if self.is_main else None
        return self.comm.broadcast_object(result)

    def evaluate(self, wall: float) -> dict[str, float]:
        """Deterministic episodes in the evaluation envs (in the training envs where the simulator allows one
        env per process: training pauses, and its episodes start over after)."""
        t = self.cfg.train
        if self.eval_env is None:
            self.eval_env = self.env if self.env.unwrapped.one_per_process or not self.algo.steps_envs else \
                make_run_env(dataclasses.replace(self.cfg, env=self.cfg.env.for_evaluation()),
                             min(t.eval_envs, t.eval_episodes), t.seed + 1, self.device)
            use_call_chooser(self.eval_env, self.policy)
        video = None
        if self.records_video:
            (self.run_dir / "videos").mkdir(exist_ok=True)
            video = self.run_dir / "videos" / f"eval_{self.step:09d}.mp4"
        self.policy.eval()
        result = evaluate(self.policy, self.eval_env, t.eval_episodes, seed=t.seed + 1000,
                          video_path=video, video_envs=t.video_envs)
        self.policy.train()
        if self.eval_env is self.env:
            self.obs = self.env.reset(seed=t.seed + 1 + self.iteration)
        self.last_eval = result
        self.eval_history.append([self.step, round(wall, 2), result["success_rate"]])
        plot_curves(self.run_dir / "eval_curve.png", {"deterministic eval": [(s, r) for s, _, r in self.eval_history]},
                    f"{self.run_dir.name}: {self.cfg.env.id}", xlabel=self.plan.unit)
        score = result[self.best_key()]
        if self.best_score is None or score > self.best_score:
            self.best_score = score
            self.save("best", wall)
        return result

    def best_key(self) -> str:
        """The evaluation result that picks best.safetensors (train.best_metric)."""
        metric = self.cfg.train.best_metric
        if metric == "auto":
            metric = "success" if (self.eval_env or self.env).unwrapped.reports_success else "return"
        return "success_rate" if metric == "success" else "mean_return"

    def summary(self, wall: float, finished: bool) -> dict:
        """What the last checkpoint holds; `finished` says whether the run got to its end (steps, budget,
        `train.max_minutes` or `train.stop_at_success`) or is still going, interrupted or killed."""
        return {"finished": finished, "success_rate": self.last_eval.get("success_rate", float("nan")),
                "success_once": self.last_eval.get("success_once", float("nan")),
                "mean_return": self.last_eval.get("mean_return", float("nan")),
                "best_success_rate": max((r for _, _, r in self.eval_history), default=float("nan")),
                "best_score": self.best_score, "best_metric": self.best_key(),
                "env_steps": self.env_steps, "step": self.step,
                "iterations": self.iteration, "wall_time_s": round(wall, 2), "env": self.cfg.env.id,
                "run_dir": str(self.run_dir), "eval_history": self.eval_history,
                "train_violation_steps": self.train_violations, **self.collector.summary(), **self.algo.summary()}

    # ---- the loop -----------------------------------------------------------------------------
    def start(self) -> None:
        """Resets the envs for the next iteration and, before the first one, fits the observation normalizer to
        them: what `train` does before its loop, and what a benchmark does before timing `iterate`."""
        self.obs = self.env.reset(seed=self.cfg.train.seed + self.iteration)
        if self.iteration == 0 and self.algo.steps_envs:
            self.policy.update_normalizer(self.comm.gather_state(self.obs))

    def iterate(self, total_iters: int) -> tuple[dict[str, float], EpisodeLog]:
        """One iteration: the algorithm's data from the collector, then its update."""
        log = EpisodeLog()
        self.algo.start_iteration(self.iteration, total_iters)
        start = time.time()
        self.obs = self.collector.collect(self.algo, self.obs, log)
        collect_time = time.time() - start
        torch.set_num_threads(self.update_threads)
        try:
            stats = self.algo.update()
        finally:
            torch.set_num_threads(self.threads)
        stats.setdefault("collect_sps", self.algo.env_steps / max(collect_time, 1e-9))
        stats.update(self.collector.stats())
        return stats, self.comm.gather_log(log)

    def train(self) -> dict | None:
        """Iterations of `iterate`, each followed by logging, evaluation, checkpoints. The summary (None on
        learners other than rank 0)."""
        cfg, t = self.cfg, self.cfg.train
        plan = self.plan
        total_iters = plan.iterations
        logger = self.make_logger(total_iters * plan.units_per_iteration)
        start = time.time()
        wall = self.wall_time_prev
        self.start()
        if self.iteration == 0 and self.algo.steps_envs and (cfg.policy.init or cfg.policy.kind == "residual") \
                and t.eval_at_start:
            result = self.run_eval(wall)
            logger.scalars("eval", result, self.step)
            logger.bar.write(f"[0 steps] eval success of the initial policy {result['success_rate']:.3f}")
        finished = self.iteration >= total_iters
        with sigterm_as_interrupt():  # a scheduler's SIGTERM saves the run as Ctrl-C does
            try:
                while self.iteration < total_iters:
                    it_start = time.time()
                    stats, log = self.iterate(total_iters)
                    self.iteration += 1
                    self.env_steps += self.algo.env_steps * self.comm.world
                    self.step += self.algo.progress * self.comm.world
                    self.train_violations += log.violations
                    wall = self.wall_time_prev + time.time() - start
                    if self.is_main:
                        write_json(self.run_dir / "clock.json", {"wall_time_s": wall})
                    sps = self.algo.progress * self.comm.world / (time.time() - it_start)
                    stats["sps"] = sps
                    logger.scalars("train", stats, self.step)
                    rollout = log.means()
                    if rollout:
                        logger.scalars("rollout", rollout, self.step)
                    postfix = {"sps": sps, "ret": rollout.get("return", 0.0)}
                    last = self.comm.agree(self.iteration == total_iters or self.collector.budget_spent()
                                          or bool(t.max_minutes and wall > 60 * t.max_minutes))
                    if self.iteration % plan.eval_every == 0 or last:
                        result = self.run_eval(wall)
                        logger.scalars("eval", result, self.step)
                        logger.bar.write(f"[{self.step} {plan.unit}, {wall:.0f}s] eval success {result['success_rate']:.3f} "
                                         f"(once {result['success_once']:.3f}) return {result['mean_return']:.2f}")
                        if t.stop_at_success is not None and result["success_rate"] >= t.stop_at_success:
                            logger.bar.write(f"eval success reached train.stop_at_success={t.stop_at_success}: stopping")
                            last = True
                    if "success_rate" in self.last_eval:
                        postfix["eval_success"] = self.last_eval["success_rate"]
                    logger.advance(self.algo.progress * self.comm.world, postfix)
                    if self.iteration % plan.save_every == 0 or last:
                        self.save("last", wall)
                        self.write_summary(self.summary(wall, finished=last))
                    if last:
                        finished = True
                        break
            except KeyboardInterrupt:
                logger.bar.write("interrupted: saving the last checkpoint")
                self.save("last", wall)
                self.write_summary(self.summary(wall, finished=False))
            finally:
                logger.close()
        summary = self.summary(wall, finished)
        self.close()
        return summary if self.is_main else None

    def close(self) -> None:
        """Closes the envs and lets go of the run directory (another process may then carry the run on)."""
        self.collector.close()
        if self.eval_env is not None and self.eval_env is not self.env:
            self.eval_env.close()
        if self.is_main:
            release(self.run_dir)
