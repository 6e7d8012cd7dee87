"""Scale-out, all measured in one run: PPO training steps/s (collect + update, end to end) on Push with
the envs in the learner's process, in 1 or 2 Ray env workers (synchronous, asynchronous, learner-side
inference), each with and without torch.compile. With a CUDA device it adds the GPU-batched MuJoCo
backend (mujoco-warp) at 1024 and 4096 envs, end to end and against the raw simulator, and at 4096 envs
with the rollout's inference compiled and replayed as CUDA graphs. `--gpu-only` measures the in-process
row and the GPU rows alone (no Ray needed).

Prints a markdown table and writes `docs/results/scale.{md,json,png}`; ratios are to the first row (in-process,
no compile), measured in this run.
Usage: python bench/scale.py [--envs 64] [--iterations 8] [--gpu-only]
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch
from study import started_runner, write_results

ROOT = Path(__file__).resolve().parents[1]
PUSH = ROOT / "configs" / "ppo_push.yaml"

SETUPS = {  # name: overrides
    "in-process": [],
    "1 env worker": ["resources.env_workers=1"],
    "2 env workers": ["resources.env_workers=2"],
    "2 env workers, async (staleness 1)": ["resources.env_workers=2", "resources.async_rollouts=true"],
    "2 env workers, learner-side inference": ["resources.env_workers=2", "resources.inference=learner"],
}


def training_rate(overrides: list[str], iterations: int, warmup: int) -> dict[str, float]:
    """Steps/s of `iterations` PPO iterations after `warmup` ones (compilation happens in those)."""
    with started_runner(PUSH, overrides) as trainer:
        total = warmup + iterations
        collect = []
        start = 0.0
        for i in range(total):
            if i == warmup:
                start = time.perf_counter()
            stats, _ = trainer.iterate(total)
            trainer.iteration += 1
            if i >= warmup:
                collect.append(stats["collect_sps"])
        seconds = time.perf_counter() - start
        steps = iterations * trainer.env.num_envs * trainer.cfg.train.rollout_steps
    return {"sps": steps / seconds, "collect_sps": float(np.median(collect))}


def add_row(rows: list[tuple[str, dict[str, float]]], label: str, rate: dict[str, float]) -> None:
    """Append a measured row and print it at once, so a run cut short still shows what it measured."""
    rows.append((label, rate))
    print(f"{label}: {rate['sps']:.0f} steps/s", flush=True)


def simulator_rows(n: int) -> list[tuple[str, dict[str, float]]]:
    """mujoco-warp's Push on CUDA at `n` envs, 50 control steps each: the raw simulator (its substeps on the GPU,
    the state staying there), the same with the state through host memory as our MuJoCo env hands it in, and our
    VecEnv's step (actions in, observations, rewards and dones out)."""
    from roborl import (
        sim,
        tasks,  # noqa: F401
    )

    rows = []
    env = sim.make("mujoco/Push", n, device="cuda", backend="warp")
    env.reset(seed=0)
    action = torch.zeros(n, env.action_dim, device="cuda")
    physics, state, ctrl = env.unwrapped.physics, env.unwrapped.state.copy(), env.unwrapped._ctrl.copy()
    for label, step in (("raw mujoco-warp (state on the GPU)", physics.advance),
                        ("mujoco-warp, state through host memory", lambda: physics.step(state, ctrl)),
                        ("our VecEnv", lambda: env.step(action.uniform_(-1, 1)))):
        step()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(50):
            step()
        torch.cuda.synchronize()
        add_row(rows, f"{label}, {n} envs (GPU)", {"sps": 50 * n / (time.perf_counter() - t)})
    env.close()
    return rows


def gpu_rows(iterations: int) -> list[tuple[str, dict[str, float]]]:
    """mujoco-warp on CUDA at 1024 and 4096 envs: the simulator's rows, then PPO end to end."""
    rows = []
    for n in (1024, 4096):
        rows += simulator_rows(n)
        ppo = [f"env.num_envs={n}", "env.backend=warp", "train.device=cuda"]
        add_row(rows, f"PPO end to end, mujoco-warp, {n} envs (GPU)", training_rate(ppo, iterations, 2))
    add_row(rows, "PPO end to end, mujoco-warp, 4096 envs, compiled + CUDA graphs (GPU)",
            training_rate([*ppo, "resources.compile=true", "resources.cuda_graphs=true"], iterations, 3))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--gpu-only", action="store_true", help="the in-process row and the GPU rows alone")
    args = parser.parse_args()
    ray = None
    if not args.gpu_only:
        import ray

        ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    rows = []
    for compiled in (False, True):
        for name, overrides in SETUPS.items():
            if args.gpu_only and (compiled or overrides):
                continue
            extra = [f"env.num_envs={args.envs}", f"resources.compile={str(compiled).lower()}"]
            label = f"{name}{', compiled' if compiled else ''}"
            add_row(rows, label, training_rate(overrides + extra, args.iterations, warmup=3 if compiled else 1))
    if ray is not None:
        ray.shutdown()
    if torch.cuda.is_available():
        rows += gpu_rows(args.iterations)
    else:
        print("no CUDA device: the GPU rows (mujoco-warp at 1024 and 4096 envs) need one")
    base = rows[0][1]["sps"]
    lines = [f"PPO on mujoco/Push, {args.envs} envs, {os.cpu_count()} CPU cores"
             f"{f', Ray {ray.__version__}' if ray else ''}", "",
             "| setup | train steps/s | collect steps/s | vs in-process |", "|---|---|---|---|"]
    for label, rate in rows:
        collect = f"{rate['collect_sps']:.0f}" if "collect_sps" in rate else "-"
        lines.append(f"| {label} | {rate['sps']:.0f} | {collect} | {rate['sps'] / base:.2f}x |")
    write_results("scale", "Scaling out: PPO training steps/s in one process, in Ray env workers, on a GPU", lines,
                  {"rows": {label: rate for label, rate in rows}}, seeds="not applicable (speed)",
                  bars={label: rate["sps"] for label, rate in rows}, bar_label="PPO training env steps per second")


if __name__ == "__main__":
    main()
