"""Learning-curve PNGs (matplotlib, headless), written beside a run's summary. pyplot is imported on the first
plot, not with the runner: it costs every `roborl` process about half a second to start."""
from __future__ import annotations

import textwrap
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from roborl.files import atomic_write

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def pyplot() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(path: str | Path, curves: dict[str, list[tuple[float, float]]], title: str,
                xlabel: str = "env steps", ylabel: str = "eval success") -> None:
    """One line per name from (x, y) points; written to a temporary file and renamed."""
    fig, ax = pyplot().subplots(figsize=(6, 3.6), dpi=100)
    for name, points in curves.items():
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", markersize=3, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(textwrap.fill(title, 60), fontsize=10)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if len(curves) > 1:
        ax.legend()
    fig.tight_layout()
    save(fig, path)


def plot_bars(path: str | Path, values: dict[str, float], title: str, ylabel: str) -> None:
    """One horizontal bar per name; written to a temporary file and renamed."""
    fig, ax = pyplot().subplots(figsize=(7, 0.5 + 0.45 * len(values)), dpi=100)
    names = list(values)[::-1]
    ax.barh(names, [values[n] for n in names], color="tab:blue")
    ax.set_xlabel(ylabel)
    ax.set_title(textwrap.fill(title, 70), fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    save(fig, path)


def save(fig: Figure, path: str | Path) -> None:
    """Writes the figure to a temporary file and renames it, so a reader never sees half a PNG."""
    path = Path(path)
    with atomic_write(path, suffix=".png") as tmp:
        fig.savefig(tmp)
    pyplot().close(fig)
