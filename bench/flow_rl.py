"""Generative-policy RL on Push, all in one run: scripted demos -> weak BC policies (flow and diffusion)
-> PPO fine-tuning by DPPO, flow-noise, flow-SDE and FPO, each to >= 90% deterministic eval success.

Prints one row per mode: BC success, RL success, env steps and minutes to the first eval >= 90%, and
the sampling cost of the flow policy (actions/s at N=64 for 1, 5 and 10 Euler steps). Writes
`docs/results/flow_rl.{md,json,png}` (the png: all learning curves).

Usage: python bench/flow_rl.py [--modes dppo flow_noise flow_sde fpo] [--run-dir runs/flow_rl]
       [--max-minutes 20] [--reuse]   (--reuse keeps finished BC / RL runs of an earlier call)
About 2-5 minutes per mode (each stops at 95%) and 1-2 per BC policy on 2 CPU cores, 20 at most per mode.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from study import first_reaching, run_once, write_results

from roborl.builder import make_env, make_policy
from roborl.config import load_config
from roborl.demos import record_demos
from roborl.demos_hdf5 import demos_file
from roborl.runner import Runner
from roborl.train import train_bc

ROOT = Path(__file__).resolve().parents[1]
SEEDS = "1 training seed per run (`train.seed` of each config)"
BC_CONFIG = {"dppo": "bc_diffusion_push", "flow_noise": "bc_flow_push", "flow_sde": "bc_flow_push", "fpo": "bc_flow_push"}
TARGET = 0.9


@torch.no_grad()
def sampling_rate(steps: int, num_envs: int = 64, seconds: float = 3.0) -> float:
    """Deterministic actions per second of a flow policy with `steps` Euler steps, batch `num_envs`."""
    cfg = load_config(ROOT / "configs" / "bc_flow_push.yaml", [f"policy.steps={steps}"])
    env = make_env(cfg.env, 1, 0, torch.device("cpu"))
    policy = make_policy(cfg.policy, env, cfg.env.action_chunk).eval()
    obs = {"state": torch.randn(num_envs, env.observation_space["state"].shape[0])}
    env.close()
    policy.act(obs, deterministic=True)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        policy.act(obs, deterministic=True)
        n += num_envs
    return n / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", nargs="+", default=["dppo", "flow_noise", "flow_sde", "fpo"])
    p.add_argument("--run-dir", default="runs/flow_rl")
    p.add_argument("--demos", default="demos/push")
    p.add_argument("--max-minutes", type=float, default=20.0)
    p.add_argument("--reuse", action="store_true")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    run_dir = Path(args.run_dir)
    if not demos_file(args.demos).is_file():
        print(record_demos("mujoco/Push", 200, args.demos, progress=False))
    base = [f"train.run_dir={run_dir}", "train.progress=false"] + ([f"train.threads={args.threads}"] if args.threads else [])
    bc: dict[str, dict] = {}
    for name in sorted({BC_CONFIG[m] for m in args.modes}):
        cfg = load_config(ROOT / "configs" / f"{name}.yaml", [*base, f"train.name={name}", f"bc.demos={args.demos}"])
        bc[name] = run_once(run_dir, name, args.reuse, lambda: train_bc(cfg))
        print(f"BC {name}: success {bc[name]['success_rate']:.3f} (best {bc[name]['best_success_rate']:.3f}) "
              f"from {bc[name]['demo_episodes']} demos, {bc[name]['wall_time_s'] / 60:.1f} min", flush=True)
    rows, curves = [], {}
    for mode in args.modes:
        init = run_dir / BC_CONFIG[mode] / "checkpoints" / "best.safetensors"
        cfg = load_config(ROOT / "configs" / f"{mode}_push.yaml",
                          [*base, f"train.name={mode}", f"policy.init={init}", f"train.max_minutes={args.max_minutes}"])
        summary = run_once(run_dir, mode, args.reuse, lambda: Runner(cfg).train())
        hist = summary["eval_history"]
        reached = first_reaching(hist, TARGET)
        rows.append({"mode": mode, "bc_success": hist[0][2], "rl_success": max(h[2] for h in hist),
                     "final_success": hist[-1][2], "env_steps_to_90": reached[0] if reached else None,
                     "minutes_to_90": round(reached[1] / 60, 2) if reached else None,
                     "env_steps": summary["env_steps"], "minutes": round(summary["wall_time_s"] / 60, 2)})
        curves[mode] = [(s, r) for s, _, r in hist]
        print(json.dumps(rows[-1]), flush=True)
    rates = {steps: sampling_rate(steps) for steps in (1, 5, 10)}
    lines = ["| mode | BC success | RL success (best eval) | env steps to 90% | minutes to 90% | run: env steps, minutes |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        to90 = f"{r['env_steps_to_90']:,}" if r["env_steps_to_90"] is not None else "not reached"
        mins = f"{r['minutes_to_90']:.1f}" if r["minutes_to_90"] is not None else "—"
        lines.append(f"| {r['mode']} | {r['bc_success']:.2f} | {r['rl_success']:.2f} | {to90} | {mins} | "
                     f"{r['env_steps']:,}, {r['minutes']:.1f} |")
    lines += ["", "| flow sampling, N=64 (chunks of H=8 actions) | 1 step | 5 steps | 10 steps |", "|---|---|---|---|",
              f"| chunks/s | {rates[1]:,.0f} | {rates[5]:,.0f} | {rates[10]:,.0f} |",
              f"| relative to 1 step | 1.00 | {rates[5] / rates[1]:.2f} | {rates[10] / rates[1]:.2f} |"]
    write_results("flow_rl", "Diffusion and flow RL on Push: BC, then RL fine-tuning", lines,
                  {"rows": rows, "sampling_actions_per_s": rates, "bc": bc}, seeds=SEEDS, curves=curves,
                  plot_title="RL fine-tuning of BC policies on Push (deterministic eval)")


if __name__ == "__main__":
    main()
