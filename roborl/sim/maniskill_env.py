"""ManiSkill3 tasks (`maniskill/PushCube-v1`, `maniskill/PickCube-v1`, ...) as a VecEnv.

On CUDA one ManiSkill env simulates all N scenes on the GPU (`sim_backend="physx_cuda"`) and every tensor
stays on the device. ManiSkill's CPU backend simulates one scene per env object, so on CPU the N envs are
spread over `workers` worker processes (default: one per core), each stepping its share one after another:
one pipe round trip per worker and step. Fewer processes than envs on purpose: a SAPIEN process costs ~5 s
to start and ~300 MB, so one process per env (gymnasium's AsyncVectorEnv) does not fit a small machine.

Semantics follow ManiSkill's PPO baseline: reward `normalized_dense` (about [0, 1] per step); with
`ignore_terminations` (default) success does not end an episode, every episode runs to the time limit
(PushCube: 50 steps, `truncated`) and `success_at_end` is judged there. Seeding: `reset(seed=s)` gives env i
ManiSkill seed s + i and every later episode seed comes from ManiSkill's per-env RNG
(`enhanced_determinism`), so runs repeat whatever the number of workers.
"""
from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from roborl.sim.errors import SimError
from roborl.sim.registry import register_prefix
from roborl.sim.vec_env import Obs, VecEnv

OBS_MODES = ("state", "rgb")
CONTROLLER_ALIASES = {"ee_delta_pos": "pd_ee_delta_pos", "joint_delta_pos": "pd_joint_delta_pos"}
INSTALL_HINT = "pip install -e '.[maniskill]' (or run scripts/setup.sh)"
ROOT = Path(__file__).resolve().parents[2]  # the folder holding the roborl package, for the worker processes


