"""Isaac Lab tasks (`isaaclab/Isaac-Cartpole-Direct-v0`, any id Isaac Lab registers) as a VecEnv.

Untested: Isaac Lab cannot be installed where this was written (Python 3.11, no GPU). The adapter follows
Isaac Lab's documented API (2.x, and 3.x with Isaac Sim) and its RSL-RL wrapper (`RslRlVecEnvWrapper`):

- App: Isaac Lab's simulation modules need the Omniverse app running before they are imported, so the app
  is launched headless (`AppLauncher`) first where Isaac Sim is installed; Isaac Lab 3 with Newton physics
  runs without it. One app and one simulation context per process: one Isaac Lab env per process.
- Config and env: `parse_env_cfg(task, device, num_envs)`, then `gym.make(task, cfg=cfg)`.
- Observations: a dict of groups; the "policy" group becomes `state` (the "critic" group of asymmetric
  actor-critic tasks is not used).
- Actions: Isaac Lab's action spaces are unbounded (`Box(-inf, inf)`) and every task scales the raw action
  itself (Cartpole-Direct: force = 100 N · a; `JointPositionAction`: target = default + 0.5 · a), which is
  designed for policy outputs of about unit size; RSL-RL clips them to ±`clip_actions` or not at all. So a
  normalized action a in [-1, 1] is passed as `action_scale · a` (default 1: the task's own scaling
  applies unchanged; raise it for a task trained with larger raw actions); a bounded action space is mapped
  onto its bounds like the gym/ adapter does.
- Dones: `step` returns `terminated` and `time_outs` and resets the done envs inside the step. For a task
  with `is_finite_horizon` the time limit is part of the task, so time-outs count as terminations (RSL-RL
  reports `time_outs` only for infinite-horizon tasks).
- `final_obs`: Isaac Lab does not return the observation at which an episode ended; the one returned is
  already the next episode's first. `info["final_obs"]` is therefore the observation the policy acted on in
  the last step: bootstrapping a time-out from V(s_{T-1}) instead of V(s_T) is the approximation RSL-RL
  makes (it adds γ·V(s_t)·time_out to the reward); the next episode's first observation would be worse.
- `info["log"]`: Isaac Lab's `extras["log"]` (episode means of reward terms, termination counts) on the
  steps where environments reset. `info["success"]`: the termination term named "success" where a
  manager-based task has one, else False.
"""
from __future__ import annotations

import importlib.util
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from roborl.sim.errors import SimError
from roborl.sim.registry import register_prefix
from roborl.sim.vec_env import Obs, VecEnv

INSTALL_URL = "https://isaac-sim.github.io/IsaacLab/main/source/setup/installation/"
NOT_INSTALLED = ("Isaac Lab is not installed: it needs Python 3.12 and a CUDA GPU (Isaac Lab 3.x; Isaac Sim 6.x "
                 "for PhysX tasks; Isaac Lab 2.x: Python 3.11 and Isaac Sim 5.x) "
                 f"(see {INSTALL_URL}); this adapter is untested here")

_app: Any = None  # the Omniverse app, launched once per process
_open: IsaacLabVecEnv | None = None  # the one Isaac Lab env a process can hold


def policy_state(obs: dict[str, Any]) -> torch.Tensor:
    """The "policy" observation group as one float N×D tensor (a group of separate terms is concatenated)."""
    group = obs.get("policy")
    if group is None:
        raise SimError(f"the Isaac Lab task has no 'policy' observation group (groups: {', '.join(obs)})")
    if isinstance(group, dict):
        terms = list(group.values())
        if any(t.dim() != 2 for t in terms):
            raise SimError("the Isaac Lab task's 'policy' group has image terms; only flat state terms are mapped")
        group = torch.cat(terms, dim=-1)
    return group.float()


def to_task_action(action: torch.Tensor, low: torch.Tensor, high: torch.Tensor, scale: float) -> torch.Tensor:
    """A normalized action in [-1, 1] as the task's raw action: onto [low, high] where both bounds are finite,
    else `scale` · a (Isaac Lab's default: unbounded, scaled by the task)."""
    a = action.clamp(-1, 1)
    bounded = torch.isfinite(low) & torch.isfinite(high)
    low, span = torch.where(bounded, low, 0), torch.where(bounded, high - low, 0)
    return torch.where(bounded, low + (a + 1) / 2 * span, a * scale)


