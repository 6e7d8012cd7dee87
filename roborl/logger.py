"""TensorBoard scalars and a console progress bar."""
from __future__ import annotations

import types
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm


class Logger:
    def __init__(self, run_dir: Path, total_steps: int, initial_steps: int = 0, progress: bool = True,
                 purge_step: int | None = None) -> None:
        """`purge_step`: events of earlier writers at this step and later are dropped when TensorBoard reads
        the run (a resumed run's, past its checkpoint)."""
        self.writer = SummaryWriter(str(run_dir / "tb"), purge_step=purge_step)
        self.bar = tqdm(total=total_steps, initial=initial_steps, unit="step", unit_scale=True,
                        disable=not progress, dynamic_ncols=True, desc=run_dir.name)

    def scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(f"{prefix}/{key}", value, step)

    def advance(self, steps: int, postfix: dict[str, float]) -> None:
        self.bar.update(steps)
        self.bar.set_postfix({k: f"{v:.3g}" for k, v in postfix.items()}, refresh=False)

    def close(self) -> None:
        self.bar.close()
        self.writer.close()


class SilentLogger:
    """The logger of learners other than rank 0: rank 0 alone writes TensorBoard scalars and the console."""

    bar = types.SimpleNamespace(write=lambda text: None)

    def scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        pass

    def advance(self, steps: int, postfix: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass
