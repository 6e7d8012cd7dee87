"""The results of a suite evaluation as DIR/eval.json (schema below) and DIR/eval.md (one table row a task).

Schema "roborl.eval/1" (numbers are floats unless said; null where a value cannot be computed):

    {"schema": "roborl.eval/1",
     "tasks": {TASK: {
         "per_seed": [{"checkpoint": str, "seed": int, "success": mean success at the end of the episode,
                       "success_once": mean success at any step, "return", "length", "episodes": int}, ...],
         "unit": "checkpoint" | "eval_seed",   # what one run is (below)
         "runs": int, "episodes": int,         # runs, and episodes over all of them
         "success" | "success_once" | "return" | "episode_length":
             {"mean", "ci95": [lo, hi] | null, "iqm": float | null, "iqm_ci95": [lo, hi] | null},
         "videos": [path relative to DIR, ...]}},
     "aggregate": {"tasks": int, "success": {...as above...}, "success_once": {...}},
     "config": {"episodes_per_run", "eval_seeds": [int], "envs", "device", "video", "suite",
                "bootstrap": {"method", "stratified_by", "reps", "confidence", "rng_seed"},
                "min_runs": {"ci95", "iqm"}}}

A run is one checkpoint (its evaluation seeds averaged) where a task has several checkpoints: training seeds
are the independent repetitions, and evaluation seeds of one checkpoint only add episodes. With a single
checkpoint a run is one evaluation seed, and the intervals then say how much the evaluation alone varies.
The aggregate is the mean over tasks (and the IQM over all runs of all tasks), bootstrapped by task strata.
"""
from __future__ import annotations

import math
from pathlib import Path

from roborl import stats
from roborl.files import atomic_write
from roborl.run_dir import write_json

SCHEMA = "roborl.eval/1"
METRICS = {"success": "success", "success_once": "success_once", "return": "return", "episode_length": "length"}


def run_scores(per_seed: list[dict]) -> tuple[str, dict[str, list[float]]]:
    """The unit of a run and each metric's value per run."""
    by_ckpt: dict[str, list[dict]] = {}
    for row in per_seed:
        by_ckpt.setdefault(row["checkpoint"], []).append(row)
    if len(by_ckpt) > 1:
        unit, groups = "checkpoint", list(by_ckpt.values())
    else:
        unit, groups = "eval_seed", [[row] for row in per_seed]
    scores = {name: [sum(r[key] for r in g) / len(g) for g in groups] for name, key in METRICS.items()}
    return unit, scores


def build_report(results: dict[str, dict], config: dict) -> dict:
    tasks: dict[str, dict] = {}
    runs: dict[str, dict[str, list[float]]] = {}
    for task, r in results.items():
        unit, runs[task] = run_scores(r["per_seed"])
        tasks[task] = {"per_seed": r["per_seed"], "unit": unit, "runs": len(runs[task]["success"]),
                       "episodes": sum(row["episodes"] for row in r["per_seed"]),
                       **{name: stats.summarize([values]) for name, values in runs[task].items()},
                       "videos": r["videos"]}
    aggregate = {"tasks": len(tasks), **{name: stats.summarize([runs[t][name] for t in runs])
                                         for name in ("success", "success_once")}}
    config = {**config, "bootstrap": {"method": "percentile", "stratified_by": "task", "reps": stats.REPS,
                                      "confidence": stats.CONFIDENCE, "rng_seed": stats.RNG_SEED},
              "min_runs": {"ci95": stats.MIN_RUNS_CI, "iqm": stats.MIN_RUNS_IQM}}
    return _finite({"schema": SCHEMA, "tasks": tasks, "aggregate": aggregate, "config": config})


def _finite(value: object) -> object:
    """NaN and infinities (e.g. the return of a run where no episode ended) as null: JSON has no NaN."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _cell(summary: dict, key: str, digits: int) -> str:
    value, ci = summary[key], summary["ci95" if key == "mean" else "iqm_ci95"]
    if value is None:
        return "–"
    text = f"{value:.{digits}f}"
    return f"{text} [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci else text


def markdown(report: dict) -> str:
    cfg = report["config"]
    seeds = cfg["eval_seeds"]
    lines = [f"# roborl eval: {len(report['tasks'])} task(s)", "",
             f"{cfg['episodes_per_run']} episodes per checkpoint and evaluation seed; evaluation seeds "
             f"{seeds[0]}..{seeds[-1]}; device {cfg['device']}.", "",
             "| task | runs | episodes | success | success IQM | episode length | return |",
             "|---|---:|---:|---|---|---|---|"]
    for task, t in report["tasks"].items():
        lines.append(f"| {task} | {t['runs']} ({t['unit'].replace('_', ' ')}s) | {t['episodes']} "
                     f"| {_cell(t['success'], 'mean', 3)} | {_cell(t['success'], 'iqm', 3)} "
                     f"| {_cell(t['episode_length'], 'mean', 1)} | {_cell(t['return'], 'mean', 2)} |")
    if len(report["tasks"]) > 1:
        a = report["aggregate"]
        lines.append(f"| **all tasks** | | | {_cell(a['success'], 'mean', 3)} | {_cell(a['success'], 'iqm', 3)} | | |")
    b = cfg["bootstrap"]
    lines += ["", f"Success at the end of the episode. Mean [95% CI]: percentile bootstrap over runs ({b['reps']} "
              f"resamples, rng seed {b['rng_seed']}; stratified by task for all tasks). A run is a checkpoint (its "
              "evaluation seeds averaged) where a task has several, else an evaluation seed. IQM: mean of the "
              f"middle 50% of runs (rliable), from {cfg['min_runs']['iqm']} runs on; no interval under "
              f"{cfg['min_runs']['ci95']} runs."]
    videos = [(task, v) for task, t in report["tasks"].items() for v in t["videos"]]
    if videos:
        lines += ["", "Videos (first episodes): " + ", ".join(f"[{task}]({v})" for task, v in videos)]
    return "\n".join(lines) + "\n"


def write_report(report: dict, out_dir: Path) -> None:
    write_json(out_dir / "eval.json", report)
    md = out_dir / "eval.md"
    with atomic_write(md) as tmp:
        tmp.write_text(markdown(report))
