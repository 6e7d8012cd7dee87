"""Adapters both ways between our VecEnv and Gymnasium.

- `GymVecEnv`: any registered Gymnasium id (`gym/Pusher-v5`) as a VecEnv (actions rescaled from [-1, 1]).
- `GymnasiumVectorEnv`: our VecEnv as a `gymnasium.vector.VectorEnv` (numpy, same-step autoreset).
- `GymnasiumEnv`: a one-env VecEnv as a plain `gymnasium.Env` (for `gymnasium.utils.env_checker`).
"""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from roborl.sim.errors import SimError
from roborl.sim.registry import register_prefix
from roborl.sim.vec_env import Obs, VecEnv


class GymVecEnv(VecEnv):
    """N copies of a Gymnasium env (Box observations and actions) stepped by Gymnasium's SyncVectorEnv."""

    reports_success = False  # until a step's info has `is_success` (Gymnasium-Robotics envs do)

    def __init__(self, name: str, num_envs: int = 1, *, device: str | torch.device = "cpu", seed: int = 0,
                 episode_length: int | None = None, **unused: Any) -> None:
        kwargs = {"max_episode_steps": episode_length} if episode_length else {}
        try:
            self.env = gym.make_vec(name, num_envs=num_envs, vectorization_mode="sync",
                                    vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP}, **kwargs)
        except gym.error.Error as exc:
            raise SimError(f"Gymnasium could not make '{name}': {exc}") from exc
        except ImportError as exc:
            raise SimError(f"Gymnasium env '{name}' needs a missing package ({exc}); "
                           "install it, e.g. pip install 'gymnasium[mujoco]'") from exc
        obs_space, act_space = self.env.single_observation_space, self.env.single_action_space
        if not isinstance(obs_space, gym.spaces.Box) or not isinstance(act_space, gym.spaces.Box):
            raise SimError(f"'{name}' must have Box observations and actions, got {obs_space} / {act_space}")
        self.num_envs = num_envs
        self.device = torch.device(device)
        self._seed = seed
        self._low = torch.as_tensor(act_space.low, dtype=torch.float32)
        self._high = torch.as_tensor(act_space.high, dtype=torch.float32)
        self.observation_space = gym.spaces.Dict({"state": gym.spaces.Box(-np.inf, np.inf, obs_space.shape, np.float32)})
        self.action_space = gym.spaces.Box(-1.0, 1.0, act_space.shape, np.float32)
        spec = self.env.spec
        self.max_episode_steps = episode_length or (spec.max_episode_steps if spec else None)
        self._return = torch.zeros(num_envs)
        self._length = torch.zeros(num_envs, dtype=torch.long)

    def _obs(self, obs: np.ndarray) -> Obs:
        return {"state": torch.as_tensor(np.asarray(obs, dtype=np.float32), device=self.device)}

    def reset(self, seed: int | None = None, options: dict | None = None) -> Obs:
        obs, _ = self.env.reset(seed=self._seed if seed is None else seed, options=options)
        self._return.zero_()
        self._length.zero_()
        return self._obs(obs)

    def step(self, action: torch.Tensor):
        a = torch.as_tensor(action).detach().cpu().float().clamp(-1, 1)
        a = self._low + (a + 1) / 2 * (self._high - self._low)
        obs, reward, term, trunc, info = self.env.step(a.numpy())
        reward_t = torch.as_tensor(reward, dtype=torch.float32)
        term_t, trunc_t = torch.as_tensor(term), torch.as_tensor(trunc)
        done = term_t | trunc_t
        self._return += reward_t
        self._length += 1
        self.reports_success = self.reports_success or "is_success" in info
        success = torch.as_tensor(np.asarray(info.get("is_success", np.zeros(self.num_envs)), dtype=bool))
        out: dict[str, Any] = {"success": success, "labels": torch.zeros(self.num_envs, 0, dtype=torch.bool),
                               "done": done}
        if done.any():
            final = np.array(obs, dtype=np.float32, copy=True)
            for i in np.flatnonzero(done.numpy()):
                final[i] = info["final_obs"][i]
            out["final_obs"] = self._obs(final)
            out["episode"] = {"return": self._return.clone(), "length": self._length.clone(),
                              "success_once": success.clone(), "success_at_end": success.clone()}
            self._return[done] = 0
            self._length[done] = 0
        d = self.device
        out = {k: (v.to(d) if isinstance(v, torch.Tensor) else v) for k, v in out.items()}
        return self._obs(obs), reward_t.to(d), term_t.to(d), trunc_t.to(d), out

    def close(self) -> None:
        self.env.close()


register_prefix("gym", lambda name, **kw: GymVecEnv(name, **kw))


def _to_numpy(obs: Obs, keys: list[str]) -> Any:
    if keys == ["state"]:
        return obs["state"].cpu().numpy()
    return {k: obs[k].cpu().numpy() for k in keys}


class GymnasiumVectorEnv(gym.vector.VectorEnv):
    """Our VecEnv seen from Gymnasium: numpy arrays, `final_obs` in info (same-step autoreset).
    State-only envs expose a flat Box; envs with images expose a Dict."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, env: VecEnv) -> None:
        self.venv = env
        self.num_envs = env.num_envs
        self.keys = [k for k in env.observation_space.spaces]
        single = env.observation_space["state"] if self.keys == ["state"] else env.observation_space
        self.single_observation_space = single
        self.single_action_space = env.action_space
        self.observation_space = gym.vector.utils.batch_space(single, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(env.action_space, self.num_envs)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        return _to_numpy(self.venv.reset(seed=seed, options=options), self.keys), {}

    def step(self, actions: np.ndarray):
        obs, reward, term, trunc, info = self.venv.step(torch.as_tensor(np.asarray(actions), dtype=torch.float32))
        out: dict[str, Any] = {"success": info["success"].cpu().numpy()}
        if "final_obs" in info:
            done = info["done"].cpu().numpy()
            final = _to_numpy(info["final_obs"], self.keys)
            out["final_obs"] = np.empty(self.num_envs, dtype=object)  # Gymnasium's layout: one entry per env
            for i in np.flatnonzero(done):
                out["final_obs"][i] = {k: v[i] for k, v in final.items()} if isinstance(final, dict) else final[i]
            out["_final_obs"] = done
        return (_to_numpy(obs, self.keys), reward.cpu().numpy().astype(np.float64),
                term.cpu().numpy(), trunc.cpu().numpy(), out)

    def close_extras(self, **kwargs: Any) -> None:
        self.venv.close()


class GymnasiumEnv(gym.Env):
    """A VecEnv with one environment as a plain `gymnasium.Env`."""

    def __init__(self, env: VecEnv) -> None:
        if env.num_envs != 1:
            raise SimError("GymnasiumEnv wraps a VecEnv with num_envs=1; use GymnasiumVectorEnv for more")
        self.vec = GymnasiumVectorEnv(env)
        self.observation_space = self.vec.single_observation_space
        self.action_space = env.action_space

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        obs, _ = self.vec.reset(seed=seed)
        return _first(obs), {}

    def step(self, action: np.ndarray):
        obs, reward, term, trunc, info = self.vec.step(np.asarray(action, dtype=np.float32)[None])
        # when the episode ended, report its last observation, not the one the auto-reset produced
        obs = info["final_obs"][0] if "final_obs" in info else _first(obs)
        return obs, float(reward[0]), bool(term[0]), bool(trunc[0]), {"success": bool(info["success"][0])}


def _first(obs: Any) -> Any:
    return {k: v[0] for k, v in obs.items()} if isinstance(obs, dict) else obs[0]