class _EnvGroup:
    """ManiSkill env objects of `counts[j]` scenes each, seen as one batch of sum(counts) envs. Lives in a
    worker process (CPU sim: counts are all 1) or in the main process (GPU sim: one env of N scenes)."""

    def __init__(self, name: str, counts: list[int], kwargs: dict[str, Any]) -> None:
        import mani_skill.envs  # noqa: F401  (registers the ManiSkill ids with gymnasium)
        from mani_skill.utils.gym_utils import find_max_episode_steps_value
        from mani_skill.utils.wrappers.flatten import FlattenRGBDObservationWrapper

        self.counts = counts
        self.envs = []
        for n in counts:
            env = gym.make(name, num_envs=n, **kwargs)
            if kwargs["obs_mode"] == "rgb":
                env = FlattenRGBDObservationWrapper(env, rgb=True, depth=False, state=True)
            self.envs.append(env)
        self.offsets = np.cumsum([0, *counts])
        base = self.envs[0].unwrapped
        self.max_episode_steps = find_max_episode_steps_value(self.envs[0])
        self.control_dt = 1.0 / base.control_freq

    def spec(self) -> dict[str, Any]:
        space = self.envs[0].unwrapped.single_observation_space
        act = self.envs[0].unwrapped.single_action_space
        if not isinstance(act, gym.spaces.Box):
            raise SimError(f"only Box action spaces are supported, got {act}")
        state = space["state"] if isinstance(space, gym.spaces.Dict) else space
        rgb = space["rgb"].shape if isinstance(space, gym.spaces.Dict) else None
        return {"state_dim": int(state.shape[-1]), "rgb_shape": rgb, "low": act.low, "high": act.high,
                "max_episode_steps": self.max_episode_steps, "control_dt": self.control_dt,
                "scaling": self.controller_scaling()}

    def controller_scaling(self) -> dict[str, list]:
        """What an action in [-1, 1] commands: `step` maps it onto each sub-controller's (arm, gripper) action
        space, which is [-1, 1] where the controller normalizes and then scales onto its original bounds
        (`_original_single_action_space`), or those bounds themselves where it does not: either way, the
        original bounds."""
        controller = self.envs[0].unwrapped.agent.controller
        parts = getattr(controller, "controllers", {"action": controller})
        out: dict[str, list] = {"scale": [], "offset": [], "units": []}
        for name, sub in parts.items():
            space = getattr(sub, "_original_single_action_space", sub.single_action_space)
            low, high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
            out["scale"] += ((high - low) / 2).tolist()
            out["offset"] += ((high + low) / 2).tolist()
            out["units"] += [f"{name}: {type(sub).__name__}"] * len(low)
        return out

    @staticmethod
    def _obs(raw: Any) -> dict[str, torch.Tensor]:
        return dict(raw) if isinstance(raw, dict) else {"state": raw}

    def reset(self, ids: list[int], seeds: list[int | None]) -> dict[str, torch.Tensor]:
        """Resets the envs `ids` (ascending indices into this group) and returns their observations. A seed
        (given for all of an env's scenes) restarts its seed sequence; None continues it."""
        rows: list[dict[str, torch.Tensor]] = []
        ids_np = np.asarray(ids)
        for j, env in enumerate(self.envs):
            pick = np.flatnonzero((ids_np >= self.offsets[j]) & (ids_np < self.offsets[j + 1]))
            if len(pick) == 0:
                continue
            local = torch.as_tensor(ids_np[pick] - self.offsets[j])
            if seeds[pick[0]] is not None and len(local) == self.counts[j]:
                raw, _ = env.reset(seed=[int(seeds[i]) for i in pick])
            else:
                raw, _ = env.reset(options={"env_idx": local.to(env.unwrapped.device)})
            rows.append({k: v[local.to(v.device)] for k, v in self._obs(raw).items()})
        return {k: torch.cat([r[k] for r in rows]) for k in rows[0]}

    def step(self, actions: np.ndarray) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
        """One control step of every env: (obs, reward, terminated, success)."""
        obs, rew, term, succ = [], [], [], []
        for j, env in enumerate(self.envs):
            a = torch.as_tensor(actions[self.offsets[j]:self.offsets[j + 1]], device=env.unwrapped.device)
            raw, reward, terminated, _, info = env.step(a)
            n = self.counts[j]
            obs.append(self._obs(raw))
            rew.append(torch.as_tensor(reward, dtype=torch.float32).reshape(n))
            term.append(torch.as_tensor(terminated, dtype=torch.bool).reshape(n))
            succ.append(torch.as_tensor(info.get("success", torch.zeros(n, dtype=torch.bool))).reshape(n).bool())
        cat = (lambda xs: xs[0]) if len(self.envs) == 1 else torch.cat
        return {k: cat([o[k] for o in obs]) for k in obs[0]}, cat(rew), cat(term), cat(succ)

    def render(self, ids: list[int]) -> torch.Tensor:
        frames = []
        for j, env in enumerate(self.envs):
            lo, hi = self.offsets[j], self.offsets[j + 1]
            local = [i - lo for i in ids if lo <= i < hi]
            if local:
                frames.append(torch.as_tensor(env.render())[local])
        return torch.cat(frames)

    def close(self) -> None:
        for env in self.envs:
            env.close()


def _make_error(name: str, exc: Exception) -> str:
    """One line on why `name` could not be made (with the fix for a missing Vulkan driver)."""
    msg = f"ManiSkill could not make '{name}': {type(exc).__name__}: {exc}".splitlines()[0]
    if "vk::" in msg or "vulkan" in msg.lower():
        msg += "; SAPIEN needs Vulkan: install mesa-vulkan-drivers >= 24.3 and libvulkan1 (scripts/setup.sh does)"
    return msg


def _numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.cpu().numpy()
    if isinstance(value, (tuple, list)):
        return type(value)(_numpy(v) for v in value)
    if isinstance(value, dict):
        return {k: _numpy(v) for k, v in value.items()}
    return value


