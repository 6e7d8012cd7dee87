"""Reward machines on Sequence (touch A, then B, then C), all in one run: PPO with the machine's state
and shaping (configs/rm_sequence.yaml) vs PPO on the task's plain sparse reward
(configs/ppo_sequence_sparse.yaml) with the same env-step budget; then the machine's step cost.

Prints the success of both at the same env steps and the steps to 90%, and the reward machine's cost
per env step at N=256 in % of the simulator's step (the compiled machine alone, and the whole wrapper:
one-hot observation, shaping, bookkeeping). Writes `docs/results/reward_machines.{json,md,png}`.

Usage: python bench/reward_machines.py [--run-dir runs/reward_machines] [--steps 2000000] [--reuse]
About 10 + 10 minutes of training on 2 CPU cores.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from study import env_seconds_per_step, first_reaching, run_once, write_results

from roborl import (
    sim,
    tasks,  # noqa: F401  (registers mujoco/Sequence)
)
from roborl.config import load_config
from roborl.rm import RewardMachine, RewardMachineEnv
from roborl.runner import Runner

ROOT = Path(__file__).resolve().parents[1]
SEEDS = "1 training seed per run (`train.seed` of each config)"
RUNS = {"rm_shaped": "rm_sequence", "plain_sparse": "ppo_sequence_sparse"}


def step_cost(num_envs: int = 256, steps: int = 200, repeats: int = 3) -> dict[str, float]:
    """Seconds per step of the raw simulator, of the simulator wrapped by the machine, and of the
    compiled machine's tensor step alone; best of `repeats`."""
    torch.set_num_threads(1)
    machine = RewardMachine.from_file(ROOT / "tasks" / "sequence.rm")
    raw = sim.make("mujoco/Sequence", num_envs, seed=0)
    wrapped = RewardMachineEnv(sim.make("mujoco/Sequence", num_envs, seed=0), machine, shaping_gamma=0.9)
    actions = torch.rand(steps, num_envs, raw.action_dim) * 2 - 1
    best = env_seconds_per_step({"env_step_s": raw, "wrapped_step_s": wrapped}, actions, repeats)
    best["machine_step_s"] = float("inf")
    labels = torch.rand(num_envs, 3) < 0.3
    terms = torch.rand(num_envs, 3)
    u = torch.zeros(num_envs, dtype=torch.long)
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            wrapped.machine.step(u, labels, terms)
        best["machine_step_s"] = min(best["machine_step_s"], (time.perf_counter() - start) / steps)
    raw.close()
    wrapped.close()
    best["machine_pct_of_env_step"] = 100 * best["machine_step_s"] / best["env_step_s"]
    best["wrapper_pct_of_env_step"] = 100 * (best["wrapped_step_s"] - best["env_step_s"]) / best["env_step_s"]
    return best


def success_at(history: list[list[float]], steps: float) -> float:
    """The last eval success at or before `steps` env steps."""
    before = [s for st, _, s in history if st <= steps]
    return before[-1] if before else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", default="runs/reward_machines")
    p.add_argument("--steps", type=int, default=2_000_000)
    p.add_argument("--max-minutes", type=float, default=20.0)
    p.add_argument("--reuse", action="store_true")
    p.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    args = p.parse_args()
    run_dir = Path(args.run_dir)
    common = [f"train.run_dir={run_dir}", "train.progress=false", f"train.total_steps={args.steps}",
              f"train.max_minutes={args.max_minutes}"]
    summaries = {}
    for name in args.runs:
        cfg = load_config(ROOT / "configs" / f"{RUNS[name]}.yaml", [*common, f"train.name={name}"])
        summaries[name] = run_once(run_dir, name, args.reuse, lambda: Runner(cfg).train())
        print(name, json.dumps({k: summaries[name][k] for k in ("best_success_rate", "env_steps", "wall_time_s")}),
              flush=True)
    budget = min(s["env_steps"] for s in summaries.values())
    rows = []
    for name, s in summaries.items():
        hist = s["eval_history"]
        reached = first_reaching(hist, 0.9)
        rows.append({"run": name, "config": f"configs/{RUNS[name]}.yaml", "env_steps": s["env_steps"],
                     "success_at_budget": success_at(hist, budget), "best_success": s["best_success_rate"],
                     "env_steps_to_90": reached[0] if reached else None,
                     "minutes_to_90": reached[1] / 60 if reached else None})
    cost = step_cost()
    lines = [f"| run | eval success at {budget:,} env steps | best eval | env steps to 90% |", "|---|---|---|---|"]
    for r in rows:
        to90 = f"{int(r['env_steps_to_90']):,} ({r['minutes_to_90']:.1f} min)" if r["env_steps_to_90"] else "not reached"
        lines.append(f"| {r['run']} (`{r['config']}`) | {r['success_at_budget']:.3f} | {r['best_success']:.3f} | {to90} |")
    lines += ["", "| N = 256, per env step | simulator step | compiled machine step | whole RM wrapper |", "|---|---|---|---|",
              f"| share of the simulator step | 100% | {cost['machine_pct_of_env_step']:.2f}% | "
              f"{cost['wrapper_pct_of_env_step']:.2f}% |"]
    write_results("reward_machines", "Reward machines on Sequence (A → B → C)", lines, {"rows": rows, "step_cost": cost},
                  seeds=SEEDS, curves={n: [(st, r) for st, _, r in s["eval_history"]] for n, s in summaries.items()},
                  plot_title="Sequence A→B→C: reward machine + shaping vs sparse reward")


if __name__ == "__main__":
    main()
