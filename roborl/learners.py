"""`resources.learners`: several learner processes (torch.distributed), each stepping its share of the envs.

`roborl train CONFIG resources.learners=N` spawns the N processes itself (a free localhost port for the
rendezvous); under torchrun (`torchrun --nproc-per-node N -m roborl.cli train CONFIG resources.learners=N`:
RANK and WORLD_SIZE set) each process it started is one learner. Every
learner is a `Runner` of `env.num_envs / N` envs with seeds of its own, whose algorithm (PPO) agrees with
the others through `LearnerComm`, and the learners stay one model:

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
import socket
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from roborl.algos.base import Comm
from roborl.builder import resolve_device
from roborl.collect import EpisodeLog
from roborl.config import SEED_STRIDE, Config
from roborl.errors import UserError
from roborl.runner import Runner


def all_sum(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    dist.all_reduce(x)
    return x


class LearnerComm(Comm):
    """How this learner agrees with the others over torch.distributed (see the module's docstring). The
    shares are equal (env.num_envs is divisible by the learners, so every learner's rollout, and each of its
    minibatches, has as many rows)."""

    def __init__(self, device: torch.device) -> None:
        self.rank, self.world, self.device = dist.get_rank(), dist.get_world_size(), device

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        return all_sum(x.mean()) / self.world

    def reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if op == "sum":
            return all_sum(x)
        x = x.clone()
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        return x

    def average_gradients(self, params: list[nn.Parameter]) -> None:
        """Every learner's gradients replaced by their mean over the learners (one all-reduce)."""
        grads = [p.grad for p in params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def gather_state(self, obs: dict) -> dict:
        state = obs["state"].contiguous()
        parts = [torch.empty_like(state) for _ in range(self.world)]
        dist.all_gather(parts, state)
        return {"state": torch.cat(parts)}

    def gather_log(self, log: EpisodeLog) -> EpisodeLog:
        shares: list[Any] = [None] * self.world
        dist.all_gather_object(shares, (log.values, log.violations))
        merged = EpisodeLog()
        for values, violations in shares:
            for key, v in values.items():
                merged.extend(key, v)
            merged.violations += violations
        return merged

    def broadcast_module(self, module: nn.Module) -> None:
        for tensor in module.state_dict().values():
            dist.broadcast(tensor, 0)

    def broadcast_object(self, value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, 0)
        return box[0]

    def agree(self, stop: bool) -> bool:
        flag = torch.tensor(float(stop), device=self.device)
        dist.broadcast(flag, 0)
        return bool(flag)


def shard_config(cfg: Config, rank: int, world: int, device: torch.device) -> Config:
    """What learner `rank` trains with: its share of the envs, its seeds, its device (one GPU each)."""
    return dataclasses.replace(
        cfg, env=dataclasses.replace(cfg.env, num_envs=cfg.env.num_envs // world),
        train=dataclasses.replace(cfg.train, seed=cfg.train.seed + SEED_STRIDE * rank, device=str(device)),
        resources=dataclasses.replace(cfg.resources, learners=1))


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
        return Runner(cfg, shard_config(cfg, rank, world, device), LearnerComm(device)).train()
    finally:
        dist.destroy_process_group()


def _spawned(rank: int, cfg: Config, port: int, results: mp.SimpleQueue) -> None:
    try:
        summary = run_learner(cfg, rank, cfg.resources.learners, rank, f"tcp://127.0.0.1:{port}")
    except UserError as exc:
        results.put(("error", str(exc)))
        raise SystemExit(2) from None
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
