"""Thin adapters that let peer libraries train on our batched VecEnv, for the throughput benchmark: SB3's
`VecEnv` interface and rsl_rl's `VecEnv` interface. Each only translates calls; the physics, controllers,
rewards and resets stay ours, so a comparison measures the learners."""
from __future__ import annotations

import numpy as np
import torch
from stable_baselines3.common.vec_env import VecEnv as SB3VecEnv

from roborl.sim import VecEnv
from roborl.sim.gym_adapters import GymnasiumVectorEnv


class SB3Adapter(SB3VecEnv):
    """SB3's VecEnv interface over our Gymnasium vector adapter."""

    def __init__(self, venv: GymnasiumVectorEnv) -> None:
        self.venv = venv
        super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)

    def reset(self):
        return self.venv.reset()[0]

    def step_async(self, actions):
        self._actions = actions

    def step_wait(self):
        obs, rew, term, trunc, info = self.venv.step(self._actions)
        done = term | trunc
        infos = [{} for _ in range(self.num_envs)]
        for i in np.flatnonzero(done):
            infos[i]["terminal_observation"] = info["final_obs"][i]
            infos[i]["TimeLimit.truncated"] = bool(trunc[i] and not term[i])
        return obs, rew.astype(np.float32), done, infos

    def close(self):
        self.venv.close()

    def get_attr(self, name, indices=None):
        return [getattr(self, name, None)] * self.num_envs

    def set_attr(self, name, value, indices=None):
        pass

    def env_method(self, name, *args, indices=None, **kwargs):
        return [None] * self.num_envs

    def env_is_wrapped(self, wrapper_class, indices=None):
        return [False] * self.num_envs

    def seed(self, seed=None):
        return [None] * self.num_envs


class RslRlAdapter:
    """rsl_rl's VecEnv interface (`get_observations`, `step` → (obs TensorDict, rewards, dones, extras))
    over one of our VecEnvs: the `state` observation is the `policy` group, time-outs go in
    `extras["time_outs"]` (rsl_rl bootstraps them), and finished episodes' success in `extras["log"]`."""

    def __init__(self, env: VecEnv, seed: int = 0) -> None:
        from rsl_rl.env import VecEnv as RslVecEnv

        RslVecEnv.register(type(self))
        self.env = env
        self.num_envs, self.num_actions = env.num_envs, env.action_dim
        self.max_episode_length = env.max_episode_steps
        self.episode_length_buf = torch.zeros(env.num_envs, dtype=torch.long)
        self.device, self.cfg = env.device, {}
        self._obs = self._group(env.reset(seed=seed))

    def _group(self, obs: dict):
        from tensordict import TensorDict

        return TensorDict({"policy": obs["state"]}, batch_size=[self.num_envs])

    def get_observations(self):
        return self._obs

    def step(self, actions: torch.Tensor):
        obs, reward, terminated, truncated, info = self.env.step(actions)
        done = terminated | truncated
        self.episode_length_buf = torch.where(done, 0, self.episode_length_buf + 1)
        extras: dict = {"time_outs": truncated}
        if "episode" in info:
            extras["log"] = {"/success": info["episode"]["success_at_end"][done].float().mean()}
        self._obs = self._group(obs)
        return self._obs, reward, done.long(), extras

    def close(self) -> None:
        self.env.close()


def rsl_rl_train_cfg(hidden: list[int], activation: str, init_std: float, rollout_steps: int, epochs: int,
                     minibatches: int, lr: float, gamma: float, lam: float) -> dict:
    """rsl_rl's OnPolicyRunner config (its documented layout: runner, algorithm, actor, critic), with its
    recommended PPO settings (adaptive lr schedule, clipped value loss, observation normalization) and our
    network, rollout length, epochs and minibatches."""
    model = {"class_name": "rsl_rl.models.MLPModel", "hidden_dims": list(hidden), "activation": activation,
             "obs_normalization": True}
    return {
        "num_steps_per_env": rollout_steps, "save_interval": 10**9, "obs_groups": {"actor": ["policy"],
                                                                                   "critic": ["policy"]},
        "check_for_nan": False,
        "algorithm": {"class_name": "rsl_rl.algorithms.PPO", "num_learning_epochs": epochs,
                      "num_mini_batches": minibatches, "learning_rate": lr, "schedule": "adaptive",
                      "desired_kl": 0.01, "gamma": gamma, "lam": lam, "clip_param": 0.2, "entropy_coef": 0.0,
                      "value_loss_coef": 1.0, "max_grad_norm": 1.0, "use_clipped_value_loss": True},
        "actor": {**model, "distribution_cfg": {"class_name": "rsl_rl.modules.GaussianDistribution",
                                                "init_std": init_std}},
        "critic": model,
    }
