"""Batched MuJoCo backend: N copies of one model stepped by MuJoCo's native thread pool.

The physics state of all N worlds lives in one float64 array (MuJoCo's full-physics state vector per
row); torch views of it give tasks `qpos` / `qvel` without copies. One control step is one call of
`substeps` physics steps for all worlds at once (`mujoco.batch`, sim/mujoco_physics.py), so no Python
loop runs over envs. `backend="warp"` steps the same state rows with MuJoCo Warp instead
(sim/warp_physics.py).
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np
import torch

from roborl.sim.batch import to_device
from roborl.sim.errors import SimError
from roborl.sim.mujoco_physics import MujocoPhysics
from roborl.sim.randomization import ModelRandomizer, Randomization
from roborl.sim.render import camera_views
from roborl.sim.vec_env import Obs, VecEnv
from roborl.sim.warp_physics import WarpPhysics

FULL = mujoco.mjtState.mjSTATE_FULLPHYSICS
BACKENDS = ("mujoco", "warp")  # mujoco.batch on CPU threads | mujoco_warp (GPU, or slowly on CPU)


class MujocoVecEnv(VecEnv):
    """Base class of batched MuJoCo tasks (ManiSkill-style: one subclass per task).

    Subclasses implement `_reset_idx`, `_action_to_ctrl`, `_state_obs` and `_evaluate`; the
    base class owns physics, time limits, auto-reset, episode statistics, seeding, rendering and
    domain randomization (`randomization`, see sim/randomization.py). `backend` picks the physics
    engine (BACKENDS); tasks see the same float64 state either way. With `proprio_only` the `state`
    observation is the robot's part of it (`_proprio_obs`, which tasks with one arm implement).
    """

    action_dim_: int = 0
    instruction: str = ""

    def __init__(
        self,
        model_path: str | Path | mujoco.MjModel,
        num_envs: int = 1,
        *,
        substeps: int = 10,
        episode_length: int = 100,
        device: str | torch.device = "cpu",
        seed: int = 0,
        nthread: int | None = None,
        obs_mode: str = "state",
        render_size: tuple[int, int] = (128, 128),
        camera: str = "front",
        randomization: Randomization | None = None,
        backend: str = "mujoco",
        group_size: int = 1,
        critic_state: bool = False,
        proprio_only: bool = False,
    ) -> None:
        if backend not in BACKENDS:
            raise SimError(f"unknown physics backend '{backend}'; available: {', '.join(BACKENDS)}")
        if backend == "warp" and randomization is not None and randomization.physical:
            raise SimError("physical domain randomization (object_mass, friction, damping, actuator_gain) is not "
                           "supported yet with backend 'warp'; latency, delay and noise ranges are")
        if obs_mode not in ("state", "rgb"):
            raise SimError(f"obs_mode must be 'state' or 'rgb', got '{obs_mode}'")
        if num_envs < 1:
            raise SimError(f"num_envs must be >= 1, got {num_envs}")
        self.group_size = self._check_group_size(group_size, num_envs)
        self.critic_state = critic_state
        self.proprio_only = proprio_only
        self.model = (model_path if isinstance(model_path, mujoco.MjModel)  # a scene composed in code (MjSpec)
                      else mujoco.MjModel.from_xml_path(str(model_path)))
        for view in camera_views(camera):  # several cameras: their views side by side in one frame
            if mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_CAMERA, view) < 0:
                names = [self.model.camera(i).name for i in range(self.model.ncam)]
                raise SimError(f"unknown camera '{view}'; the scene's cameras: {', '.join(names)} (several: "
                               "joined by +, e.g. front+workspace)")
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.substeps = substeps
        self.max_episode_steps = episode_length
        self.control_dt = substeps * self.model.opt.timestep
        self.obs_mode = obs_mode
        self.render_size = tuple(render_size)
        self.camera = camera
        nthread = nthread or min(os.cpu_count() or 1, num_envs)
        self.nthread = nthread
        self.backend = backend
        self.physics = (MujocoPhysics(self.model, num_envs, substeps, nthread) if backend == "mujoco"
                        else WarpPhysics(self.model, num_envs, substeps))
        self._renderer = None
        self._observed = True  # False inside `unobserved`: step() then renders no frames

        nq, nv, nu = self.model.nq, self.model.nv, self.model.nu
        nstate = mujoco.mj_stateSize(self.model, FULL)
        data = mujoco.MjData(self.model)
        mujoco.mj_forward(self.model, data)
        init = np.empty(nstate)
        mujoco.mj_getState(self.model, data, init, FULL)
        self.state = np.tile(init, (num_envs, 1))
        self.initial_state = torch.from_numpy(init)
        self._ctrl = np.empty((num_envs, substeps, nu))
        st = torch.from_numpy(self.state)  # shares memory with self.state
        self.sim_time = st[:, 0]
        self.qpos = st[:, 1 : 1 + nq]
        self.qvel = st[:, 1 + nq : 1 + nq + nv]
        self._state_t = st

        self.elapsed = torch.zeros(num_envs, dtype=torch.long)
        self.episode_return = torch.zeros(num_envs)
        self.episode_cost = torch.zeros(num_envs)
        self.success_once = torch.zeros(num_envs, dtype=torch.bool)
        self.termination_hooks: list = []  # callables (labels N×P, reward_terms N×T | None) -> N bool to end
        self.generator = torch.Generator().manual_seed(seed)
        self.state_version = 0  # bumped whenever the physics state changes; tasks key caches on it
        self._setup()
        self.randomizer = None  # None when nothing is randomized: the env runs exactly as without it
        if randomization is not None and randomization.enabled:
            self.randomizer = ModelRandomizer(self, randomization)  # validates the ranges
        if self.randomizer is not None and self.randomizer.models is not None:
            self.physics.set_models(self.randomizer.models)

        spaces: dict[str, gym.spaces.Space] = {}
        self.action_space = gym.spaces.Box(-1.0, 1.0, (self.action_dim_,), np.float32)
        dim = self._policy_state().shape[-1]
        spaces["state"] = gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32)
        if critic_state:
            spaces["critic_state"] = gym.spaces.Box(-np.inf, np.inf, (self._critic_state_obs().shape[-1],), np.float32)
        if obs_mode == "rgb":
            h, w = self.render_size
            spaces["rgb"] = gym.spaces.Box(0, 255, (h, w * len(camera_views(self.camera)), 3), np.uint8)
        self.observation_space = gym.spaces.Dict(spaces)

    # ---- hooks for tasks -------------------------------------------------------------------
    def _setup(self) -> None:
        """Allocate task buffers (goals, controller state) once the model and N are known."""

    def _reset_idx(self, env_ids: torch.Tensor) -> None:
        """Sample initial states for `env_ids` (write `self.qpos` / `self.qvel` rows, task buffers)."""
        raise NotImplementedError

    def _action_to_ctrl(self, action: torch.Tensor) -> torch.Tensor:
        """Map actions in [-1, 1] (N×A, CPU float64) to MuJoCo controls (N×nu)."""
        raise NotImplementedError

    def _state_obs(self) -> torch.Tensor:
        """The `state` observation, N×D float (CPU)."""
        raise NotImplementedError

    def _proprio_obs(self) -> torch.Tensor:
        """The robot's proprioception alone, N×D float (CPU): `state` with `proprio_only`."""
        raise SimError(f"{type(self).__name__} has no single arm whose proprioception could be the state alone: "
                       "drop env.proprio_only (roborl demos: --proprio-only)")

    def _policy_state(self) -> torch.Tensor:
        return self._proprio_obs() if self.proprio_only else self._state_obs()

    def task_state(self) -> torch.Tensor:
        """The task's full state observation (objects and goals too), N×D float, whatever `proprio_only` says: what a
        scripted operator standing in for a person watching the robot reads (roborl/robot/operators.py)."""
        return self._state_obs().float()

    def _critic_state_obs(self) -> torch.Tensor:
        """The `critic_state` observation (`critic_state=True`): privileged task state (objects, goal) that
        only a critic reads, N×D float (CPU). An asymmetric actor-critic trains with it in simulation; the
        policy, which never reads it, deploys without it."""
        raise SimError(f"{type(self).__name__} has no privileged critic state; set env.critic_state false")

    def _evaluate(self) -> dict[str, torch.Tensor]:
        """reward (N), success (N bool), labels (N×P bool), optional terminated (N bool), cost (N) and
        reward_terms (N×T, named by `reward_term_names`: reward components a reward machine may pay)."""
        raise NotImplementedError

    def _markers(self) -> list[tuple[torch.Tensor, tuple[float, float, float, float], float]]:
        """Per-env visual markers (positions N×3, rgba, radius) drawn into rendered frames."""
        return []

    # ---- the VecEnv contract ---------------------------------------------------------------
    supports_group_resets = True

    def set_group_size(self, group_size: int) -> None:
        self.group_size = group_size

    def reset(self, seed: int | None = None, options: dict | None = None) -> Obs:
        """`options={"group_size": G}` (default: the constructor's `group_size`) starts each group of G
        consecutive envs from one sampled initial state (GRPO); groups differ from each other."""
        options = dict(options or {})
        group_size = self._check_group_size(options.pop("group_size", self.group_size), self.num_envs)
        if options:
            raise SimError(f"unknown reset options {sorted(options)}; available: group_size")
        if seed is not None:
            self.generator.manual_seed(seed)
        if group_size == 1:
            self._reset_envs(torch.ones(self.num_envs, dtype=torch.bool))
        else:
            self._reset_groups(group_size)
        return self._obs()

    def step(self, action: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        action = torch.as_tensor(action).detach().to("cpu", torch.float64)
        if action.shape != (self.num_envs, self.action_dim_):
            raise SimError(f"action must have shape ({self.num_envs}, {self.action_dim_}), got {tuple(action.shape)}")
        action = action.clamp(-1.0, 1.0)
        if self.randomizer is None:
            self._ctrl[:] = self._action_to_ctrl(action).numpy()[:, None, :]
        else:
            self.randomizer.controls(action, self._action_to_ctrl, self._ctrl)
        # MuJoCo resets a diverging world to its defaults and goes on: end that episode without a reward
        # instead of training on what follows
        unstable_rows = self.physics.step(self.state, self._ctrl)
        any_unstable = bool(unstable_rows.any())
        unstable = torch.from_numpy(unstable_rows)
        if any_unstable:
            self._state_t[unstable] = self.initial_state
            self.physics.restart(unstable_rows.nonzero()[0])
        self.state_version += 1
        self.elapsed += 1

        ev = self._evaluate()
        reward, success = ev["reward"].float(), ev["success"]
        terminated = ev["terminated"] if "terminated" in ev else torch.zeros(self.num_envs, dtype=torch.bool)
        if any_unstable:
            reward, success = reward.masked_fill(unstable, 0.0), success & ~unstable
            terminated = terminated | unstable
        task_terminated = terminated
        for hook in self.termination_hooks:  # wrappers that end episodes on what this step's labels mean
            terminated = terminated | hook(ev["labels"], ev.get("reward_terms")).cpu()
        truncated = (self.elapsed >= self.max_episode_steps) & ~terminated
        self.episode_return += reward
        self.success_once |= success
        info: dict[str, Any] = {"success": success, "labels": ev["labels"], "task_terminated": task_terminated}
        if "reward_terms" in ev:
            info["reward_terms"] = ev["reward_terms"].float()
        if "cost" in ev:
            info["cost"] = ev["cost"].float()
            self.episode_cost += info["cost"]
        done = terminated | truncated
        if done.numpy().any():
            info["final_obs"] = self._obs()
            info["episode"] = {
                "return": self.episode_return.clone(), "length": self.elapsed.clone(),
                "success_once": self.success_once.clone(), "success_at_end": success.clone(),
            }
            if "cost" in ev:
                info["episode"]["cost"] = self.episode_cost.clone()
            self._reset_envs(done)
        obs = self._obs(frames=self._observed)
        info["done"] = done
        if self.device.type == "cpu":
            return obs, reward, terminated, truncated, info
        return obs, reward.to(self.device), terminated.to(self.device), truncated.to(self.device), to_device(info, self.device)

    @contextmanager
    def unobserved(self) -> Iterator[None]:
        """Steps inside return no `rgb` (rendering is most of an rgb step's cost); `final_obs` keeps it."""
        self._observed = False
        try:
            yield
        finally:
            self._observed = True

    def render(self, env_ids: list[int] | None = None) -> torch.Tensor:
        from roborl.sim.render import BatchRenderer

        if self._renderer is None:
            h, w = self.render_size
            self._renderer = BatchRenderer(self.model, h, w, self.camera, envs=self.num_envs)
        ids = list(range(self.num_envs)) if env_ids is None else list(env_ids)
        markers = [(pos[ids], rgba, size) for pos, rgba, size in self._markers()]
        overrides = self.randomizer.render_overrides(ids) if self.randomizer is not None else {}
        return self._renderer.render(self.state[ids], markers, **overrides, slots=ids)

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    # ---- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _check_group_size(group_size: int, num_envs: int) -> int:
        if not isinstance(group_size, int) or group_size < 1 or num_envs % group_size:
            raise SimError(f"group_size must be a positive divisor of num_envs ({num_envs}), got {group_size!r}")
        return group_size

    def _reset_groups(self, group_size: int) -> None:
        """Member k of every group is reset in one batch, all G batches from the same generator state:
        tasks draw their samples row by row, so each member gets its group's draw, whatever the task."""
        first = torch.arange(0, self.num_envs, group_size)
        start = self.generator.get_state()
        for k in range(group_size):
            self.generator.set_state(start)
            mask = torch.zeros(self.num_envs, dtype=torch.bool)
            mask[first + k] = True
            self._reset_envs(mask)

    def _reset_envs(self, mask: torch.Tensor) -> None:
        ids = mask.nonzero().flatten()
        self._state_t[ids] = self.initial_state
        self._reset_idx(ids)
        self.physics.restart(ids.numpy())
        if self.randomizer is not None:
            self.randomizer.reset(ids)
            if self.randomizer.models is not None:
                self.physics.set_models(self.randomizer.models)  # the physics reads the edited models afresh
        self.state_version += 1
        self.elapsed[ids] = 0
        self.episode_return[ids] = 0.0
        self.episode_cost[ids] = 0.0
        self.success_once[ids] = False

    def _obs(self, frames: bool = True) -> Obs:
        state = self._policy_state()
        if self.randomizer is not None:
            state = self.randomizer.noisy(state)
        obs: Obs = {"state": state.float().to(self.device)}
        if self.critic_state:
            obs["critic_state"] = self._critic_state_obs().float().to(self.device)
        if self.obs_mode == "rgb" and frames:
            obs["rgb"] = self.render().to(self.device)
        if self.instruction:
            obs["instruction"] = [self.instruction] * self.num_envs
        return obs

    def uniform(self, n: int, low: Any, high: Any) -> torch.Tensor:
        """n samples uniform in [low, high] (broadcast per dim) from the env's seeded generator."""
        low = torch.as_tensor(low, dtype=torch.float64)
        high = torch.as_tensor(high, dtype=torch.float64)
        u = torch.rand((n, *low.shape), generator=self.generator, dtype=torch.float64)
        return low + (high - low) * u
