"""Demonstrations: record scripted-expert episodes to robomimic-style HDF5 and load them for BC.

Layout of `demos.hdf5` (the robomimic convention, readable with plain h5py):

    data/                      attrs: total (steps), env_args (JSON: env id, controller, control rate,
                               episode length), num_episodes, success_rate
      demo_<i>/                attrs: num_samples, success (bool), instruction (the episode's own, for
                               language-conditioned tasks), seed, task_id (multi-task envs)
        obs/state              T×D float32 (the task's `state` observation before each action)
        obs/rgb                T×H×W×3 uint8 (when recorded with rgb)
        actions                T×A float32, normalized to [-1, 1] (the env's action space)
        rewards                T float32
        dones                  T bool (the last step ends the episode)
        success                T bool (the task's success flag after each step)
"""
from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import torch
from tqdm import tqdm

from roborl import sim
from roborl.demo_windows import DemoWindows, episode_windows
from roborl.demos_hdf5 import demos_file, episode_names, open_demos
from roborl.errors import UserError
from roborl.files import atomic_write


@torch.no_grad()
def record_demos(env_id: str, episodes: int, out: str | Path, num_envs: int = 16, seed: int = 0,
                 rgb: bool = False, render_size: tuple[int, int] = (64, 64), action_noise: float = 0.0,
                 progress: bool = True, episode_length: int | None = None, dart: bool = False,
                 camera: str | None = None, proprio_only: bool = False) -> dict:
    """Runs the task's scripted expert on `num_envs` envs until `episodes` episodes have ended and writes
    them (successful or not) to `out/demos.hdf5`. `action_noise` adds Gaussian noise to the expert's
    actions (a sloppier demonstrator). With `dart` the noisy action is executed but the expert's own is
    recorded (DART, Laskey et al. 2017): the demos then show the way back from small mistakes, which a
    cloned policy makes in closed loop. `proprio_only`: the recorded `state` is the arm's proprioception alone
    (env.proprio_only; with `rgb`, the camera shows the rest). Written atomically (files.atomic_write): no half-written file."""
    from roborl import tasks

    if env_id not in tasks.EXPERTS:
        raise UserError(f"no scripted expert for '{env_id}'; tasks with experts: {', '.join(tasks.EXPERTS)}")
    if episodes < 1:
        raise UserError(f"--episodes must be >= 1, got {episodes}")
    if episode_length is not None and episode_length < 1:
        raise UserError(f"--episode-length must be >= 1, got {episode_length}")
    if action_noise < 0:
        raise UserError(f"--noise is a standard deviation: it must be >= 0, got {action_noise}")
    if rgb and min(render_size) < 8:
        raise UserError(f"--size must be >= 8 pixels, got {min(render_size)}")
    if dart and action_noise <= 0:
        raise UserError("--dart records the expert's action while a noisy one is executed: give it --noise > 0")
    length = {} if episode_length is None else {"episode_length": episode_length}
    view = {} if camera is None else {"camera": camera}
    if proprio_only:
        view["proprio_only"] = True
    env = sim.make(env_id, num_envs, seed=seed, obs_mode="rgb" if rgb else "state", render_size=render_size, **length,
                   **view)
    expert = tasks.EXPERTS[env_id](env)
    gen = torch.Generator().manual_seed(seed)
    path = demos_file(out)
    if path.parent.is_file():
        raise UserError(f"--out '{path.parent}' is a file: give a directory (the demos go to DIR/demos.hdf5)")
    if path.exists():
        raise UserError(f"'{path}' exists: record to a new --out directory, or delete it first (nothing was changed)")
    keys = ["state"] + (["rgb"] if rgb else [])
    buffers: list[dict[str, list]] = [{k: [] for k in (*keys, "actions", "rewards", "success")} for _ in range(num_envs)]
    written, total, successes = 0, 0, 0
    bar = tqdm(total=episodes, unit="episode", disable=not progress, desc=f"demos {env_id}")
    try:
        with atomic_write(path) as tmp, h5py.File(tmp, "w") as f:
            data = f.create_group("data")
            obs = env.reset(seed=seed)
            expert.reset()
            while written < episodes:
                clean = action = expert.act(obs)
                if action_noise > 0:
                    action = (action + action_noise * torch.randn(action.shape, generator=gen)).clamp(-1, 1)
                nxt, reward, term, trunc, info = env.step(action)
                recorded = clean if dart else action
                for i in range(num_envs):
                    b = buffers[i]
                    for k in keys:
                        b[k].append(obs[k][i].cpu().numpy())
                    b["actions"].append(recorded[i].cpu().numpy())
                    b["rewards"].append(float(reward[i]))
                    b["success"].append(bool(info["success"][i]))
                    if not b["actions"][1:]:  # an episode's first step: its instruction and task
                        b["instruction"] = obs["instruction"][i] if "instruction" in obs else env.instruction
                        if "task_id" in obs:
                            b["task_id"] = int(obs["task_id"][i])
                done = info["done"].cpu()
                for i in done.nonzero().flatten().tolist():
                    if written < episodes:
                        ok = bool(info["episode"]["success_at_end"][i])
                        _write_episode(data, written, buffers[i], keys, ok, seed)
                        written += 1
                        successes += ok
                        total += len(buffers[i]["actions"])
                        bar.update(1)
                    buffers[i] = {k: [] for k in (*keys, "actions", "rewards", "success")}
                if done.any():
                    expert.reset(done)
                obs = nxt
            env_args = {"env_id": env_id, "controller": getattr(env, "controller", None),
                        "control_freq": round(1 / env.control_dt), "episode_length": env.max_episode_steps,
                        "obs_keys": keys, "camera": camera or "front" if rgb else None, "action_dim": env.action_dim,
                        "action_noise": action_noise,
                        "dart": dart, "proprio_only": proprio_only}
            data.attrs.update(total=total, env_args=json.dumps(env_args), num_episodes=written,
                              success_rate=successes / max(written, 1))
    finally:
        bar.close()
        env.close()
    return {"path": str(path), "episodes": written, "steps": total, "success_rate": successes / max(written, 1)}


