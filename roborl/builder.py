"""Config -> objects: the environment, the policy, the device."""
from __future__ import annotations

import torch

import sim
import tasks  # noqa: F401  (registers the embedded mujoco/ tasks)
from policies import GaussianActorCritic
from policies.gaussian import ACTIVATIONS
from roborl.config import Config, EnvConfig, PolicyConfig
from roborl.errors import UserError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise UserError(f"train.device '{name}' is not a device (use auto, cpu, cuda or cuda:N)") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"train.device is '{name}' but this torch has no CUDA device; use device=cpu or auto")
    return device


def make_env(cfg: EnvConfig, num_envs: int, seed: int, device: torch.device) -> sim.VecEnv:
    options: dict = {"device": device, "seed": seed}
    if cfg.episode_length is not None:
        options["episode_length"] = cfg.episode_length
    if cfg.id.startswith("mujoco/"):
        options.update(controller=cfg.controller, control_freq=cfg.control_freq, obs_mode=cfg.obs_mode,
                       render_size=tuple(cfg.render_size))
    return sim.make(cfg.id, num_envs, **options)


def make_policy(cfg: PolicyConfig, env: sim.VecEnv) -> GaussianActorCritic:
    if cfg.activation not in ACTIVATIONS:
        raise UserError(f"policy.activation '{cfg.activation}' is unknown; available: {', '.join(ACTIVATIONS)}")
    spaces = env.observation_space.spaces
    image = tuple(spaces["rgb"].shape[:2]) if "rgb" in spaces else None
    return GaussianActorCritic(spaces["state"].shape[0], env.action_dim, list(cfg.hidden), cfg.activation,
                               cfg.init_log_std, cfg.normalize_obs, image_shape=image)


def build(cfg: Config, device: torch.device) -> tuple[sim.VecEnv, GaussianActorCritic]:
    env = make_env(cfg.env, cfg.env.num_envs, cfg.train.seed, device)
    return env, make_policy(cfg.policy, env).to(device)
