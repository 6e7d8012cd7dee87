"""Safe RL on ReachAvoid, all in one run: PPO without safety, PPO with shields (CBF keep-out + speed),
and PPO-Lagrangian, each trained with the same budget, then evaluated on 1000 fresh episodes.

Prints per run: eval success, violation steps during all of training, episodes with a violation in the
1000-episode eval, mean episode cost, the shield's intervention rate in training; then the shield's
overhead in % of the env step at N=256. Writes `docs/results/shield.{json,md,png}`.

Usage: python bench/shield.py [--run-dir runs/shield] [--episodes 1000] [--reuse]
About 3 minutes per run on 2 CPU cores.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from study import env_seconds_per_step, run_once, write_results

from roborl.builder import make_env
from roborl.config import load_config
from roborl.evaluate import evaluate_checkpoint
from roborl.runner import Runner

ROOT = Path(__file__).resolve().parents[1]
SEEDS = "1 training seed per run (`train.seed` of each config)"
RUNS = {"unshielded": "ppo_reachavoid", "shielded": "ppo_shielded_reachavoid", "lagrangian": "ppo_lagrangian_reachavoid"}


def mean_scalar(run: Path, tag: str) -> float | None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    if tag not in acc.Tags()["scalars"]:
        return None
    values = [e.value for e in acc.Scalars(tag)]
    return sum(values) / len(values)


def shield_overhead(num_envs: int = 256, steps: int = 200, repeats: int = 3) -> float:
    """Extra time per env step of the shielded env over the same env without shields, in %."""
    torch.set_num_threads(1)
    plain = make_env(load_config(ROOT / "configs" / "ppo_reachavoid.yaml").env, num_envs, 0, torch.device("cpu"))
    shielded = make_env(load_config(ROOT / "configs" / "ppo_shielded_reachavoid.yaml").env, num_envs, 0, torch.device("cpu"))
    actions = torch.rand(steps, num_envs, plain.action_dim) * 2 - 1
    best = env_seconds_per_step({"plain": plain, "shielded": shielded}, actions, repeats)
    plain.close()
    shielded.close()
    return 100 * (best["shielded"] - best["plain"]) / best["plain"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", default="runs/shield")
    p.add_argument("--episodes", type=int, default=1000)
    p.add_argument("--reuse", action="store_true")
    args = p.parse_args()
    run_dir = Path(args.run_dir)
    rows, curves = [], {}
    for name, config in RUNS.items():
        cfg = load_config(ROOT / "configs" / f"{config}.yaml", [f"train.run_dir={run_dir}", "train.progress=false",
                                                                 f"train.name={name}"])
        summary = run_once(run_dir, name, args.reuse, lambda: Runner(cfg).train())
        fresh = evaluate_checkpoint(run_dir / name / "checkpoints" / "last.safetensors", args.episodes, 100, 777, "cpu")
        rows.append({"run": name, "config": f"configs/{config}.yaml", "env_steps": summary["env_steps"],
                     "eval_success": fresh["success_rate"], "train_violation_steps": summary["train_violation_steps"],
                     "eval_violating_episodes": fresh["violating_episodes"], "eval_mean_cost": fresh["mean_cost"],
                     "cost_limit": cfg.algo.cost_limit,
                     "intervention_rate": mean_scalar(run_dir / name, "rollout/shield_intervention"),
                     "infeasible_rate": mean_scalar(run_dir / name, "rollout/shield_infeasible")})
        curves[name] = [(s, r) for s, _, r in summary["eval_history"]]
        print(json.dumps(rows[-1]), flush=True)
    overhead = shield_overhead()
    lines = [f"| run | eval success ({args.episodes} fresh episodes, `last`) | violation steps in training | "
             f"eval episodes with a violation | mean episode cost (eval) | shield intervention rate (training) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        rate = f"{r['intervention_rate']:.3f}" if r["intervention_rate"] is not None else "—"
        limit = f" (limit {r['cost_limit']})" if r["cost_limit"] is not None else ""
        lines.append(f"| {r['run']} | {r['eval_success']:.3f} | {int(r['train_violation_steps']):,} | "
                     f"{r['eval_violating_episodes']} / {args.episodes} | {r['eval_mean_cost']:.3f}{limit} | {rate} |")
    lines += ["", f"Shield overhead at N = 256 (CBF keep-out + speed): {overhead:+.1f}% of the env step."]
    write_results("shield", "Safe RL on ReachAvoid: shields and PPO-Lagrangian", lines,
                  {"rows": rows, "shield_overhead_pct": overhead}, seeds=SEEDS, curves=curves,
                  plot_title="ReachAvoid: eval success with and without safety")


if __name__ == "__main__":
    main()