def _write_episode(data: h5py.Group, index: int, buf: dict, keys: list[str], success: bool, seed: int) -> None:
    g = data.create_group(f"demo_{index}")
    obs = g.create_group("obs")
    for k in keys:
        arr = np.stack(buf[k])
        obs.create_dataset(k, data=arr.astype(np.uint8 if k == "rgb" else np.float32),
                           compression="gzip" if k == "rgb" else None)
    T = len(buf["actions"])
    g.create_dataset("actions", data=np.stack(buf["actions"]).astype(np.float32))
    g.create_dataset("rewards", data=np.asarray(buf["rewards"], np.float32))
    g.create_dataset("dones", data=np.arange(T) == T - 1)
    g.create_dataset("success", data=np.asarray(buf["success"], bool))
    g.attrs.update(num_samples=T, success=success, instruction=buf.get("instruction", ""), seed=seed)
    if "task_id" in buf:
        g.attrs["task_id"] = buf["task_id"]


def load_demos(path: str | Path, obs_history: int = 1, horizon: int = 1, max_episodes: int | None = None,
               success_only: bool = True, images: bool = False) -> DemoWindows:
    """Training windows from `path`: a directory written by `roborl demos` (demos.hdf5), or a LeRobot v3
    dataset (meta/info.json; lerobot_dataset.py)."""
    from roborl import lerobot_dataset

    if lerobot_dataset.is_dataset(path):
        return lerobot_dataset.load_windows(path, obs_history, horizon, max_episodes, success_only, images)
    obs_windows, act_windows, used = [], [], 0
    instructions: list[str] = []
    frames: list[torch.Tensor] = []
    with open_demos(path) as (path, data):
        env_args = json.loads(data.attrs.get("env_args", "{}"))
        for name in episode_names(data, path):
            g = data[name]
            if success_only and not bool(g.attrs.get("success", True)):
                continue
            if max_episodes is not None and used >= max_episodes:
                break
            obs_window, act_window = episode_windows(torch.from_numpy(g["obs/state"][()]),
                                                     torch.from_numpy(g["actions"][()]), obs_history, horizon)
            obs_windows.append(obs_window)
            act_windows.append(act_window)
            T = len(act_window)
            instructions += [str(g.attrs.get("instruction", ""))] * T
            if images:
                if "obs/rgb" not in g:
                    raise UserError(f"demonstrations '{path}' hold no images; record them with `roborl demos --rgb`")
                frames.append(torch.from_numpy(g["obs/rgb"][()]))
            used += 1
    if not used:
        raise UserError(f"demonstrations '{path}' hold no {'successful ' if success_only else ''}episodes")
    return DemoWindows(torch.cat(obs_windows), torch.cat(act_windows), used, env_args, instructions,
                       torch.cat(frames) if images else None)