def serve(fd: int) -> None:
    """Worker process main (`python -c "from roborl.sim.maniskill_env import serve; serve(FD)"`): builds the
    _EnvGroup the first message asks for, then answers (method, args) requests with (ok, numpy result)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle; it closes us
    torch.set_num_threads(1)
    conn = Connection(fd)
    name, counts, kwargs = conn.recv()
    try:
        group = _EnvGroup(name, counts, kwargs)
        conn.send((True, _numpy(group.spec())))
    except Exception as exc:  # noqa: BLE001  (reported to the main process as one line)
        conn.send((False, _make_error(name, exc)))
        return
    while True:
        try:
            cmd, args = conn.recv()
        except (EOFError, OSError):  # the main process went away
            break
        if cmd == "close":  # exit at once: SAPIEN's and the interpreter's teardown take ~4 s; the OS frees all
            conn.send((True, None))
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        try:
            conn.send((True, _numpy(getattr(group, cmd)(*args))))
        except Exception as exc:  # noqa: BLE001
            conn.send((False, f"{type(exc).__name__}: {exc}".splitlines()[0]))


class _Worker:
    """One worker process holding envs [start, stop) of the batch. A fresh interpreter (not multiprocessing's
    spawn, which re-imports the caller's main script), talking over a socket pair: when the main process dies
    the worker reads EOF and exits, so no process is left behind."""

    def __init__(self, name: str, start: int, stop: int, kwargs: dict[str, Any]) -> None:
        self.start, self.stop = start, stop
        parent, child = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        code = f"from roborl.sim.maniskill_env import serve; serve({child.fileno()})"
        self.proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=[child.fileno()], env=env)
        child.close()
        self.conn = Connection(parent.detach())
        self.conn.send((name, [1] * (stop - start), kwargs))

    def send(self, cmd: str, *args: Any) -> None:
        self.conn.send((cmd, args))

    def recv(self) -> Any:
        try:
            ok, value = self.conn.recv()
        except (EOFError, OSError) as exc:
            raise SimError(f"ManiSkill worker for envs {self.start}-{self.stop - 1} died "
                           f"(exit code {self.proc.wait()})") from exc
        if not ok:
            raise SimError(f"{value} (ManiSkill worker for envs {self.start}-{self.stop - 1})")
        return value

    def close(self) -> None:
        """Asks the worker to exit (the reply is collected by `finish`, so several close in parallel)."""
        if self.proc.poll() is None:
            try:
                self.send("close")
            except OSError:
                pass

    def finish(self) -> None:
        try:
            self.conn.recv()
        except (EOFError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.conn.close()


class ManiSkillVecEnv(VecEnv):
    """N ManiSkill3 envs of one task behind our VecEnv (see the module docstring for CPU vs GPU).

    Options: `obs_mode` state | rgb (adds the task camera's N×H×W×3 uint8 `rgb`); `control_mode` any
    ManiSkill controller (default pd_joint_delta_pos, as ManiSkill's PPO baseline; `ee_delta_pos` /
    `joint_delta_pos` are aliases); `reward_mode` (normalized_dense | dense | sparse); `episode_length`
    (default: the task's); `render_size` of the sensor camera and of `render()`; `ignore_terminations`;
    `sim_backend` auto | physx_cpu | physx_cuda (auto: physx_cuda on a CUDA device); `workers` (CPU sim:
    processes, default min(N, cores); 0 runs every env in this process).
    """

    def __init__(self, name: str, num_envs: int = 1, *, device: str | torch.device = "cpu", seed: int = 0,
                 obs_mode: str = "state", control_mode: str = "pd_joint_delta_pos",
                 reward_mode: str = "normalized_dense", episode_length: int | None = None,
                 render_size: tuple[int, int] = (128, 128), ignore_terminations: bool = True,
                 sim_backend: str = "auto", workers: int | None = None) -> None:
        if importlib.util.find_spec("mani_skill") is None:
            raise SimError(f"'maniskill/{name}' needs ManiSkill3, which is not installed: {INSTALL_HINT}")
        if obs_mode not in OBS_MODES:
            raise SimError(f"obs_mode must be one of {', '.join(OBS_MODES)} for maniskill/, got '{obs_mode}'")
        if num_envs < 1:
            raise SimError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.obs_mode = obs_mode
        self.ignore_terminations = ignore_terminations
        self._seed = seed
        self._seeded = False
        if sim_backend == "auto":
            sim_backend = "physx_cuda" if self.device.type == "cuda" else "physx_cpu"
        if sim_backend not in ("physx_cpu", "physx_cuda"):
            raise SimError(f"sim_backend must be auto, physx_cpu or physx_cuda, got '{sim_backend}'")
        h, w = render_size
        kwargs = {"obs_mode": obs_mode, "control_mode": CONTROLLER_ALIASES.get(control_mode, control_mode),
                  "reward_mode": reward_mode, "render_mode": "rgb_array", "sim_backend": sim_backend,
                  "render_backend": "gpu" if sim_backend == "physx_cuda" else "cpu", "enhanced_determinism": True,
                  "sensor_configs": {"width": w, "height": h}, "human_render_camera_configs": {"width": w, "height": h}}
        if episode_length is not None:
            kwargs["max_episode_steps"] = episode_length
        self._local: _EnvGroup | None = None
        self._workers: list[_Worker] = []
        try:
            if sim_backend == "physx_cuda" or workers == 0:
                counts = [num_envs] if sim_backend == "physx_cuda" else [1] * num_envs
                try:
                    self._local = _EnvGroup(name, counts, kwargs)
                    spec = _numpy(self._local.spec())
                except Exception as exc:
                    raise SimError(_make_error(name, exc)) from exc
            else:
                n_workers = min(num_envs, workers or os.cpu_count() or 1)
                bounds = np.linspace(0, num_envs, n_workers + 1).round().astype(int)
                self._workers = [_Worker(name, int(a), int(b), kwargs) for a, b in zip(bounds[:-1], bounds[1:])]
                spec = [wk.recv() for wk in self._workers][0]
        except BaseException:
            self.close()
            raise
        self.max_episode_steps = episode_length or spec["max_episode_steps"]
        self.control_dt = float(spec["control_dt"])
        act_device = self.device if self._local is not None else torch.device("cpu")  # workers take numpy
        self._low = torch.as_tensor(spec["low"], dtype=torch.float32, device=act_device)
        self._high = torch.as_tensor(spec["high"], dtype=torch.float32, device=act_device)
        spaces: dict[str, gym.spaces.Space] = {
            "state": gym.spaces.Box(-np.inf, np.inf, (spec["state_dim"],), np.float32)}
        if obs_mode == "rgb":
            spaces["rgb"] = gym.spaces.Box(0, 255, tuple(spec["rgb_shape"]), np.uint8)
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.Box(-1.0, 1.0, self._low.shape, np.float32)
        self._scaling = spec["scaling"]
        self._ready = False  # reset() called
        self.group_size = 1  # envs per group of a full reset (GRPO sets it; see reset)
        self._group_rng = np.random.default_rng(seed)  # base seeds of unseeded group resets
        self.elapsed = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self.episode_return = torch.zeros(num_envs, device=self.device)
        self.success_once = torch.zeros(num_envs, dtype=torch.bool, device=self.device)

    # ---- batching over the env group(s) -----------------------------------------------------
    def _spans(self) -> list[tuple[int, int]]:
        if self._local is not None:
            return [(0, self.num_envs)]
        return [(wk.start, wk.stop) for wk in self._workers]

    def _call(self, cmd: str, ids: list[int], *extra: list) -> list[Any]:
        """`cmd(local ids, *local extras)` on every group holding some of `ids` (ascending), the workers in
        parallel (all sends first); the results in the order of `ids`."""
        jobs = []
        for k, (a, b) in enumerate(self._spans()):
            pick = [n for n, i in enumerate(ids) if a <= i < b]
            if pick:
                jobs.append((k, [ids[n] - a for n in pick], *[[x[n] for n in pick] for x in extra]))
        if self._local is not None:
            return [getattr(self._local, cmd)(*args) for _, *args in jobs]
        for k, *args in jobs:
            self._workers[k].send(cmd, *args)
        return [self._workers[k].recv() for k, *_ in jobs]

    def _cat(self, parts: list[Any]) -> torch.Tensor:
        return torch.cat([torch.as_tensor(p).to(self.device) for p in parts])

    def _reset_ids(self, ids: list[int], seeds: list[int] | None) -> Obs:
        """Observations of the reset envs `ids` (ascending), in that order."""
        parts = self._call("reset", ids, [None] * len(ids) if seeds is None else seeds)
        return {key: self._cat([p[key] for p in parts]) for key in parts[0]}

    # ---- the VecEnv contract ---------------------------------------------------------------
    supports_group_resets = True

    def set_group_size(self, group_size: int) -> None:
        self.group_size = group_size

    def reset(self, seed: int | None = None, options: dict | None = None) -> Obs:
        """`options={"group_size": G}` (default: the `group_size` attribute) starts each group of G consecutive
        envs from one initial state (GRPO): its members get the same ManiSkill seed (CPU sim only)."""
        options = dict(options or {})
        group = options.pop("group_size", self.group_size)
        if options:
            raise SimError(f"unknown reset options {sorted(options)}; available: group_size")
        if not isinstance(group, int) or group < 1 or self.num_envs % group:
            raise SimError(f"group_size must be a positive divisor of num_envs ({self.num_envs}), got {group!r}")
        if group > 1 and self._local is not None and self._local.counts[0] > 1:
            raise SimError("group resets (group_size > 1) need the CPU sim (sim_backend=physx_cpu) for now")
        if seed is None and (not self._seeded or group > 1):
            seed = self._seed if not self._seeded else int(self._group_rng.integers(2**31))
        self._seeded = True
        ids = list(range(self.num_envs))
        obs = self._reset_ids(ids, None if seed is None else [seed + i // group * group for i in ids])
        self._ready = True
        self.elapsed.zero_()
        self.episode_return.zero_()
        self.success_once.zero_()
        return obs

    def action_scaling(self) -> dict[str, list]:
        """The controllers' own bounds (pd_joint_delta_pos: ±0.1 rad per arm joint, the gripper's joint
        target in m); see `_EnvGroup.controller_scaling`."""
        return {k: list(v) for k, v in self._scaling.items()}

    def step(self, action: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        if not self._ready:
            raise SimError("call reset() before step()")
        a = torch.as_tensor(action).detach().float()
        if a.shape != (self.num_envs, self.action_dim):
            raise SimError(f"action must have shape ({self.num_envs}, {self.action_dim}), got {tuple(a.shape)}")
        a = self._low + (a.to(self._low.device).clamp(-1, 1) + 1) / 2 * (self._high - self._low)
        if self._local is not None:
            parts = [self._local.step(a)]
        else:
            for wk in self._workers:
                wk.send("step", a[wk.start:wk.stop].numpy())
            parts = [wk.recv() for wk in self._workers]
        obs = {k: self._cat([p[0][k] for p in parts]) for k in parts[0][0]}
        reward, terminated, success = (self._cat([p[i] for p in parts]) for i in (1, 2, 3))
        reward, terminated, success = reward.float(), terminated.bool(), success.bool()
        if self.ignore_terminations:
            terminated = torch.zeros_like(terminated)
        self.elapsed += 1
        self.episode_return += reward
        self.success_once |= success
        truncated = (self.elapsed >= self.max_episode_steps) & ~terminated
        done = terminated | truncated
        info: dict[str, Any] = {"success": success, "done": done,
                                "labels": torch.zeros(self.num_envs, 0, dtype=torch.bool, device=self.device)}
        if done.any():
            info["final_obs"] = {k: v.clone() for k, v in obs.items()}
            info["episode"] = {"return": self.episode_return.clone(), "length": self.elapsed.clone(),
                               "success_once": self.success_once.clone(), "success_at_end": success.clone()}
            ids = done.nonzero().flatten().tolist()
            fresh = self._reset_ids(ids, None)
            for k, v in fresh.items():
                obs[k][done] = v
            self.elapsed[done] = 0
            self.episode_return[done] = 0.0
            self.success_once[done] = False
        return obs, reward, terminated, truncated, info

    def render(self, env_ids: list[int] | None = None) -> torch.Tensor:
        wanted = list(range(self.num_envs)) if env_ids is None else [int(i) for i in env_ids]
        ids = sorted(set(wanted))
        frames = torch.cat([torch.as_tensor(p).cpu() for p in self._call("render", ids)])
        return frames[[ids.index(i) for i in wanted]].to(torch.uint8)

    def close(self) -> None:
        for wk in self._workers:
            wk.close()
        for wk in self._workers:
            wk.finish()
        self._workers = []
        if self._local is not None:
            self._local.close()
            self._local = None


register_prefix("maniskill", lambda name, **kw: ManiSkillVecEnv(name, **kw))
