"""Headless batched rendering of MuJoCo state rows (EGL by default; see `sim/__init__.py`)."""
from __future__ import annotations

import mujoco
import numpy as np
import torch

from roborl.sim.errors import SimError

FULL = mujoco.mjtState.mjSTATE_FULLPHYSICS
Marker = tuple[torch.Tensor, tuple[float, float, float, float], float]


def camera_views(camera: str) -> list[str]:
    """The cameras of a camera spec: one name, or several joined by + whose views sit side by side."""
    return camera.split("+")


class BatchRenderer:
    """Renders each world's state through one offscreen context; markers are per-env spheres. A camera
    `front+workspace` renders each named camera at height × width and puts the views side by side."""

    def __init__(self, model: mujoco.MjModel, height: int, width: int, camera: str | int = -1) -> None:
        model.vis.global_.offheight = max(model.vis.global_.offheight, height)
        model.vis.global_.offwidth = max(model.vis.global_.offwidth, width)
        model.vis.quality.shadowsize = 0
        model.vis.quality.offsamples = 0
        try:
            self.renderer = mujoco.Renderer(model, height, width)
        except Exception as exc:  # the GL backend is missing or broken
            raise SimError(
                f"MuJoCo could not open an offscreen GL context ({exc}); install EGL "
                "(Debian: apt-get install libegl1 libgl1) or set MUJOCO_GL=osmesa") from exc
        self.model = model
        self.data = mujoco.MjData(model)
        self.cameras = camera_views(camera) if isinstance(camera, str) else [camera]
        self.height, self.width = height, width

    def render(self, states: np.ndarray, markers: list[Marker] = (), cam_pos: np.ndarray | None = None,
               light_diffuse: np.ndarray | None = None) -> torch.Tensor:
        """One frame per state row. `cam_pos` (n×ncam×3) and `light_diffuse` (n×nlight×3) override the
        model's cameras and lights per row (domain randomization); the model is restored afterwards."""
        frames = np.empty((len(states), self.height, self.width * len(self.cameras), 3), np.uint8)
        nominal = self.model.cam_pos.copy(), self.model.light_diffuse.copy()
        try:
            for i, row in enumerate(states):
                if cam_pos is not None:
                    self.model.cam_pos[:] = cam_pos[i]
                if light_diffuse is not None:
                    self.model.light_diffuse[:] = light_diffuse[i]
                self._frame(row, [(pos[i], rgba, radius) for pos, rgba, radius in markers], frames[i])
        finally:
            self.model.cam_pos[:], self.model.light_diffuse[:] = nominal
        return torch.from_numpy(frames)

    def _frame(self, row: np.ndarray, markers: list[tuple[torch.Tensor, tuple, float]], out: np.ndarray) -> None:
        """Renders one state row into `out` (H × views·W × 3), each camera's view in its own columns."""
        mujoco.mj_setState(self.model, self.data, row, FULL)
        mujoco.mj_kinematics(self.model, self.data)
        mujoco.mj_camlight(self.model, self.data)
        for k, camera in enumerate(self.cameras):
            out[:, k * self.width:(k + 1) * self.width] = self._view(camera, markers)

    def _view(self, camera: str | int, markers: list[tuple[torch.Tensor, tuple, float]]) -> np.ndarray:
        self.renderer.update_scene(self.data, camera=camera)
        scene = self.renderer.scene
        for pos, rgba, radius in markers:
            if scene.ngeom >= scene.maxgeom:
                break
            mujoco.mjv_initGeom(scene.geoms[scene.ngeom], mujoco.mjtGeom.mjGEOM_SPHERE,
                                np.array([radius, 0, 0]), pos.numpy().astype(np.float64),
                                np.eye(3).flatten(), np.asarray(rgba, np.float32))
            scene.ngeom += 1
        return self.renderer.render()

    def close(self) -> None:
        self.renderer.close()
