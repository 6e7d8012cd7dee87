"""TensorBoard scalars and a console progress bar."""
from __future__ import annotations

import time
import types
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm


class Logger:
    def __init__(self, run_dir: Path, total_steps: int, initial_steps: int = 0, progress: bool = True,
                 purge_step: int | None = None) -> None:
        """`purge_step`: events of earlier writers at this step and later are dropped when TensorBoard reads
        the run (a resumed run's, past its checkpoint)."""
        after_existing_event_files(run_dir / "tb")
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


def after_existing_event_files(tb: Path) -> None:
    """Wait, if need be, until a new event file's name sorts after every event file in `tb`.

    TensorBoard reads a run's event files in name order, and a name starts with the second its writer was made,
    then the host and the process id. A resumed writer made in the same second as its killed predecessor's could
    be read first; the predecessor's purge step would then drop the resumed run's points. A file stamped more
    than two seconds ahead (a run copied from a machine with another clock) is left as it is."""
    stamps = [p.name.split(".")[3] for p in tb.glob("events.out.tfevents.*")]
    wait = max((int(s) for s in stamps if s.isdigit()), default=0) + 1 - time.time()
    if 0 < wait <= 3:
        time.sleep(wait)


class SilentLogger:
    """The logger of learners other than rank 0: rank 0 alone writes TensorBoard scalars and the console."""

    bar = types.SimpleNamespace(write=lambda text: None)

    def scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        pass

    def advance(self, steps: int, postfix: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass
