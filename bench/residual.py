"""Residual RL on PickPlace, all in one run: an imperfect base (the scripted expert with a
miscalibrated x-y offset and noise), residual PPO and residual SAC on top of it, and PPO from scratch.

Prints one row per run: base success, best eval, env steps and minutes to the first eval >= 90% and
>= 95%, and the ratio of env steps to 90% against PPO from scratch; then 200-episode evaluations on
fresh initial states of the base and of each run's best checkpoint. Writes `docs/results/residual.{md,json,png}`
(the png: the learning curves).

Usage: python bench/residual.py [--runs residual_ppo residual_sac scratch_ppo] [--run-dir runs/residual]
       [--max-minutes 30] [--reuse]   (--reuse keeps finished runs of an earlier call)
About 2 (residual PPO), 10 (residual SAC) and 10-15 (PPO from scratch) minutes on 2 CPU cores.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from study import first_reaching, run_once, write_results

from roborl.builder import make_policy, make_run_env
from roborl.config import load_config
from roborl.evaluate import evaluate, evaluate_checkpoint
from roborl.runner import Runner

ROOT = Path(__file__).resolve().parents[1]
SEEDS = "1 training seed per run (`train.seed` of each config)"
CONFIGS = {"residual_ppo": "residual_ppo_pickplace", "residual_sac": "residual_sac_pickplace",
           "scratch_ppo": "ppo_pickplace"}
FRESH_SEED, FRESH_EPISODES = 777, 200


def base_success(episodes: int) -> float:
    """The base alone: a residual policy at initialization acts exactly as its base."""
    cfg = load_config(ROOT / "configs" / "residual_ppo_pickplace.yaml")
    env = make_run_env(cfg, 50, 0, torch.device("cpu"))
    policy = make_policy(cfg.policy, env, 1, cfg.residual).eval()
    result = evaluate(policy, env, episodes, seed=FRESH_SEED)
    env.close()
    return result["success_rate"]


def fmt_steps(reached: tuple[float, float] | None) -> str:
    return f"{int(reached[0]):,} ({reached[1] / 60:.1f} min)" if reached else "not reached"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--run-dir", default="runs/residual")
    p.add_argument("--max-minutes", type=float, default=30.0)
    p.add_argument("--reuse", action="store_true")
    args = p.parse_args()
    run_dir = Path(args.run_dir)
    common = [f"train.run_dir={run_dir}", "train.progress=false", f"train.max_minutes={args.max_minutes}"]
    summaries, curves = {}, {}
    for name in args.runs:
        extra = ["train.stop_at_success=0.9"] if name == "scratch_ppo" else []  # from scratch: to 90% is enough
        cfg = load_config(ROOT / "configs" / f"{CONFIGS[name]}.yaml", [*common, f"train.name={name}", *extra])
        summaries[name] = run_once(run_dir, name, args.reuse, lambda: Runner(cfg).train())
        curves[name] = [(s, r) for s, _, r in summaries[name]["eval_history"]]
        print(name, json.dumps({k: summaries[name][k] for k in ("best_success_rate", "env_steps", "wall_time_s")}),
              flush=True)
    scratch = first_reaching(summaries["scratch_ppo"]["eval_history"], 0.9) if "scratch_ppo" in summaries else None
    scratch_steps = summaries["scratch_ppo"]["env_steps"] if "scratch_ppo" in summaries else None
    rows = []
    for name, s in summaries.items():
        hist = s["eval_history"]
        to90, to95 = first_reaching(hist, 0.9), first_reaching(hist, 0.95)
        fresh = evaluate_checkpoint(run_dir / name / "checkpoints" / "best.safetensors", FRESH_EPISODES, 50,
                                    FRESH_SEED, "cpu")["success_rate"]
        start = hist[0][2] if hist[0][0] == 0 else None
        rows.append({"run": name, "config": f"configs/{CONFIGS[name]}.yaml", "start_success": start,
                     "best_success": s["best_success_rate"], "fresh_success": fresh,
                     "env_steps_to_90": to90[0] if to90 else None, "minutes_to_90": to90[1] / 60 if to90 else None,
                     "env_steps_to_95": to95[0] if to95 else None, "minutes_to_95": to95[1] / 60 if to95 else None,
                     "steps_ratio_to_90_vs_scratch": to90[0] / scratch[0] if to90 and scratch else None,
                     # scratch PPO never reached 90%: its whole run bounds the ratio from above
                     "steps_ratio_upper_bound": to90[0] / scratch_steps if to90 and not scratch and scratch_steps else None,
                     "_to90": to90, "_to95": to95})
    base = base_success(FRESH_EPISODES)
    lines = [f"Base alone (scripted expert, x-y offset + noise), {FRESH_EPISODES} fresh episodes: {base:.3f}", "",
             "| run | eval at step 0 | best eval | env steps to 90% | env steps to 95% | steps to 90% ÷ scratch PPO's | "
             f"{FRESH_EPISODES} fresh episodes, best checkpoint |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        start = f"{r['start_success']:.2f}" if r["start_success"] is not None else "—"
        ratio = (f"{r['steps_ratio_to_90_vs_scratch']:.3f}" if r["steps_ratio_to_90_vs_scratch"] is not None else
                 f"< {r['steps_ratio_upper_bound']:.3f}" if r["steps_ratio_upper_bound"] is not None else "—")
        lines.append(f"| {r['run']} | {start} | {r['best_success']:.2f} | {fmt_steps(r.pop('_to90'))} | "
                     f"{fmt_steps(r.pop('_to95'))} | {ratio} | {r['fresh_success']:.3f} |")
    write_results("residual", "Residual RL on PickPlace", lines, {"base_success": base, "rows": rows}, seeds=SEEDS,
                  curves=curves, plot_title="PickPlace: residual RL on an imperfect base vs PPO from scratch")


if __name__ == "__main__":
    main()
