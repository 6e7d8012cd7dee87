"""Config -> objects: the environment (with its wrappers), the policy, the device."""
from __future__ import annotations

import torch
from torch import nn

import sim
import tasks  # noqa: F401  (registers the embedded mujoco/ tasks)
from policies import DiffusionPolicy, FlowPolicy, GaussianActorCritic
from policies.gaussian import ACTIVATIONS
from roborl.config import Config, EnvConfig, PolicyConfig
from roborl.errors import UserError
from sim.chunking import ActionChunkEnv
from sim.history import StateHistoryEnv

POLICY_KINDS = ("gaussian", "diffusion", "flow")


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
    env = sim.make(cfg.id, num_envs, **options)
    if cfg.obs_history > 1:
        env = StateHistoryEnv(env, cfg.obs_history)
    if cfg.action_chunk > 1:
        env = ActionChunkEnv(env, cfg.action_chunk)
    return env


def make_policy(cfg: PolicyConfig, env: sim.VecEnv, execute: int = 1) -> nn.Module:
    spaces = env.observation_space.spaces
    obs_dim, action_dim = spaces["state"].shape[0], env.action_dim
    if cfg.kind not in POLICY_KINDS:
        raise UserError(f"policy.kind '{cfg.kind}' is unknown; available: {', '.join(POLICY_KINDS)}")
    if cfg.kind == "gaussian":
        if cfg.activation not in ACTIVATIONS:
            raise UserError(f"policy.activation '{cfg.activation}' is unknown; available: {', '.join(ACTIVATIONS)}")
        if execute > 1:
            raise UserError("env.action_chunk > 1 needs a chunk-predicting policy (policy.kind diffusion or flow)")
        image = tuple(spaces["rgb"].shape[:2]) if "rgb" in spaces else None
        return GaussianActorCritic(obs_dim, action_dim, list(cfg.hidden), cfg.activation,
                                   cfg.init_log_std, cfg.normalize_obs, image_shape=image)
    if "rgb" in spaces:
        raise UserError(f"policy.kind '{cfg.kind}' conditions on `state` only; use env.obs_mode=state")
    common = dict(denoiser=cfg.denoiser, hidden=list(cfg.hidden), critic_hidden=list(cfg.critic_hidden),
                  normalize_obs=cfg.normalize_obs, steps=cfg.steps)
    try:
        if cfg.kind == "diffusion":
            d = cfg.dppo
            return DiffusionPolicy(obs_dim, action_dim, cfg.horizon, execute, train_timesteps=cfg.train_timesteps,
                                   eta=cfg.eta, rl_mode=cfg.rl_mode, finetune_steps=d.finetune_steps, min_sampling_std=d.min_sampling_std,
                                   min_logprob_std=d.min_logprob_std, denoise_discount=d.denoise_discount,
                                   clip_base=d.clip_base, **common)
        return FlowPolicy(obs_dim, action_dim, cfg.horizon, execute, rl_mode=cfg.rl_mode,
                          noise_min=cfg.flow_noise.min_std, noise_max=cfg.flow_noise.max_std,
                          noise_level=cfg.flow_sde.noise_level, fpo_samples=cfg.fpo.samples, **common)
    except ValueError as exc:  # the policies check their own arguments (rl_mode, denoiser, horizon)
        raise UserError(str(exc)) from exc


def load_pretrained(policy: nn.Module, path: str) -> None:
    """Start from another run's weights (e.g. a BC checkpoint): every tensor of that checkpoint must fit;
    modules the RL mode adds (a noise head) keep their initialization; the frozen reference is the loaded net."""
    from roborl.checkpoint import Checkpoint

    ckpt = Checkpoint(path)
    state = {k: v for k, v in ckpt.policy_state.items() if not k.startswith("reference.")}
    try:
        missing, unexpected = policy.load_state_dict(state, strict=False)
    except RuntimeError as exc:
        raise UserError(f"policy.init '{path}' does not fit this policy: {str(exc).splitlines()[0]}") from exc
    missing = [k for k in missing if not k.startswith(("reference.", "noise_head."))]
    if missing or unexpected:
        raise UserError(f"policy.init '{path}' does not fit this policy (missing {missing[:3]}, unexpected "
                        f"{unexpected[:3]}); give policy the same kind, horizon, denoiser and hidden sizes as the BC run")
    if hasattr(policy, "start_finetuning"):
        policy.start_finetuning()


def build(cfg: Config, device: torch.device) -> tuple[sim.VecEnv, nn.Module]:
    env = make_env(cfg.env, cfg.env.num_envs, cfg.train.seed, device)
    policy = make_policy(cfg.policy, env, cfg.env.action_chunk)
    return env, policy.to(device)
