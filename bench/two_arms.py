"""Two arms, one table (TwoArmReach), over training seeds: multi-agent PPO (configs/mappo_two_arms.yaml: per-arm
actors, a centralized critic) with the composed per-arm shields, with no shield, and with the centralized
shield on both arms' actions, each with the same env-step budget; then the shields' compute time per step.

Prints, per setting: the final deterministic eval success over the seeds (mean with a 95% bootstrap CI), the
steps in training where the TCPs came closer than the gap (violations; the target with shields is 0), the
episodes with a violation in a fresh evaluation of each final policy with its shield, and the shields'
intervention rate; then each shield's time per step at N = 256 next to the simulator's step. Writes
`docs/results/two_arms.{json,md,png}`.

Usage: python bench/two_arms.py [--run-dir runs/two_arms] [--seeds 0 1 2] [--steps 600000] [--episodes 500] [--reuse]
About 35 minutes on 2 CPU cores with the defaults.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
from shield import mean_scalar
from study import env_seconds_per_step, mean_curve, seeds_study_parser, train_runs, write_results

from roborl.builder import make_env
from roborl.config import load_config
from roborl.evaluate import evaluate_checkpoint
from roborl.stats import summarize

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/mappo_two_arms.yaml"
SETTINGS = {"composed shields": [], "no shield": ["env.shield.arm_gap=null"],
            "central shield": ["env.shield.arm_gap_shield=central"]}


def shield_cost(num_envs: int = 256, steps: int = 100, repeats: int = 3) -> dict[str, float]:
    """Seconds per env step of the simulator alone and with each shield, and of each shield's call alone (on
    the states a random policy visits), best of `repeats`."""
    torch.set_num_threads(1)
    envs = {name: make_env(load_config(ROOT / CONFIG, overrides).env, num_envs, 0, torch.device("cpu"))
            for name, overrides in SETTINGS.items()}
    actions = torch.rand(steps, num_envs, 8) * 2 - 1
    step = env_seconds_per_step(envs, actions, repeats)
    out = {f"env_step_s[{name}]": s for name, s in step.items()}
    for name in ("composed shields", "central shield"):
        env = envs[name]
        obs, best = env.reset(seed=0), float("inf")
        states = []
        for a in actions[:20]:
            obs, *_ = env.step(a)
            states.append(obs)
        for _ in range(repeats):
            start = time.perf_counter()
            for obs, a in zip(states, actions):
                env.shield(obs, a)
            best = min(best, (time.perf_counter() - start) / len(states))
        out[f"shield_s[{name}]"] = best
    for env in envs.values():
        env.close()
    return out


def main() -> None:
    p = seeds_study_parser(__doc__.splitlines()[0], "runs/two_arms", 600_000)
    p.add_argument("--episodes", type=int, default=500, help="fresh evaluation episodes per final policy")
    args = p.parse_args()
    run_dir = Path(args.run_dir)
    slug = {name: name.split()[0] for name in SETTINGS}
    jobs = [(name, seed) for name in SETTINGS for seed in args.seeds]
    done = train_runs([(f"{slug[name]}_seed{seed}", [CONFIG, *SETTINGS[name], f"train.seed={seed}",
                                                     f"train.total_steps={args.steps}",
                                                     f"train.max_minutes={args.max_minutes:g}", "train.video=false"])
                       for name, seed in jobs], run_dir, args.reuse, args.jobs)
    rows = []
    for name in SETTINGS:
        runs = [(seed, s) for (setting, seed), s in zip(jobs, done) if setting == name]
        fresh = [evaluate_checkpoint(run_dir / f"{slug[name]}_seed{seed}" / "checkpoints" / "last.safetensors",
                                     args.episodes, 100, 777, "cpu") for seed, _ in runs]
        rates = [mean_scalar(run_dir / f"{slug[name]}_seed{seed}", "rollout/shield_intervention") for seed, _ in runs]
        finals = [s["success_rate"] for _, s in runs]
        rows.append({"setting": name, "overrides": SETTINGS[name], "seeds": args.seeds, **summarize([finals]),
                     "final_success": finals, "eval_success": [f["success_rate"] for f in fresh],
                     "train_violation_steps": [s["train_violation_steps"] for _, s in runs],
                     "eval_violating_episodes": [f["violating_episodes"] for f in fresh],
                     "intervention_rate": [r for r in rates if r is not None] or None,
                     "env_steps": [s["env_steps"] for _, s in runs], "minutes": [s["wall_time_s"] / 60 for _, s in runs],
                     "eval_history": [s["eval_history"] for _, s in runs]})
    cost = shield_cost()
    lines = [f"| setting | final success, mean [95% CI] | violation steps in training, per seed | eval episodes with "
             f"a violation (of {args.episodes}), per seed | shield intervention rate | each seed's final success |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        ci = f" [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]" if r["ci95"] else ""
        rate = f"{statistics.mean(r['intervention_rate']):.3f}" if r["intervention_rate"] else "—"
        lines.append(f"| {r['setting']} | {r['mean']:.2f}{ci} | {', '.join(f'{int(v):,}' for v in r['train_violation_steps'])} | "
                     f"{', '.join(str(v) for v in r['eval_violating_episodes'])} | {rate} | "
                     f"{', '.join(f'{x:.2f}' for x in r['final_success'])} |")
    sim_step = cost["env_step_s[no shield]"]
    lines += ["", "| N = 256, per env step | simulator (no shield) | composed shields (two per-arm shields) | central shield |",
              "|---|---|---|---|",
              f"| shield call alone | — | {1e3 * cost['shield_s[composed shields]']:.2f} ms | "
              f"{1e3 * cost['shield_s[central shield]']:.2f} ms |",
              f"| whole env step | {1e3 * sim_step:.2f} ms | {1e3 * cost['env_step_s[composed shields]']:.2f} ms | "
              f"{1e3 * cost['env_step_s[central shield]']:.2f} ms |",
              "", f"Each run: `roborl train {CONFIG}` with the setting's overrides, {args.steps:,} env steps or "
              f"{args.max_minutes:g} minutes; success is the deterministic evaluation's (64 episodes) at the end; a "
              "violation is a step with the TCPs closer than 10 cm; the fresh evaluation runs each final policy with "
              "the shield it trained with."]
    write_results("two_arms", "Two arms: composed shields vs no shield vs a central shield (MAPPO)", lines,
                  {"rows": rows, "cost": cost},
                  seeds=f"training seeds {', '.join(map(str, args.seeds))} for every setting (`train.seed`)",
                  curves={r["setting"]: mean_curve(r["eval_history"]) for r in rows},
                  plot_title="TwoArmReach, MAPPO: eval success (mean over seeds)")


if __name__ == "__main__":
    main()
