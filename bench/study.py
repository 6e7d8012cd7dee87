"""Helpers shared by the benchmark studies: reuse finished runs, find when a learning curve first
reaches a target, write a study's table, data and learning curves."""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from roborl.plots import plot_curves


def run_once(run_dir: Path, name: str, reuse: bool, start: Callable[[], dict]) -> dict:
    """The run's summary: read from `run_dir/name/summary.json` when `reuse` and it exists, else `start()`."""
    summary = run_dir / name / "summary.json"
    if reuse and summary.is_file():
        return json.loads(summary.read_text())
    return start()


def first_reaching(history: list[list[float]], target: float) -> tuple[float, float] | None:
    """(env steps, wall seconds) of the first eval in `[[steps, wall, success], ...]` with success >= target."""
    for steps, wall, success in history:
        if success >= target:
            return steps, wall
    return None


def write_study(run_dir: Path, name: str, lines: list[str], data: dict, curves: dict, title: str) -> None:
    """Prints the table and writes `name.md` (the table), `name.json` (data) and `name.png` (curves)."""
    table = "\n".join(lines)
    print(table)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / f"{name}.md").write_text(table + "\n")
    (run_dir / f"{name}.json").write_text(json.dumps(data, indent=2))
    plot_curves(run_dir / f"{name}.png", curves, title)


def env_seconds_per_step(envs: dict, actions: torch.Tensor, repeats: int = 3) -> dict[str, float]:
    """Seconds per `step` of each env on the same action sequence (T×N×A), best of `repeats`, the envs
    interleaved so that a busy moment hits them alike."""
    best = {key: float("inf") for key in envs}
    for _ in range(repeats):
        for key, env in envs.items():
            env.reset(seed=0)
            start = time.perf_counter()
            for a in actions:
                env.step(a)
            best[key] = min(best[key], (time.perf_counter() - start) / len(actions))
    return best
