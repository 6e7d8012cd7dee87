"""Headless batched rendering of MuJoCo state rows (EGL by default; see `sim/__init__.py`).

Every env has its own tile of one offscreen framebuffer, and a call reads the framebuffer back once, not once
per frame. On a software GL (Mesa's llvmpipe, what EGL gives a machine without a GPU) each read-back waits for
the rasterizer, and one small frame keeps only one of its threads busy; with one read per call the rasterizer's
threads work while the next tiles are drawn. That pays where a core is free (bench/vla_rollout.py measures it),
not where every core is already busy (training runs side by side). An env always lands in the same tile, so
its frame does not depend on which other envs a call renders; a frame drawn in another tile can differ in a few
edge pixels."""
from __future__ import annotations

import math

import mujoco
import numpy as np
import torch
from mujoco import gl_context

from roborl.sim.errors import SimError

FULL = mujoco.mjtState.mjSTATE_FULLPHYSICS
MAX_SIDE = 4096  # the framebuffer's largest side, in pixels; more envs than fit take several pages
Marker = tuple[torch.Tensor, tuple[float, float, float, float], float]


def camera_views(camera: str) -> list[str]:
    """The cameras of a camera spec: one name, or several joined by + whose views sit side by side."""
    return camera.split("+")


class BatchRenderer:
    """Renders each world's state through one offscreen context; markers are per-env spheres. A camera
    `front+workspace` renders each named camera at height × width and puts the views side by side. `envs`
    is how many tiles the framebuffer holds: `render`'s `slots` (env ids) lie below it."""

    def __init__(self, model: mujoco.MjModel, height: int, width: int, camera: str | int = -1,
                 envs: int = 1) -> None:
        self.gl = self.context = None
        self.model = model
        self.data = mujoco.MjData(model)
        self.cameras = [self._camera(view) for view in (camera_views(camera) if isinstance(camera, str) else [camera])]
        self.height, self.width = height, width
        tile_width = width * len(self.cameras)
        self.columns = max(1, min(envs, MAX_SIDE // tile_width, math.ceil(math.sqrt(envs))))
        self.rows = max(1, min(math.ceil(envs / self.columns), MAX_SIDE // height))
        model.vis.global_.offwidth = max(model.vis.global_.offwidth, self.columns * tile_width)
        model.vis.global_.offheight = max(model.vis.global_.offheight, self.rows * height)
        model.vis.quality.shadowsize = 0
        model.vis.quality.offsamples = 0
        self.scene = mujoco.MjvScene(model, maxgeom=10000)
        self.option = mujoco.MjvOption()
        try:
            self.gl = gl_context.GLContext(model.vis.global_.offwidth, model.vis.global_.offheight)
            self.gl.make_current()
            self.context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150.value)
        except Exception as exc:  # the GL backend is missing or broken
            self.close()
            raise SimError(
                f"MuJoCo could not open an offscreen GL context ({exc}); install EGL "
                "(Debian: apt-get install libegl1 libgl1) or set MUJOCO_GL=osmesa") from exc
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN.value, self.context)

    def _camera(self, camera: str | int) -> mujoco.MjvCamera:
        """A fixed camera of the model by name or id (the env has checked the names), or (-1) MuJoCo's default
        free camera."""
        view = mujoco.MjvCamera()
        if camera == -1:
            mujoco.mjv_defaultFreeCamera(self.model, view)
        else:
            view.type, view.fixedcamid = mujoco.mjtCamera.mjCAMERA_FIXED, self.model.camera(camera).id
        return view

    def render(self, states: np.ndarray, markers: list[Marker] = (), cam_pos: np.ndarray | None = None,
               light_diffuse: np.ndarray | None = None, slots: list[int] | None = None) -> torch.Tensor:
        """One frame per state row, row i drawn in tile `slots[i]` (default: i). `cam_pos` (n×ncam×3) and
        `light_diffuse` (n×nlight×3) override the model's cameras and lights per row (domain randomization);
        the model is restored afterwards."""
        slots = list(range(len(states))) if slots is None else [int(slot) for slot in slots]
        frames = np.empty((len(states), self.height, self.width * len(self.cameras), 3), np.uint8)
        nominal = self.model.cam_pos.copy(), self.model.light_diffuse.copy()
        self.gl.make_current()
        try:
            per_page = self.columns * self.rows
            for page in sorted({slot // per_page for slot in slots}):
                rows = [i for i, slot in enumerate(slots) if slot // per_page == page]
                for i in rows:
                    if cam_pos is not None:
                        self.model.cam_pos[:] = cam_pos[i]
                    if light_diffuse is not None:
                        self.model.light_diffuse[:] = light_diffuse[i]
                    self._draw(states[i], [(pos[i], rgba, radius) for pos, rgba, radius in markers],
                               slots[i] % per_page)
                self._read([(i, slots[i] % per_page) for i in rows], frames)
        finally:
            self.model.cam_pos[:], self.model.light_diffuse[:] = nominal
        return torch.from_numpy(frames)

    def _draw(self, row: np.ndarray, markers: list[tuple[torch.Tensor, tuple, float]], tile: int) -> None:
        """Draws one state row into its tile, each camera's view in its own columns of it."""
        mujoco.mj_setState(self.model, self.data, row, FULL)
        mujoco.mj_kinematics(self.model, self.data)
        mujoco.mj_camlight(self.model, self.data)
        column, line = tile % self.columns, tile // self.columns
        for k, camera in enumerate(self.cameras):
            mujoco.mjv_updateScene(self.model, self.data, self.option, None, camera, mujoco.mjtCatBit.mjCAT_ALL.value,
                                   self.scene)
            for pos, rgba, radius in markers:
                if self.scene.ngeom >= self.scene.maxgeom:
                    break
                mujoco.mjv_initGeom(self.scene.geoms[self.scene.ngeom], mujoco.mjtGeom.mjGEOM_SPHERE,
                                    np.array([radius, 0, 0]), pos.numpy().astype(np.float64),
                                    np.eye(3).flatten(), np.asarray(rgba, np.float32))
                self.scene.ngeom += 1
            x = (column * len(self.cameras) + k) * self.width
            mujoco.mjr_render(mujoco.MjrRect(x, line * self.height, self.width, self.height), self.scene, self.context)

    def _read(self, tiles: list[tuple[int, int]], frames: np.ndarray) -> None:
        """One read-back of the tile rows holding `tiles` ((frame index, tile) pairs) into `frames`. GL's rows
        run bottom-up: the buffer is flipped once, so tile row r lands `last - r` tile rows from the top."""
        lines = [tile // self.columns for _, tile in tiles]
        first, last = min(lines), max(lines)
        tile_width = self.width * len(self.cameras)
        buffer = np.empty(((last - first + 1) * self.height, self.columns * tile_width, 3), np.uint8)
        mujoco.mjr_readPixels(buffer, None, mujoco.MjrRect(0, first * self.height, buffer.shape[1], buffer.shape[0]),
                              self.context)
        buffer = buffer[::-1]
        for i, tile in tiles:
            top = (last - tile // self.columns) * self.height
            left = tile % self.columns * tile_width
            frames[i] = buffer[top:top + self.height, left:left + tile_width]

    def close(self) -> None:
        """Frees the MjrContext with its GL context current, then the GL context (as `mujoco.Renderer` does)."""
        if self.context is not None:
            self.gl.make_current()
            self.context.free()
            self.context = None
        if self.gl is not None:
            self.gl.free()
            self.gl = None

    def __del__(self) -> None:  # an env that was never closed: free in the right order, not in the GC's
        self.close()
