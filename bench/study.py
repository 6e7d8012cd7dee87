"""Helpers shared by the benchmark studies: reuse finished runs, find when a learning curve first
reaches a target."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable


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