def split_dones(terminated: torch.Tensor, time_outs: torch.Tensor,
                finite_horizon: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(terminated, truncated): a time-out is a truncation to bootstrap, unless the task's horizon is finite."""
    terminated, time_outs = terminated.bool(), time_outs.bool()
    if finite_horizon:
        return terminated | time_outs, torch.zeros_like(time_outs)
    return terminated, time_outs


def _launch_app(device: str) -> None:
    global _app
    if _app is None and importlib.util.find_spec("isaacsim") is not None:
        from isaaclab.app import AppLauncher

        _app = AppLauncher({"headless": True, "device": device}).app


def _success_term(raw: Any) -> Any:
    manager = getattr(raw, "termination_manager", None)
    if manager is not None and "success" in getattr(manager, "active_terms", ()):
        return lambda: manager.get_term("success")
    return None


class IsaacLabVecEnv(VecEnv):
    one_per_process = True

    def __init__(self, name: str, num_envs: int = 1, *, device: str | torch.device = "cuda:0", seed: int = 0,
                 episode_length: int | None = None, action_scale: float = 1.0, **unused: Any) -> None:
        global _open
        if importlib.util.find_spec("isaaclab") is None:
            raise SimError(NOT_INSTALLED)
        if _open is not None:
            raise SimError("Isaac Lab runs one environment per process and one is open; close it first")
        device = str(torch.device(device))
        try:
            _launch_app(device)
            import isaaclab_tasks  # noqa: F401  (registers the Isaac-* ids with gymnasium)
            from isaaclab_tasks.utils import parse_env_cfg
        except ImportError as exc:
            raise SimError(f"Isaac Lab is installed but incomplete ({exc}); see {INSTALL_URL}") from exc

        try:
            cfg = parse_env_cfg(name, device=device, num_envs=num_envs)
        except (gym.error.Error, ValueError) as exc:
            raise SimError(f"Isaac Lab has no task '{name}' ({str(exc).splitlines()[0]})") from exc
        cfg.seed = seed
        if episode_length:
            cfg.episode_length_s = episode_length * cfg.sim.dt * cfg.decimation
        self.env = gym.make(name, cfg=cfg)
        _open = self
        raw = self.env.unwrapped
        self.num_envs = raw.num_envs
        self.device = torch.device(raw.device)
        self._seed = seed
        self._scale = action_scale
        self._finite = bool(getattr(cfg, "is_finite_horizon", False))
        self._success = _success_term(raw)
        self.reports_success = self._success is not None
        act = raw.single_action_space
        if not isinstance(act, gym.spaces.Box):
            self.close()
            raise SimError(f"'{name}' has a {type(act).__name__} action space; only Box actions are mapped")
        self._low = torch.as_tensor(act.low, dtype=torch.float32, device=self.device)
        self._high = torch.as_tensor(act.high, dtype=torch.float32, device=self.device)
        self._return = torch.zeros(self.num_envs, device=self.device)
        self._length = torch.zeros(self.num_envs, dtype=torch.long, device=self.device)
        self._succeeded = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        dim = self.reset(seed)["state"].shape[-1]
        self.observation_space = gym.spaces.Dict({"state": gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32)})
        self.action_space = gym.spaces.Box(-1.0, 1.0, act.shape, np.float32)
        self.max_episode_steps = int(raw.max_episode_length)
        self.control_dt = float(raw.step_dt)

    def reset(self, seed: int | None = None, options: dict | None = None) -> Obs:
        if options:
            raise SimError(f"Isaac Lab envs take no reset options (got {', '.join(options)})")
        obs, _ = self.env.reset(seed=self._seed if seed is None else seed)
        self._obs = policy_state(obs)
        self._return.zero_()
        self._length.zero_()
        self._succeeded.zero_()
        return {"state": self._obs}

    def step(self, action: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        last = self._obs
        raw_action = to_task_action(action.to(self.device).float(), self._low, self._high, self._scale)
        obs, reward, terminated, time_outs, extras = self.env.step(raw_action)
        terminated, truncated = split_dones(terminated, time_outs, self._finite)
        done = terminated | truncated
        reward = reward.float()
        success = self._success().bool() if self._success else torch.zeros_like(done)
        self._obs = policy_state(obs)
        self._return += reward
        self._length += 1
        self._succeeded |= success
        info: dict[str, Any] = {"success": success, "done": done,
                                "labels": torch.zeros(self.num_envs, 0, dtype=torch.bool, device=self.device)}
        if done.any():
            info["final_obs"] = {"state": torch.where(done[:, None], last, self._obs)}
            info["episode"] = {"return": self._return.clone(), "length": self._length.clone(),
                               "success_once": self._succeeded.clone(), "success_at_end": success.clone()}
            info["log"] = dict(extras.get("log", {}))
            self._return[done] = 0
            self._length[done] = 0
            self._succeeded[done] = False
        return {"state": self._obs}, reward, terminated, truncated, info

    def action_scaling(self) -> dict[str, list]:
        """The raw action each normalized one commands (see `to_task_action`)."""
        zero, one = torch.zeros_like(self._low), torch.ones_like(self._low)
        offset = to_task_action(zero, self._low, self._high, self._scale)
        scale = to_task_action(one, self._low, self._high, self._scale) - offset
        return {"scale": scale.tolist(), "offset": offset.tolist(), "units": ["isaaclab raw action"] * len(scale)}

    def close(self) -> None:
        global _open
        if _open is self:
            self.env.close()
            _open = None


register_prefix("isaaclab", lambda name, **kw: IsaacLabVecEnv(name, **kw))
