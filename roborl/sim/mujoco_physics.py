"""MuJoCo physics on CPU threads: N worlds of one model stepped by MuJoCo's own `mujoco.batch.Batch`.

It has the contract of sim/warp_physics.py: the caller owns the N×nstate float64 full-physics state
rows (`mujoco.mj_getState` layout) and hands them in with N×substeps×nu controls; `step` advances
every world `substeps` physics steps and writes the new state back into those rows.

Why `Batch` and not `mujoco.rollout`: a Batch keeps each world's whole integration state between calls,
the constraint solver's warm start included, so N worlds stepped control step by control step are
bit-identical to N MjData stepped by `mj_step` (a rollout call starts every world's solver cold). Its
thread pool runs on the caller's thread too, and it writes back only the final state rather than every
substep's. On the Push scene its physics is 1.26x, 1.12x and 1.03x as fast as `mujoco.rollout`'s at N = 16, 64
and 256 (bench/throughput.py, docs/results/throughput.md).
"""
from __future__ import annotations

from collections.abc import Sequence

import mujoco
import numpy as np
from mujoco import batch

FULL = mujoco.mjtState.mjSTATE_FULLPHYSICS
WARMSTART = mujoco.mjtState.mjSTATE_WARMSTART
# the warnings with which MuJoCo resets a diverging world to the model's defaults and goes on stepping
DIVERGED = [int(w) for w in (mujoco.mjtWarning.mjWARN_BADQPOS, mujoco.mjtWarning.mjWARN_BADQVEL,
                             mujoco.mjtWarning.mjWARN_BADQACC)]


def _columns(model: mujoco.MjModel, parts: int) -> np.ndarray:
    """The columns of a Batch's state row (every component, in mjtState order) that hold `parts`."""
    columns, offset = [], 0
    for k in range(int(mujoco.mjtState.mjNSTATE)):
        size = mujoco.mj_stateSize(model, 1 << k)
        if parts & (1 << k):
            columns.extend(range(offset, offset + size))
        offset += size
    return np.array(columns, dtype=np.int64)


class MujocoPhysics:
    """Steps `num_worlds` copies of `model` (or one model per world, `set_models`) on `nthread` threads,
    the caller's included."""

    def __init__(self, model: mujoco.MjModel, num_worlds: int, substeps: int, nthread: int) -> None:
        self.substeps = substeps
        self._batch = batch.Batch(model, num_worlds, nthread=nthread)
        self._rows = self._batch.state
        full = _columns(model, FULL)
        # the full-physics state is a prefix of the integration state unless the model has state
        # after the solver's warm start (mocap bodies, user data, plugins): a slice copies fastest
        self._full: slice | np.ndarray = slice(0, len(full)) if np.array_equal(full, np.arange(len(full))) else full
        self._warmstart = _columns(model, WARMSTART)
        self._ctrl = self._batch.bind("ctrl")
        self._failed = np.zeros(num_worlds, dtype=bool)

    @property
    def models(self) -> tuple[mujoco.MjModel, ...] | None:
        """The model of each world (`set_models`), or None while all step the model they were made with."""
        return self._batch.models

    def set_models(self, models: Sequence[mujoco.MjModel]) -> None:
        """Step world i with models[i] (domain randomization); call again after editing any of them."""
        self._batch.set_models(models)

    def restart(self, ids: np.ndarray) -> None:
        """Worlds `ids` start afresh (a reset): their solver starts cold, as a new MjData's does."""
        self._rows[np.ix_(ids, self._warmstart)] = 0.0

    def step(self, state: np.ndarray, ctrl: np.ndarray) -> np.ndarray:
        """Advance the worlds of `state` (N×nstate, float64, updated in place) by `substeps` physics steps
        under `ctrl` (N×substeps×nu). Returns the worlds that diverged (MuJoCo reset them to the model's
        defaults on the way) or that MuJoCo raised an error in (they kept their state), N bool."""
        self._rows[:, self._full] = state
        warnings = self._batch.warning[:, DIVERGED, 1].sum(1)
        self._failed[:] = False
        if (ctrl == ctrl[:, :1]).all():  # one control for the whole step: one call
            self._ctrl[:] = ctrl[:, 0]
            self._run(self.substeps)
        else:  # controls that change within the step (randomized latency): a call per substep
            for k in range(self.substeps):
                self._ctrl[:] = ctrl[:, k]
                self._run(1)
        state[:] = self._rows[:, self._full]
        return (self._batch.warning[:, DIVERGED, 1].sum(1) > warnings) | self._failed

    def _run(self, nstep: int) -> None:
        try:
            self._batch.step(nstep=nstep)
        except batch.SimulationError as exc:
            self._failed[exc.ids] = True
