"""Temporal ensembling of action chunks (ACT, Zhao et al. 2023): when a chunk is predicted every step,
each step has several predictions of its action, one from each chunk still covering it; the action
executed is their weighted mean with w_i = exp(−m·i), i = 0 the oldest prediction."""
from __future__ import annotations

import numpy as np


class TemporalEnsembler:
    def __init__(self, weight: float = 0.01) -> None:
        self.weight = weight
        self.chunks: list[tuple[int, np.ndarray]] = []  # (control step of the chunk's first action, K×A)

    def reset(self) -> None:
        self.chunks.clear()

    def add(self, step: int, chunk: np.ndarray) -> None:
        self.chunks.append((step, np.asarray(chunk, dtype=np.float64)))

    def action(self, step: int) -> np.ndarray | None:
        """The ensembled action for control step `step`, or None when no chunk covers it."""
        self.chunks = [(s, c) for s, c in self.chunks if s + len(c) > step]
        preds = [c[step - s] for s, c in self.chunks if s <= step]
        if not preds:
            return None
        w = np.exp(-self.weight * np.arange(len(preds)))
        return (w[:, None] * np.stack(preds)).sum(0) / w.sum()
