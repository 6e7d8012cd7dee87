"""`resources.learners`: PPO in several processes (torch.distributed), each stepping its share of the envs.

`roborl train CONFIG resources.learners=N` spawns the N processes itself (a free localhost port for the
rendezvous); under torchrun (`torchrun --nproc-per-node N -m roborl.cli train CONFIG resources.learners=N`:
RANK and WORLD_SIZE set) each process it started is one learner. Every
learner is a `Trainer` of `env.num_envs / N` envs with seeds of its own, and the learners stay one model:

- weights: rank 0's are broadcast at the start; then every learner applies the same averaged gradients
  with the same optimizer state, so the weights stay equal without further broadcasts.
- gradients: all-reduced (averaged) after each minibatch's backward, before clipping. A learner's
  minibatch is its share of the global one (each learner takes `minibatches` per epoch from its rows),
  and the mean of the learners' mean losses is the mean loss of the global minibatch: the update is the
  single-process update of the concatenated batch. The gradients are reduced by hand rather than by
  DistributedDataParallel, which hooks only `forward` (PPO calls `evaluate`, `cost_value`,
  `bc_regularizer`) and would overwrite the observation normalizer with rank 0's on every call.
- advantage normalization: the mean and std of the global minibatch (two all-reduces), and the approximate
  KL of the global minibatch, so that early stopping (target_kl) and adaptive_lr agree on every learner.
- the observation normalizer: each update gathers every learner's `state` observations and updates it
  with all of them, so every learner holds the normalizer of the whole batch.
- rank 0 alone evaluates (and broadcasts the result, so stop_at_success stops every learner), decides
  when to stop (max_minutes), writes logs, checkpoints and the summary; episode statistics are gathered
  from every learner for its logs.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import socket
import types
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from roborl.algos.ppo import PPO
from roborl.builder import resolve_device
from roborl.config import Config
from roborl.errors import UserError
from roborl.logger import Logger
from roborl.off_policy import make_trainer
from roborl.trainer import Trainer

SEED_STRIDE = 100_000  # learner r seeds its envs and sampling with train.seed + r·SEED_STRIDE


def all_sum(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    dist.all_reduce(x)
    return x


class DistributedPPO(PPO):
    """PPO whose minibatch is the union of every learner's share. The shares are equal (env.num_envs is
    divisible by the learners, so every learner's rollout, and each of its minibatches, has as many rows)."""

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        return all_sum(x.mean()) / dist.get_world_size()

    def normalize_advantages(self, adv: torch.Tensor) -> torch.Tensor:
        mean = self.mean(adv)
        n = adv.numel() * dist.get_world_size()
        std = (self.mean((adv - mean).square()) * n / (n - 1)).sqrt()  # unbiased, as Tensor.std
        return (adv - mean) / (std + 1e-8)

    def reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if op == "sum":
            return all_sum(x)
        x = x.clone()
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        return x

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()
        average_gradients(self.params)


def average_gradients(params: list[torch.nn.Parameter]) -> None:
    """Every learner's gradients replaced by their mean over the learners (one all-reduce)."""
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