def check_demo_state(path: str | Path, demo_dims: int, env_dims: int) -> None:
    """Demonstrations are read as the env's observations: their states must have the env's layout."""
    if demo_dims != env_dims:
        raise UserError(f"demonstrations '{path}' have {demo_dims}-dim states but the env's have {env_dims}: record "
                        "them with this env's settings (roborl demos --proprio-only for env.proprio_only)")


def load_demo_transitions(path: str | Path, reward: str = "env", max_episodes: int | None = None,
                          images: bool = False) -> tuple[dict, torch.Tensor, torch.Tensor, dict, torch.Tensor]:
    """The demonstrations of a `roborl demos` directory as (obs, action, reward, next_obs, terminated)
    transitions for an off-policy learner's demonstration buffer (RLPD). `reward`: "env" keeps the recorded
    rewards (a simulated run, whose online reward is the env's); "success" makes it the success flag after each
    step and ends each episode at its first success (a robot run, whose reward is success)."""
    if reward not in ("env", "success"):
        raise ValueError(f"reward must be env or success, got {reward!r}")
    keys = ["state"] + (["rgb"] if images else [])
    parts: dict[str, list] = {k: [] for k in ("obs", "next_obs", "action", "reward", "terminated")}
    with open_demos(path) as (path, data):
        names = episode_names(data, path, ("actions", "success", "obs/state"))[:max_episodes]
        for name in names:
            g = data[name]
            if images and "obs/rgb" not in g:
                raise UserError(f"demonstrations '{path}' hold no images; record them with `roborl demos --rgb`")
            obs = {k: torch.from_numpy(g[f"obs/{k}"][()]) for k in keys}
            success = torch.from_numpy(g["success"][()])
            T = len(success) - 1  # the last step has no next observation on file
            hits = success[:T].nonzero()
            if reward == "success" and len(hits):
                T = int(hits[0]) + 1
            parts["obs"].append({k: v[:T] for k, v in obs.items()})
            parts["next_obs"].append({k: v[1:T + 1] for k, v in obs.items()})
            parts["action"].append(torch.from_numpy(g["actions"][:T]))
            if reward == "success":
                parts["reward"].append(success[:T].float())
                parts["terminated"].append(success[:T].float())
            else:
                parts["reward"].append(torch.from_numpy(g["rewards"][:T]))
                parts["terminated"].append(torch.zeros(T))
    if not names:
        raise UserError(f"demonstrations '{path}' hold no episodes")
    cat = lambda dicts: {k: torch.cat([d[k] for d in dicts]) for k in keys}  # noqa: E731
    return (cat(parts["obs"]), torch.cat(parts["action"]), torch.cat(parts["reward"]), cat(parts["next_obs"]),
            torch.cat(parts["terminated"]))
