"""Hierarchies of reward machines on Tour (touch red, blue, red, yellow, red, blue), over training seeds: PPO
learning the hierarchy of tasks/tour.rm with one option per touch machine, each machine's option with its own
actor (configs/hrm_tour_options.yaml) or all options sharing one (`policy.actors=joint`), the same option learner
on the hierarchy split from the task's LTLf formula (configs/hrm_tour_ltlf.yaml), PPO on its flat machine
with shaping (configs/hrm_tour_flat.yaml) and PPO on the task's sparse reward (configs/ppo_tour_sparse.yaml),
each with the same env-step budget.

Prints, per learner, the final deterministic eval success over the seeds (mean with a 95% bootstrap CI, IQM
from 5 seeds), the seeds that reach 80%, the median env steps and minutes to 80%, and each seed's result.
Writes `docs/results/hrm.{json,md,png}`.

Usage: python bench/hrm.py [--run-dir runs/hrm] [--seeds 0 1 2] [--steps 1200000] [--jobs 1] [--reuse]
About an hour and a quarter on 2 CPU cores with the defaults (fifteen runs of 3 to 10 minutes, one after the other).
"""
from __future__ import annotations

import re
import statistics
from pathlib import Path

from study import first_reaching, mean_curve, median_to, seeds_study_parser, train_runs, write_results

from roborl.stats import summarize

ROOT = Path(__file__).resolve().parents[1]
LEARNERS = {"options (HRM), one actor per machine": ("hrm_tour_options", []),
            "options (HRM), one shared actor": ("hrm_tour_options", ["policy.actors=joint"]),
            "options (HRM) split from the LTLf formula": ("hrm_tour_ltlf", []),
            "flat machine": ("hrm_tour_flat", []), "sparse reward": ("ppo_tour_sparse", [])}
TARGET = 0.8


def row(learner: str, config: str, seeds: list[int], summaries: list[dict]) -> dict:
    """One learner's results over its seeds; `config` as the command line gives it."""
    finals = [s["success_rate"] for s in summaries]
    reached = [first_reaching(s["eval_history"], TARGET) for s in summaries]
    seconds = median_to(reached, 1)
    return {"learner": learner, "config": config, "seeds": seeds, **summarize([finals]),
            "final_success": finals, "reached": sum(r is not None for r in reached),
            "median_env_steps_to_target": median_to(reached, 0),
            "median_minutes_to_target": None if seconds is None else seconds / 60,
            "env_steps": [s["env_steps"] for s in summaries], "minutes": [s["wall_time_s"] / 60 for s in summaries],
            "eval_history": [s["eval_history"] for s in summaries]}


def run_name_part(override: str) -> str:
    """An override's value as part of a run's name (`env.rm.machine=tasks/grand_tour.rm`: tasks_grand_tour_rm)."""
    return re.sub(r"\W+", "_", override.split("=", 1)[1])


def study(learners: dict[str, tuple[str, list[str]]], args, name: str, title: str, plot_title: str,
          budget: str) -> None:
    """Trains every learner (its config and overrides) on every seed, then prints and writes the table."""
    jobs = [(learner, config, overrides, seed) for learner, (config, overrides) in learners.items() for seed in args.seeds]
    steps = [f"train.total_steps={args.steps}"] if args.steps else []
    done = train_runs([(f"{config}{''.join('_' + run_name_part(o) for o in overrides)}_seed{seed}",
                        [f"configs/{config}.yaml", *overrides, f"train.seed={seed}", *steps,
                         f"train.max_minutes={args.max_minutes:g}", "train.video=false"])
                       for _, config, overrides, seed in jobs], Path(args.run_dir), args.reuse, args.jobs)
    rows = []
    for learner, (config, overrides) in learners.items():
        summaries = [s for (name, *_), s in zip(jobs, done) if name == learner]
        shown = f"configs/{config}.yaml" + "".join(f" {o}" for o in overrides)
        rows.append(row(learner, shown, args.seeds, summaries))
    lines = [f"| learner | final success, mean [95% CI] | IQM | seeds reaching {TARGET:.0%} | median env steps to "
             f"{TARGET:.0%} | median minutes to {TARGET:.0%} | env steps per run | minutes per run | each seed's final success |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ci = f" [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]" if r["ci95"] else ""
        iqm = f"{r['iqm']:.2f}" if r["iqm"] is not None else "— (from 5 seeds)"
        steps = f"{int(r['median_env_steps_to_target']):,}" if r["median_env_steps_to_target"] else "not reached"
        minutes = f"{r['median_minutes_to_target']:.1f}" if r["median_minutes_to_target"] else "not reached"
        lines.append(f"| {r['learner']} (`{r['config']}`) | {r['mean']:.2f}{ci} | {iqm} | {r['reached']}/{len(r['seeds'])} "
                     f"| {steps} | {minutes} | {int(statistics.mean(r['env_steps'])):,} | "
                     f"{', '.join(f'{m:.1f}' for m in r['minutes'])} | "
                     f"{', '.join(f'{x:.2f}' for x in r['final_success'])} |")
    lines += ["", f"Each run: {budget} or {args.max_minutes:g} minutes, whichever comes first, "
              f"{args.jobs} run(s) side by side; success is the deterministic evaluation's (64 episodes) at the end; "
              "the medians count a seed that never reached the target as never. Minutes are wall time on a machine "
              "that may have had other work: compare env steps."]
    write_results(name, title, lines, {"rows": rows},
                  seeds=f"training seeds {', '.join(map(str, args.seeds))} for every learner (`train.seed`)",
                  curves={r["learner"]: mean_curve(r["eval_history"]) for r in rows}, plot_title=plot_title)


def main() -> None:
    args = seeds_study_parser(__doc__.splitlines()[0], "runs/hrm", 1_200_000).parse_args()
    study(LEARNERS, args, "hrm",
          "Hierarchies of reward machines on Tour (six touches, one repeated)",
          "Tour: option learner vs flat machine vs sparse reward (mean over seeds)", f"{args.steps:,} env steps")


if __name__ == "__main__":
    main()
