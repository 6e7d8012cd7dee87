"""Statistics for results over runs, as rliable reports them (Agarwal et al., 2021, "Deep RL at the Edge of
the Statistical Precipice"): the mean and the interquartile mean (IQM) with 95% percentile-bootstrap
confidence intervals. Several tasks are resampled as strata: each task's runs are drawn with replacement
among themselves, so every bootstrap sample keeps every task and its number of runs.

numpy only, and a fixed generator seed, so that the same scores always give the same intervals.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

MIN_RUNS_CI = 2  # a confidence interval over fewer runs says nothing
MIN_RUNS_IQM = 5  # the IQM of fewer runs trims (almost) nothing: rliable reports it from 5 runs on
REPS = 10_000
CONFIDENCE = 0.95
RNG_SEED = 0

Statistic = Callable[[list[np.ndarray]], np.ndarray]


def iqm(x: np.ndarray | Sequence[float], axis: int = -1) -> np.ndarray | float:
    """The mean of the middle 50%: `int(0.25 n)` values cut from each end, as `scipy.stats.trim_mean(x, 0.25)`."""
    x = np.sort(np.asarray(x, dtype=float), axis=axis)
    n = x.shape[axis]
    cut = int(0.25 * n)
    return np.take(x, np.arange(cut, n - cut), axis=axis).mean(axis=axis)


def mean_of_tasks(strata: list[np.ndarray]) -> np.ndarray:
    """Mean over tasks of each task's mean over runs (strata: tasks, each B×runs)."""
    return np.mean([s.mean(axis=-1) for s in strata], axis=0)


def iqm_of_runs(strata: list[np.ndarray]) -> np.ndarray:
    """IQM of all runs of all tasks together, as rliable aggregates."""
    return iqm(np.concatenate(strata, axis=-1), axis=-1)


def point_and_ci(strata: Sequence[Sequence[float]], statistic: Statistic, reps: int = REPS,
                 confidence: float = CONFIDENCE, seed: int = RNG_SEED) -> tuple[float, list[float]]:
    """`statistic` of the scores and its percentile-bootstrap interval, stratified by task."""
    arrays = [np.asarray(s, dtype=float) for s in strata]
    point = float(statistic([a[None] for a in arrays])[0])
    rng = np.random.default_rng(seed)
    samples = [a[rng.integers(0, len(a), size=(reps, len(a)))] for a in arrays]
    tail = 100 * (1 - confidence) / 2
    lo, hi = np.percentile(statistic(samples), [tail, 100 - tail])
    return point, [float(lo), float(hi)]


def summarize(strata: Sequence[Sequence[float]], reps: int = REPS, seed: int = RNG_SEED) -> dict:
    """{"mean", "ci95", "iqm", "iqm_ci95"} over runs (one list of runs per task); an interval is None with
    fewer than MIN_RUNS_CI runs in a task, the IQM and its interval with fewer than MIN_RUNS_IQM."""
    runs = min(len(s) for s in strata)
    mean, ci = point_and_ci(strata, mean_of_tasks, reps, seed=seed)
    out: dict = {"mean": mean, "ci95": ci if runs >= MIN_RUNS_CI else None, "iqm": None, "iqm_ci95": None}
    if runs >= MIN_RUNS_IQM:
        out["iqm"], out["iqm_ci95"] = point_and_ci(strata, iqm_of_runs, reps, seed=seed)
    return out
