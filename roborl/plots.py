"""Learning-curve PNGs (matplotlib, headless), written beside a run's summary."""
from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_curves(path: str | Path, curves: dict[str, list[tuple[float, float]]], title: str,
                xlabel: str = "env steps", ylabel: str = "eval success") -> None:
    """One line per name from (x, y) points; written to a temporary file and renamed."""
    path = Path(path)
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    for name, points in curves.items():
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", markersize=3, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if len(curves) > 1:
        ax.legend()
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)
