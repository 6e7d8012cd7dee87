"""Domain randomization for the batched MuJoCo backend (sim-to-real).

Every range is sampled per env once per episode, at that env's reset, from the env's seeded
generator, so a run is reproducible. Physical parameters live in one MjModel copy per env (MuJoCo's
rollout steps each world with its own model) and are written from the nominal values at each reset,
so perturbations never compound. Latency, delay and observation noise are batched tensor operations.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import mujoco
import numpy as np
import torch

from roborl.sim.errors import SimError
from roborl.sim.vec_env import VecEnv

SCALES = ("object_mass", "friction", "damping", "actuator_gain")  # multiply nominal model parameters


@dataclass
class Randomization:
    """Ranges are [lo, hi], sampled uniformly per env and episode; lo == hi holds a value fixed."""

    object_mass: list[float] = field(default_factory=list)  # scale of mass and inertia of free-joint bodies
    friction: list[float] = field(default_factory=list)  # scale of every geom's sliding friction
    damping: list[float] = field(default_factory=list)  # scale of joint damping (dof_damping)
    # scale of position-actuator stiffness kp (gainprm[:, 0] and biasprm[:, 1] together: still a position servo)
    actuator_gain: list[float] = field(default_factory=list)
    obs_noise: float = 0.0  # std of Gaussian noise added to obs["state"] every step
    # whole control steps: the action applied is the one commanded that many steps ago
    action_delay: list[int] = field(default_factory=list)
    # ms after the start of a control step before the new command takes effect (the previous one holds)
    latency_ms: list[float] = field(default_factory=list)
    camera_pos: float = 0.0  # metres: uniform offset in [-x, x] per axis of every camera position (rgb obs)
    light: list[float] = field(default_factory=list)  # scale of every light's diffuse colour (rgb obs)

    @property
    def enabled(self) -> bool:
        return bool(any(getattr(self, name) for name in (*SCALES, "action_delay", "latency_ms", "light"))
                    or self.obs_noise or self.camera_pos)

    @property
    def physical(self) -> bool:
        """Whether any model parameter is randomized (then every env needs its own model copy)."""
        return any(getattr(self, name) for name in SCALES)

    def validate(self, control_dt: float | None = None) -> None:
        """Raise SimError naming the first bad field; `control_dt` (s) bounds the latency."""
        for name in (*SCALES, "light"):
            lo, hi = _range(self, name)
            if lo is not None and lo <= 0:
                raise SimError(f"randomization {name} scales must be > 0, got {getattr(self, name)}")
        lo, hi = _range(self, "action_delay")
        if lo is not None and (lo < 0 or not float(lo).is_integer() or not float(hi).is_integer()):
            raise SimError(f"randomization action_delay must be whole control steps >= 0, got {self.action_delay}")
        lo, hi = _range(self, "latency_ms")
        if lo is not None:
            if lo < 0:
                raise SimError(f"randomization latency_ms must be >= 0, got {self.latency_ms}")
            if control_dt is not None and hi >= 1000 * control_dt:
                raise SimError(f"randomization latency_ms must stay below the control period "
                               f"({1000 * control_dt:g} ms; use action_delay for whole steps), got {self.latency_ms}")
        for name in ("obs_noise", "camera_pos"):
            if getattr(self, name) < 0:
                raise SimError(f"randomization {name} must be >= 0, got {getattr(self, name)}")


def _range(spec: Randomization, name: str) -> tuple[float | None, float | None]:
    value = getattr(spec, name)
    if not value:
        return None, None
    if len(value) != 2 or value[0] > value[1]:
        raise SimError(f"randomization {name} must be two numbers [lo, hi] with lo <= hi, got {value}")
    return value[0], value[1]


class ModelRandomizer:
    """Samples a Randomization for the envs that reset and applies it to a MujocoVecEnv.

    `params` holds the current per-env samples of the configured fields: scales (N), `action_delay`
    (N steps), `latency_ms` (N), `camera_pos` (N×ncam×3 offsets), `light` (N×nlight scales).
    """

    def __init__(self, env: VecEnv, spec: Randomization) -> None:
        """`env` is the MujocoVecEnv that owns this randomizer (its models, data and renderer)."""
        spec.validate(env.control_dt)
        self.env, self.spec = env, spec
        model, n = env.model, env.num_envs
        self.models = [copy.copy(model) for _ in range(n)] if spec.physical else None  # copy.copy deep-copies MjModel
        self._scratch = mujoco.MjData(model)
        free = model.jnt_bodyid[model.jnt_type == mujoco.mjtJoint.mjJNT_FREE]
        servo = ((model.actuator_biastype == mujoco.mjtBias.mjBIAS_AFFINE) & (model.actuator_gainprm[:, 0] > 0)
                 & (model.actuator_biasprm[:, 1] == -model.actuator_gainprm[:, 0]))
        self._free, self._servo = free, servo.nonzero()[0]
        self._nominal = {
            "mass": model.body_mass[free].copy(), "inertia": model.body_inertia[free].copy(),
            "friction": model.geom_friction[:, 0].copy(), "damping": model.dof_damping.copy(),
            "kp": model.actuator_gainprm[self._servo, 0].copy(), "bias": model.actuator_biasprm[self._servo, 1].copy(),
            "cam_pos": torch.from_numpy(model.cam_pos.copy()), "light": torch.from_numpy(model.light_diffuse.copy()),
        }
        f64 = torch.float64
        nominal = {name: torch.ones(n, dtype=f64) for name in SCALES}
        nominal |= {"action_delay": torch.zeros(n, dtype=torch.long), "latency_ms": torch.zeros(n, dtype=f64),
                    "camera_pos": torch.zeros(n, model.ncam, 3, dtype=f64), "light": torch.ones(n, model.nlight, dtype=f64)}
        self.params = {name: value for name, value in nominal.items() if getattr(spec, name)}
        self._max_delay = int(spec.action_delay[1]) if spec.action_delay else 0
        self._actions = torch.zeros(n, self._max_delay + 1, env.action_dim_, dtype=f64)
        self._latency = bool(spec.latency_ms) and spec.latency_ms[1] > 0
        self._late = np.zeros((n, env.substeps, 1), bool)  # substeps that still run the previous control
        self._prev_ctrl = np.zeros((n, model.nu))
        self._fresh = torch.ones(n, dtype=torch.bool)  # envs whose episode has not had its first step yet

    def reset(self, ids: torch.Tensor) -> None:
        """Resample every configured field for `ids` and write it into their models."""
        n, s, env = len(ids), self.spec, self.env
        if n == 0:
            return
        for name in SCALES:
            if getattr(s, name):
                self.params[name][ids] = env.uniform(n, *getattr(s, name))
        if s.action_delay:  # drawn as a uniform float so every delay range uses the generator alike
            lo, hi = s.action_delay
            u = env.uniform(n, 0.0, 1.0)
            self.params["action_delay"][ids] = (lo + (u * (hi - lo + 1)).floor()).clamp(max=hi).long()
        if s.latency_ms:
            self.params["latency_ms"][ids] = env.uniform(n, *s.latency_ms)
            late = (self.params["latency_ms"][ids] / 1000 / env.model.opt.timestep).round().long()
            self._late[ids.numpy()] = (np.arange(env.substeps)[None, :, None] < late.numpy()[:, None, None])
        if s.camera_pos:
            x = s.camera_pos * torch.ones(env.model.ncam, 3)
            self.params["camera_pos"][ids] = env.uniform(n, -x, x)
        if s.light:
            lo, hi = s.light
            self.params["light"][ids] = env.uniform(n, [lo] * env.model.nlight, [hi] * env.model.nlight)
        if self.models is not None:
            for i in ids.tolist():
                self._write_model(i)
        self._fresh[ids] = True

    def _write_model(self, i: int) -> None:
        m, nom, p = self.models[i], self._nominal, self.params
        if "object_mass" in p:
            scale = float(p["object_mass"][i])
            m.body_mass[self._free] = nom["mass"] * scale
            m.body_inertia[self._free] = nom["inertia"] * scale
        if "friction" in p:
            m.geom_friction[:, 0] = nom["friction"] * float(p["friction"][i])
        if "damping" in p:
            m.dof_damping[:] = nom["damping"] * float(p["damping"][i])
        if "actuator_gain" in p:
            scale = float(p["actuator_gain"][i])
            m.actuator_gainprm[self._servo, 0] = nom["kp"] * scale
            m.actuator_biasprm[self._servo, 1] = nom["bias"] * scale
        mujoco.mj_setConst(m, self._scratch)  # derived constants (inverse weights, subtree masses) follow the masses

    def controls(self, action: torch.Tensor, action_to_ctrl: Callable[[torch.Tensor], torch.Tensor],
                 out: np.ndarray) -> None:
        """Fill `out` (N×substeps×nu) with the controls of this step's (delayed, late) commands. An
        env's first step of an episode fills its delay and latency history with its first command."""
        fresh = self._fresh
        if self._max_delay > 0:
            self._actions[fresh] = action[fresh, None]
            self._actions[:, 1:] = self._actions[:, :-1].clone()
            self._actions[:, 0] = action
            action = self._actions[torch.arange(len(action)), self.params["action_delay"]]
        ctrl = action_to_ctrl(action).numpy()
        out[:] = ctrl[:, None, :]
        if self._latency:
            self._prev_ctrl[fresh.numpy()] = ctrl[fresh.numpy()]
            np.copyto(out, self._prev_ctrl[:, None, :], where=self._late)
            self._prev_ctrl[:] = ctrl
        fresh[:] = False

    def noisy(self, state: torch.Tensor) -> torch.Tensor:
        """`state` plus this step's Gaussian observation noise."""
        if not self.spec.obs_noise:
            return state
        noise = torch.randn(state.shape, generator=self.env.generator, dtype=torch.float64)
        return state + self.spec.obs_noise * noise.to(state.dtype)

    def render_overrides(self, ids: list[int]) -> dict[str, np.ndarray]:
        """Per-env camera positions (n×ncam×3) and light colours (n×nlight×3) for BatchRenderer.render."""
        out = {}
        if "camera_pos" in self.params:
            out["cam_pos"] = (self._nominal["cam_pos"] + self.params["camera_pos"][ids]).numpy()
        if "light" in self.params:
            out["light_diffuse"] = (self._nominal["light"] * self.params["light"][ids, :, None]).numpy()
        return out
