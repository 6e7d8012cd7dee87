"""MuJoCo Warp physics: N worlds of one model stepped by `mujoco_warp` on warp's default device.

It has the contract of the CPU path in sim/mujoco_env.py: the caller owns the N×nstate float64
full-physics state rows (`mujoco.mj_getState` layout) and hands them in with N×substeps×nu controls;
`step` advances every world `substeps` physics steps and writes the new state back into those rows.
MuJoCo Warp computes in float32, so the rows round-trip through float32 every control step.
"""
from __future__ import annotations

from types import ModuleType

import mujoco
import numpy as np

from roborl.sim.errors import SimError

FULL = mujoco.mjtState.mjSTATE_FULLPHYSICS
# the parts of the full-physics state, in mj_getState's order, and the mujoco_warp Data field of each
PARTS = ((mujoco.mjtState.mjSTATE_TIME, "time"), (mujoco.mjtState.mjSTATE_QPOS, "qpos"),
         (mujoco.mjtState.mjSTATE_QVEL, "qvel"), (mujoco.mjtState.mjSTATE_ACT, "act"),
         (mujoco.mjtState.mjSTATE_HISTORY, "history"), (mujoco.mjtState.mjSTATE_PLUGIN, None),
         (mujoco.mjtState.mjSTATE_PLASTIC, "plastic"))
# constraint rows allocated per world: rows past it are dropped (mujoco_warp prints a warning). Its own
# default for the arm scenes is 64, and Push reaches 65 rows on the CPU while the cube rocks under the finger
NJMAX = 256


def import_warp() -> tuple[ModuleType, ModuleType]:
    """`warp` and `mujoco_warp`, or a SimError saying how to install them."""
    try:
        import mujoco_warp
        import warp
    except ImportError as exc:
        raise SimError(f"env backend 'warp' needs MuJoCo Warp, which is not installed ({exc}): "
                       "pip install mujoco-warp") from exc
    return warp, mujoco_warp


class WarpPhysics:
    """Steps `num_worlds` copies of `model` with mujoco_warp (CUDA when warp sees a GPU, else its CPU
    device, which runs the same kernels compiled by LLVM: correct but slow)."""

    def __init__(self, model: mujoco.MjModel, num_worlds: int, substeps: int, njmax: int = NJMAX) -> None:
        self._wp, self._mjw = import_warp()
        wp, mjw = self._wp, self._mjw
        self.device = str(wp.get_device())
        self.substeps = substeps
        self._elapsed = substeps * model.opt.timestep
        self._slices: list[tuple[str, slice]] = []
        start = 0
        for part, name in PARTS:
            size = mujoco.mj_stateSize(model, part)
            if size and name is None:
                raise SimError("env backend 'warp' cannot step models with plugin state; use backend 'mujoco'")
            if size:
                self._slices.append((name, slice(start, start + size)))
            start += size
        if start != mujoco.mj_stateSize(model, FULL):
            raise SimError("env backend 'warp': this MuJoCo's full-physics state has parts warp does not know")
        data = mujoco.MjData(model)
        self._default = np.empty(start)  # the state MuJoCo resets a diverging world to (time 0)
        mujoco.mj_getState(model, data, self._default, FULL)
        mujoco.mj_forward(model, data)
        try:
            self._model = mjw.put_model(model)
        except NotImplementedError as exc:
            raise SimError(f"env backend 'warp' cannot step this model: {exc}") from exc
        self._data = mjw.put_data(model, data, nworld=num_worlds, njmax=njmax)
        self._ctrl = wp.zeros((substeps, num_worlds, model.nu), dtype=wp.float32)

    def restart(self, ids: np.ndarray) -> None:
        """Worlds `ids` start afresh (a reset): their solver starts cold, as a new MjData's does."""
        if len(ids):
            warmstart = self._data.qacc_warmstart.numpy()
            warmstart[ids] = 0.0
            self._data.qacc_warmstart.assign(warmstart)

    def advance(self) -> None:
        """`substeps` physics steps of the worlds where they live (the GPU) under the controls last handed in:
        the simulator's own cost, without `step`'s copies of the state through host memory."""
        for k in range(self.substeps):
            self._wp.copy(self._data.ctrl, self._ctrl[k])
            self._mjw.step(self._model, self._data)

    def step(self, state: np.ndarray, ctrl: np.ndarray) -> np.ndarray:
        """Advance the worlds of `state` (N×nstate, float64, updated in place) by `substeps` physics
        steps under `ctrl` (N×substeps×nu). A world whose state becomes non-finite or exceeds
        mjMAXVAL is reset to the model defaults with time 0, as MuJoCo does on the CPU; returns
        those worlds, N bool."""
        d = self._data
        for name, part in self._slices:
            field = getattr(d, name)
            field.assign(np.ascontiguousarray(state[:, part], dtype=np.float32).reshape(field.shape))
        self._ctrl.assign(np.ascontiguousarray(ctrl.transpose(1, 0, 2), dtype=np.float32))
        self.advance()
        for name, part in self._slices[1:]:
            state[:, part] = getattr(d, name).numpy()
        # time advances here in float64: float32 time drifts from the CPU's and, late in long episodes,
        # rounds away whole timesteps (which the env would take for a diverged world)
        state[:, 0] += self._elapsed
        physics = state[:, 1:]
        diverged = ~np.isfinite(physics).all(1) | (np.abs(physics) > mujoco.mjMAXVAL).any(1)
        if diverged.any():
            state[diverged] = self._default
            warmstart = d.qacc_warmstart.numpy()
            warmstart[diverged] = 0.0  # the solver's next initial guess must not carry the NaNs
            d.qacc_warmstart.assign(warmstart)
        return diverged