class SilentLogger:
    """The logger of ranks > 0: rank 0 alone writes TensorBoard scalars and the console."""

    bar = types.SimpleNamespace(write=lambda text: None)

    def scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        pass

    def advance(self, steps: int, postfix: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


def shard_config(cfg: Config, rank: int, world: int, device: torch.device) -> Config:
    """What learner `rank` trains with: its share of the envs, its seeds, its device (one GPU each)."""
    return dataclasses.replace(
        cfg, env=dataclasses.replace(cfg.env, num_envs=cfg.env.num_envs // world),
        train=dataclasses.replace(cfg.train, seed=cfg.train.seed + SEED_STRIDE * rank, device=str(device)),
        resources=dataclasses.replace(cfg.resources, learners=1))


class DistributedTrainer(Trainer):
    """One learner (see the module's docstring); `train` returns the summary on rank 0, None elsewhere."""

    def __init__(self, cfg: Config, rank: int, world: int, device: torch.device) -> None:
        self.rank, self.world = rank, world
        super().__init__(cfg, shard_config(cfg, rank, world, device))
        for tensor in self.policy.state_dict().values():
            dist.broadcast(tensor, 0)

    def make_algo(self) -> DistributedPPO:
        self.lagrangian = None  # PPO-Lagrangian runs in one process (config.py)
        return DistributedPPO(self.policy, self.cfg.algo, compile=self.cfg.resources.compile)

    def open_run_dir(self, resumed: Path | None) -> Path:
        path = [str(super().open_run_dir(resumed)) if self.rank == 0 else None]
        dist.broadcast_object_list(path, 0)
        return Path(path[0])

    def make_logger(self, total_steps: int) -> Logger | SilentLogger:
        return super().make_logger(total_steps) if self.rank == 0 else SilentLogger()

    def write_summary(self, summary: dict) -> None:
        if self.rank == 0:
            super().write_summary(summary)

    def save(self, name: str, wall: float) -> Path:
        return super().save(name, wall) if self.rank == 0 else self.run_dir / "checkpoints" / f"{name}.safetensors"

    def run_eval(self, wall: float) -> dict[str, float]:
        result = [super().run_eval(wall) if self.rank == 0 else None]
        dist.broadcast_object_list(result, 0)
        return result[0]

    def agree(self, stop: bool) -> bool:
        flag = torch.tensor(float(stop), device=self.device)
        dist.broadcast(flag, 0)
        return bool(flag)

    def update_normalizer(self, obs: dict) -> None:
        """The normalizer of every learner's observations: all policies normalize `state` alone."""
        state = obs["state"].contiguous()
        parts = [torch.empty_like(state) for _ in range(self.world)]
        dist.all_gather(parts, state)
        self.policy.update_normalizer({"state": torch.cat(parts)})

    def iterate(self, total_iters: int) -> dict[str, float]:
        violations = self.train_violations
        stats = super().iterate(total_iters)
        shares = [None] * self.world
        dist.all_gather_object(shares, (self.episodes, self.train_violations - violations))
        keys = dict.fromkeys(k for episodes, _ in shares for k in episodes)
        self.episodes = {k: [v for episodes, _ in shares for v in episodes.get(k, [])] for k in keys}
        self.train_violations = violations + sum(extra for _, extra in shares)
        return stats

    def train(self) -> dict | None:
        summary = super().train()
        return summary if self.rank == 0 else None


def backend_of(cfg: Config, device: torch.device) -> str:
    backend = cfg.resources.backend
    if backend == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise UserError("resources.backend nccl needs CUDA (train.device cuda); use gloo or auto on the CPU")
    return backend


def learner_device(cfg: Config, local_rank: int) -> torch.device:
    device = resolve_device(cfg.train.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)
    return device


def run_learner(cfg: Config, rank: int, world: int, local_rank: int, init_method: str) -> dict | None:
    """One learner, from joining the process group to leaving it."""
    device = learner_device(cfg, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend_of(cfg, device), init_method=init_method, rank=rank, world_size=world)
    try:
        return DistributedTrainer(cfg, rank, world, device).train()
    finally:
        dist.destroy_process_group()


def _spawned(rank: int, cfg: Config, port: int, results: mp.SimpleQueue) -> None:
    try:
        summary = run_learner(cfg, rank, cfg.resources.learners, rank, f"tcp://127.0.0.1:{port}")
    except UserError as exc:
        results.put(("error", str(exc)))
        raise SystemExit(2)
    if rank == 0:
        results.put(("summary", summary))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(cfg: Config) -> dict:
    """Runs `resources.learners` learner processes on this machine; rank 0's summary."""
    backend_of(cfg, learner_device(cfg, 0))  # a bad backend fails here, before any process starts
    results = mp.get_context("spawn").SimpleQueue()
    # when one learner fails, the error says why; not each learner's termination that follows
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    try:
        mp.start_processes(_spawned, (cfg, free_port(), results), nprocs=cfg.resources.learners,
                           start_method="spawn")
    except (mp.ProcessExitedException, mp.ProcessRaisedException):
        while not results.empty():
            kind, value = results.get()
            if kind == "error":
                raise UserError(value) from None
        raise
    return results.get()[1]


def train(cfg: Config) -> dict | None:
    """Trains `cfg` with `resources.learners` processes: one (the plain Trainer), spawned ones, or those
    torchrun started. The summary; None in the processes of ranks > 0 under torchrun."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        world = int(os.environ["WORLD_SIZE"])
        if world != cfg.resources.learners:
            raise UserError(f"torchrun started {world} processes but resources.learners is "
                            f"{cfg.resources.learners}; make them equal")
        if world > 1:
            return run_learner(cfg, int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", 0)), "env://")
    if cfg.resources.learners == 1:
        return make_trainer(cfg).train()
    return spawn(cfg)
