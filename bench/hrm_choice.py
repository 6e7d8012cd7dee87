"""The root's choice among calls, on Errands (touch red and blue in either order, then yellow), over training
seeds: PPO's option learner on tasks/errands.rm, whose root chooses which touch to pursue first by SMDP
Q-learning (configs/hrm_errands_options.yaml), and the same learner held to one order, red first
(tasks/errands_fixed.rm), each with the same env-step budget.

Each final policy is evaluated deterministically on 512 episodes: success and episode length (env steps to
finish the errands; shorter is better). The learned choice's actors are evaluated three ways: choosing calls
with the learned chooser, uniformly at random, and by the shorter straight-line tour (a geometric reference,
not a learner); with the share of starts where the learned choice picks the shorter tour's first target.
Writes `docs/results/hrm_choice.{json,md,png}`.

Usage: python bench/hrm_choice.py [--run-dir runs/hrm_choice] [--seeds 0 1 2] [--steps 300000] [--reuse]
About 15 minutes on 2 CPU cores with the defaults.
"""
from __future__ import annotations

import statistics
from pathlib import Path

import torch
from hrm import row
from study import mean_curve, seeds_study_parser, train_runs, write_results

from roborl.checkpoint import Checkpoint
from roborl.evaluate import evaluate, load_for_eval
from roborl.rm import HierarchyEnv
from roborl.sim.wrapper import find_wrapper
from roborl.stats import summarize
from roborl.tasks.errands import shorter_first

LEARNERS = {"learned choice": ("hrm_errands_options", []),
            "one order, red first": ("hrm_errands_options", ["env.rm.machine=tasks/errands_fixed.rm"])}
EPISODES, ENVS = 512, 64


class ShorterTour(torch.nn.Module):
    """Chooses the call of the shorter straight-line tour, read from the state's targets relative to the TCP
    (Errands' last 9 state columns before the option one-hot): a reference, not a learner."""

    def __init__(self, options: int) -> None:
        super().__init__()
        self.options = options
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def choose(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return shorter_first(x[:, -self.options - 9:-self.options].reshape(-1, 3, 3))


def evaluate_choices(checkpoint: Path, choosers: bool) -> dict[str, dict]:
    """Success and mean episode length of a final policy (with each way of choosing calls, where `choosers`),
    and the share of starts where its chooser picks the shorter tour's first target."""
    env, policy = load_for_eval(Checkpoint(checkpoint), ENVS, torch.device("cpu"))
    hierarchy = find_wrapper(env, HierarchyEnv)
    try:
        if not choosers:
            return {"policy": evaluate(policy, env, EPISODES, seed=7)}
        agree = []
        for seed in range(EPISODES // ENVS):
            env.reset(seed=100 + seed)
            first = (hierarchy.calls.starts[hierarchy.chosen] == hierarchy.options.index("touch_b", "0")).long()
            agree.append((first == env.unwrapped.shorter_first()).float())
        out = {"learned": {**evaluate(policy, env, EPISODES, seed=7), "shorter_tour_first": float(torch.cat(agree).mean())}}
        hierarchy.use_chooser(None)
        out["random"] = evaluate(policy, env, EPISODES, seed=7)
        hierarchy.use_chooser(ShorterTour(hierarchy.num_options).eval())
        out["shorter tour"] = evaluate(policy, env, EPISODES, seed=7)
        return out
    finally:
        env.close()


def interval(values: list[float]) -> str:
    s = summarize([values])
    ci = f" [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]" if s["ci95"] else ""
    return f"{s['mean']:.2f}{ci}"


def main() -> None:
    args = seeds_study_parser(__doc__.splitlines()[0], "runs/hrm_choice", 300_000).parse_args()
    run_dir = Path(args.run_dir)
    jobs = [(learner, config, overrides, seed) for learner, (config, overrides) in LEARNERS.items() for seed in args.seeds]
    names = [f"{'choice' if not overrides else 'fixed'}_seed{seed}" for _, _, overrides, seed in jobs]
    done = train_runs([(name, [f"configs/{config}.yaml", *overrides, f"train.seed={seed}",
                               f"train.total_steps={args.steps}", f"train.max_minutes={args.max_minutes:g}",
                               "train.video=false"])
                       for name, (_, config, overrides, seed) in zip(names, jobs)], run_dir, args.reuse, args.jobs)
    rows, evals = [], {}
    for learner, (config, overrides) in LEARNERS.items():
        summaries = [s for (name, *_), s in zip(jobs, done) if name == learner]
        rows.append(row(learner, f"configs/{config}.yaml" + "".join(f" {o}" for o in overrides), args.seeds, summaries))
        evals[learner] = [evaluate_choices(Path(s["run_dir"]) / "checkpoints" / "last.safetensors", not overrides)
                          for s in summaries]
    lines = ["| learner | seeds reaching 80% | median env steps to 80% | env steps per run | minutes per run |",
             "|---|---|---|---|---|"]
    for r in rows:
        steps = f"{int(r['median_env_steps_to_target']):,}" if r["median_env_steps_to_target"] else "not reached"
        lines.append(f"| {r['learner']} (`{r['config']}`) | {r['reached']}/{len(r['seeds'])} | {steps} | "
                     f"{int(statistics.mean(r['env_steps'])):,} | {', '.join(f'{m:.1f}' for m in r['minutes'])} |")
    lines += ["", f"Each final policy, {EPISODES} deterministic episodes (mean over seeds [95% CI]):", "",
              "| policy | calls chosen | success | mean episode length (env steps) | starts choosing the shorter tour |",
              "|---|---|---|---|---|"]
    table = []
    for learner, ways in (("learned choice", ("learned", "random", "shorter tour")), ("one order, red first", ("policy",))):
        for way in ways:
            results = [e[way] for e in evals[learner]]
            agree = [r["shorter_tour_first"] for r in results if "shorter_tour_first" in r]
            shown = {"policy": "red, blue, yellow (the machine's only order)", "learned": "learned chooser (greedy)",
                     "random": "uniformly at random", "shorter tour": "shorter straight-line tour (reference)"}[way]
            lines.append(f"| {learner} | {shown} | {interval([r['success_rate'] for r in results])} | "
                         f"{interval([r['mean_length'] for r in results])} | "
                         f"{interval(agree) if agree else '—'} |")
            table.append({"learner": learner, "calls": way, "results": results})
    lines += ["", f"Each run: {args.steps:,} env steps or {args.max_minutes:g} minutes; one run at a time. Random "
              "and shorter-tour choices use the learned-choice runs' own actors, so they isolate the chooser."]
    write_results("hrm_choice", "The root's choice among calls on Errands (either order, then yellow)", lines,
                  {"rows": rows, "evaluations": table},
                  seeds=f"training seeds {', '.join(map(str, args.seeds))} for every learner (`train.seed`)",
                  curves={r["learner"]: mean_curve(r["eval_history"]) for r in rows},
                  plot_title="Errands: learned choice vs one order (mean over seeds)")


if __name__ == "__main__":
    main()
