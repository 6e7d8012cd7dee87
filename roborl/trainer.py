"""The training loop: collect a rollout, bootstrap time-outs, GAE, PPO update, evaluate, checkpoint, log."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from datetime import datetime
from pathlib import Path

import torch
import yaml

import sim
from roborl.algos.grpo import center_in_groups
from roborl.algos.lagrangian import PIDLagrangian
from roborl.algos.ppo import PPO
from roborl.buffer import RolloutBuffer, gae
from roborl.builder import build, load_pretrained, make_run_env, resolve_device
from roborl.checkpoint import Checkpoint, save_checkpoint
from roborl.compiling import maybe_compile
from roborl.config import Config, config_to_dict
from roborl.errors import UserError
from roborl.evaluate import evaluate, require_video_writer
from roborl.logger import Logger
from roborl.plots import plot_curves
from roborl.rollout import collect, record_episodes


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def new_run_dir(cfg: Config, default_name: str, hint: str = "choose another train.name") -> Path:
    """`train.run_dir/train.name` (or `default_name` with a timestamp), created; an existing, non-empty
    one is refused so that no earlier run is overwritten (`hint`, formatted with `run_dir`, says what to do)."""
    name = cfg.train.name or f"{default_name}_{datetime.now():%Y%m%d-%H%M%S}"
    run_dir = Path(cfg.train.run_dir) / name
    if run_dir.exists() and any(run_dir.iterdir()):
        raise UserError(f"run directory '{run_dir}' already exists; {hint.format(run_dir=run_dir)}")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def start_groups_alike(cfg: Config, env: sim.VecEnv, group_size: int, option: str) -> None:
    """Makes every full reset of `env` start groups of `group_size` consecutive envs from one initial state;
    `option` (the config key that asked for it) is refused in one line where that cannot work: the env has
    no group resets, `group_size` does not divide its envs, or an iteration is not one whole episode."""
    n = env.num_envs
    if n % group_size:
        raise UserError(f"env.num_envs ({n}) must be a multiple of {option} ({group_size})")
    raw = env.unwrapped
    if not hasattr(raw, "group_size"):
        raise UserError(f"{option} needs group resets; {cfg.env.id} has no reset option group_size "
                        "(the embedded mujoco/ tasks have it)")
    episode = env.max_episode_steps
    if episode is None or cfg.train.rollout_steps != episode:
        raise UserError(f"{option} needs whole episodes per iteration: set train.rollout_steps to the episode "
                        f"length ({episode})")
    raw.group_size = group_size  # every full reset, through any wrapper, starts groups alike


def check_time_left(trained_s: float, max_minutes: float | None) -> None:
    """train.max_minutes bounds the run's whole wall time, across resumes: a run it stopped cannot be carried
    on under the same budget (it would stop again after one iteration), so that is refused up front."""
    if max_minutes and trained_s >= 60 * max_minutes:
        raise UserError(f"this run has trained {trained_s / 60:.1f} min, which spends train.max_minutes={max_minutes:g} "
                        f"(the run's whole wall time, across resumes): carry it on with a larger one, e.g. "
                        f"train.max_minutes={math.ceil(trained_s / 60) + max_minutes:g}")


class Trainer:
    def __init__(self, cfg: Config, shard: Config | None = None) -> None:
        """`cfg` is the run's config, saved with it; `shard`, where given, what this process trains with:
        one learner's share of the envs and its own seeds (roborl/distributed.py)."""
        self.run_cfg = cfg
        self.cfg = cfg = shard or cfg
        self.records_video = cfg.train.video and cfg.env.id.startswith("mujoco/")  # eval videos
        if self.records_video:
            require_video_writer()  # before the run dir exists, not at the first eval
        resume = Checkpoint(cfg.train.resume) if cfg.train.resume else None
        if resume is not None:
            check_time_left(resume.trainer_state.get("wall_time_s", 0.0), cfg.train.max_minutes)
        self.device = resolve_device(cfg.train.device)
        torch.set_num_threads(cfg.train.threads or max(1, (os.cpu_count() or 1) // 2))
        torch.manual_seed(cfg.train.seed)
        self.env, self.policy = build(cfg, self.device, self.make_env())
        self.act = maybe_compile(self.policy.act, cfg.resources.compile,  # in rollouts only
                                 cuda_graphs=cfg.resources.cuda_graphs and self.device.type == "cuda")
        self.gae = maybe_compile(gae, cfg.resources.compile)
        self.algo = self.make_algo()
        self.env_steps = 0
        self.iteration = 0
        self.best_success = -1.0
        self.last_eval: dict[str, float] = {}
        self.eval_history: list[list[float]] = []  # [env_steps, wall_s, success_rate]
        self.wall_time_prev = 0.0
        if resume is not None:
            resume.load_policy(self.policy)
            if resume.optimizer_state is not None:
                self.algo.optimizer.load_state_dict(resume.optimizer_state)
            st = resume.trainer_state
            self.env_steps, self.iteration = st["env_steps"], st["iteration"]
            self.best_success = st["best_success"]
            self.algo.set_lr(st["lr"])
            self.last_eval, self.wall_time_prev = st.get("last_eval", {}), st.get("wall_time_s", 0.0)
            self.eval_history = st.get("eval_history", [])
            if getattr(self, "lagrangian", None) and "lagrangian" in st:
                self.lagrangian.load(st["lagrangian"])
                self.algo.lagrange = self.lagrangian.value
            run_dir = Path(st["run_dir"])
            torch.manual_seed(cfg.train.seed + self.iteration)
        else:
            if cfg.policy.init:
                load_pretrained(self.policy, cfg.policy.init, cfg.policy.init_modules)
            run_dir = None
        self.run_dir = self.open_run_dir(run_dir)
        self.eval_env = None
        self.train_violations = 0.0
        self.buffer: RolloutBuffer | None = None

    def make_env(self) -> sim.VecEnv:
        """The envs this process trains in (roborl/ray_trainer.py: those of its Ray env workers)."""
        return make_run_env(self.cfg, self.cfg.env.num_envs, self.cfg.train.seed, self.device)

    def make_algo(self) -> PPO:
        a = self.cfg.algo
        if a.group_size > 1:
            start_groups_alike(self.cfg, self.env, a.group_size, "algo.group_size")
        self.lagrangian = PIDLagrangian(a.cost_limit, a.lagrange_ki, a.lagrange_kp, a.lagrange_kd) \
            if a.cost_limit is not None else None
        return PPO(self.policy, a, compile=self.cfg.resources.compile)

    # ---- what only one process does, or all agree on (roborl/distributed.py: rank 0 of several) ----
    def open_run_dir(self, resumed: Path | None) -> Path:
        """The directory of a resumed run, or a new one; with the run's config.yaml."""
        run_dir = resumed or new_run_dir(self.cfg, self.cfg.env.id.replace("/", "_"), "choose another train.name "
                                         "or continue it with resume={run_dir}/checkpoints/last.safetensors")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(self.run_cfg), sort_keys=False))
        return run_dir

    def make_logger(self, total_steps: int) -> Logger:
        return Logger(self.run_dir, total_steps, self.env_steps, self.cfg.train.progress)

    def write_summary(self, summary: dict) -> None:
        write_json(self.run_dir / "summary.json", summary)

    def agree(self, stop: bool) -> bool:
        """Whether to stop after this iteration (with several learners, rank 0 decides for all)."""
        return stop

    def update_normalizer(self, obs: dict) -> None:
        self.policy.update_normalizer(obs)

    # ---- state ---------------------------------------------------------------------------------
    def trainer_state(self, wall: float) -> dict:
        return {"env_steps": self.env_steps, "iteration": self.iteration, "best_success": self.best_success,
                "lr": self.algo.lr, "run_dir": str(self.run_dir), "last_eval": self.last_eval, "wall_time_s": wall,
                "eval_history": self.eval_history,
                **({"lagrangian": self.lagrangian.state()} if getattr(self, "lagrangian", None) else {})}

    def save(self, name: str, wall: float) -> Path:
        path = self.run_dir / "checkpoints" / f"{name}.safetensors"
        save_checkpoint(path, self.policy, self.algo.optimizer, config_to_dict(self.run_cfg), self.trainer_state(wall))
        return path

    def run_eval(self, wall: float) -> dict[str, float]:
        t = self.cfg.train
        if self.eval_env is None:
            self.eval_env = self.env if self.env.unwrapped.one_per_process else \
                make_run_env(dataclasses.replace(self.cfg, env=self.cfg.env.for_evaluation()),
                             min(t.eval_envs, t.eval_episodes), t.seed + 1, self.device)
        video = None
        if self.records_video:
            (self.run_dir / "videos").mkdir(exist_ok=True)
            video = self.run_dir / "videos" / f"eval_{self.env_steps:09d}.mp4"
        self.policy.eval()
        result = evaluate(self.policy, self.eval_env, t.eval_episodes, seed=t.seed + 1000,
                          video_path=video, video_envs=t.video_envs)
        self.policy.train()
        if self.eval_env is self.env:  # evaluated in the training envs: their episodes start over
            self.obs = self.env.reset(seed=t.seed + 1 + self.iteration)
        self.last_eval = result
        self.eval_history.append([self.env_steps, round(wall, 2), result["success_rate"]])
        plot_curves(self.run_dir / "eval_curve.png", {"deterministic eval": [(s, r) for s, _, r in self.eval_history]},
                    f"{self.run_dir.name}: {self.cfg.env.id}")
        if result["success_rate"] > self.best_success:
            self.best_success = result["success_rate"]
            self.save("best", wall)
        return result

    def summary(self, wall: float) -> dict:
        return {"success_rate": self.last_eval.get("success_rate", float("nan")),
                "success_once": self.last_eval.get("success_once", float("nan")),
                "mean_return": self.last_eval.get("mean_return", float("nan")),
                "best_success_rate": self.best_success, "env_steps": self.env_steps,
                "iterations": self.iteration, "wall_time_s": round(wall, 2), "env": self.cfg.env.id,
                "run_dir": str(self.run_dir), "eval_history": self.eval_history,
                "train_violation_steps": self.train_violations}

    # ---- the loop -----------------------------------------------------------------------------
    def train(self) -> dict:
        """Iterations of `iterate` (collect + update), each followed by logging, evaluation, checkpoints."""
        cfg, t = self.cfg, self.cfg.train
        steps_per_iter = self.run_cfg.env.num_envs * t.rollout_steps * cfg.env.action_chunk  # all learners' steps
        total_iters = math.ceil(t.total_steps / steps_per_iter)
        logger = self.make_logger(total_iters * steps_per_iter)
        self.generator = torch.Generator().manual_seed(t.seed + self.iteration)
        start = time.time()
        wall = self.wall_time_prev
        self.obs = self.env.reset(seed=t.seed + self.iteration)
        if self.iteration == 0:
            self.update_normalizer(self.obs)
            if (cfg.policy.init or cfg.policy.kind == "residual") and t.eval_at_start:
                result = self.run_eval(wall)
                logger.scalars("eval", result, self.env_steps)
                logger.bar.write(f"[0 steps] eval success of the initial policy {result['success_rate']:.3f}")
        try:
            while self.iteration < total_iters:
                it_start = time.time()
                self.episodes: dict[str, list[float]] = {"return": [], "success": []}
                stats = self.iterate(total_iters)
                self.iteration += 1
                self.env_steps += steps_per_iter
                wall = self.wall_time_prev + time.time() - start
                sps = steps_per_iter / (time.time() - it_start)
                stats["sps"] = sps
                logger.scalars("train", stats, self.env_steps)
                rollout = {k: sum(v) / len(v) for k, v in self.episodes.items() if v}
                if rollout:
                    logger.scalars("rollout", rollout, self.env_steps)
                postfix = {"sps": sps, "ret": rollout.get("return", 0.0)}
                last = self.agree(self.iteration == total_iters or bool(t.max_minutes and wall > 60 * t.max_minutes))
                if self.iteration % t.eval_every == 0 or last:
                    result = self.run_eval(wall)
                    logger.scalars("eval", result, self.env_steps)
                    self.write_summary(self.summary(wall))
                    logger.bar.write(f"[{self.env_steps} steps, {wall:.0f}s] eval success {result['success_rate']:.3f} "
                                     f"(once {result['success_once']:.3f}) return {result['mean_return']:.2f}")
                    if t.stop_at_success is not None and result["success_rate"] >= t.stop_at_success:
                        logger.bar.write(f"eval success reached train.stop_at_success={t.stop_at_success}: stopping")
                        last = True
                if "success_rate" in self.last_eval:
                    postfix["eval_success"] = self.last_eval["success_rate"]
                logger.advance(steps_per_iter, postfix)
                if self.iteration % t.save_every == 0 or last:
                    self.save("last", wall)
                if last:
                    break
        except KeyboardInterrupt:
            logger.bar.write("interrupted: saving the last checkpoint")
            self.save("last", wall)
        finally:
            logger.close()
        summary = self.summary(wall)
        self.write_summary(summary)
        self.env.close()
        if self.eval_env is not None and self.eval_env is not self.env:
            self.eval_env.close()
        return summary

    def record_episodes(self, info: dict) -> None:
        self.train_violations += record_episodes(self.episodes, info)

    def iterate(self, total_iters: int) -> dict[str, float]:
        """One PPO iteration: a rollout of T steps with its advantages (`collect_rollout`), the update."""
        cfg = self.cfg
        if cfg.algo.anneal_lr:
            self.algo.set_lr(cfg.algo.lr * (1 - self.iteration / total_iters))
        collect_start = time.time()
        buffer = self.collect_rollout()
        collect_time = time.time() - collect_start
        if self.lagrangian is not None and self.episodes.get("cost"):
            self.algo.lagrange = self.lagrangian.update(sum(self.episodes["cost"]) / len(self.episodes["cost"]))
        stats = self.algo.update(buffer, self.generator, train_actor=self.iteration >= cfg.algo.critic_warmup)
        self.update_normalizer(buffer.obs)
        stats["collect_sps"] = buffer.T * buffer.N * cfg.env.action_chunk / collect_time
        return stats

    def collect_rollout(self) -> RolloutBuffer:
        """T steps from `self.obs` on, and GAE with bootstrapped time-outs (roborl/ray_trainer.py gathers
        them from its Ray env workers instead). With `algo.group_size` G > 1 the T steps are one episode
        from a group reset (seeded by the run's seed and the iteration, as GRPO's rounds), and each step's
        advantage is centered on its group's at that step: a same-state baseline beside the critic's."""
        cfg = self.cfg
        group = cfg.algo.group_size
        if group > 1:
            self.obs = self.env.reset(seed=cfg.train.seed * 1_000_003 + self.iteration)
        if self.buffer is None:
            self.buffer = RolloutBuffer(cfg.train.rollout_steps, self.env.num_envs, self.device, self.gae)
        buffer = self.buffer
        safe = self.lagrangian is not None
        self.obs = collect(self.policy, self.env, buffer, self.obs, self.act, cfg.algo.gamma, self.record_episodes,
                           safe)
        with torch.no_grad():
            buffer.finish(self.policy.value(self.obs), cfg.algo.gamma, cfg.algo.gae_lambda,
                          self.policy.cost_value(self.obs) if safe else None)
        if group > 1:
            buffer.advantages = center_in_groups(buffer.advantages, group)
        return buffer
