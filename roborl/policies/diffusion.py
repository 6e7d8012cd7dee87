"""Diffusion policy on diffusers' schedulers: DDPM noise-prediction training, DDIM sampling with η > 0,
and DPPO fine-tuning (Ren et al. 2024) through `policies/dppo.py`'s chain of Gaussian denoising steps."""
from __future__ import annotations

import torch
from diffusers import DDPMScheduler

from roborl.policies.act import Act
from roborl.policies.dppo import DPPOChain
from roborl.policies.generative import GenerativePolicy


class DiffusionPolicy(DPPOChain, GenerativePolicy):
    def __init__(self, obs_dim: int, action_dim: int, horizon: int, execute: int, *, denoiser: str = "mlp",
                 hidden: list[int] = (256, 256, 256), critic_hidden: list[int] = (256, 256),
                 normalize_obs: bool = True, train_timesteps: int = 100, steps: int = 10, eta: float = 1.0,
                 rl_mode: str | None = None, finetune_steps: int = 5, min_sampling_std: float = 0.1, min_logprob_std: float = 0.1,
                 denoise_discount: float = 0.99, clip_base: float = 1e-3) -> None:
        super().__init__(obs_dim, action_dim, horizon, execute, denoiser, hidden, critic_hidden, normalize_obs)
        if rl_mode not in (None, "dppo"):
            raise ValueError(f"policy.rl_mode '{rl_mode}' does not apply to diffusion; use dppo")
        self.rl_mode = rl_mode
        self.train_scheduler = DDPMScheduler(num_train_timesteps=train_timesteps, beta_schedule="squaredcos_cap_v2",
                                             clip_sample=True, prediction_type="epsilon")
        self.setup_chain(self.train_scheduler.config, steps, eta, finetune_steps, min_sampling_std, min_logprob_std,
                         denoise_discount, clip_base)

    def eps(self, net: torch.nn.Module, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return net(x, t, cond)

    # ---- pretraining ----------------------------------------------------------------------------
    def bc_loss(self, obs: dict, actions: torch.Tensor) -> torch.Tensor:
        noise = torch.randn_like(actions)
        t = torch.randint(0, self.train_scheduler.config.num_train_timesteps, (actions.shape[0],), device=actions.device)
        noisy = self.train_scheduler.add_noise(actions, noise, t)
        return (self.denoiser(noisy, t.float(), self.cond(obs)) - noise).square().mean()

    # ---- the Policy interface -------------------------------------------------------------------
    def act(self, obs: dict, deterministic: bool = False) -> Act:
        cond = self.cond(obs)
        B = cond.shape[0]
        x, chain = self.sample_chain(cond, (B, self.horizon, self.action_dim), cond.device, deterministic)
        value = self.critic(cond).squeeze(-1)
        if self.rl_mode is None:
            return Act(x.clamp(-1, 1), torch.zeros(B, device=cond.device), value)
        return Act(x.clamp(-1, 1), self.chain_log_prob(cond, chain), value, {"chain": chain})

    def evaluate(self, obs: dict, act: Act) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.rl_mode is None:
            raise ValueError("a diffusion policy needs policy.rl_mode=dppo to be fine-tuned by PPO")
        cond = self.cond(obs)
        log_prob = self.chain_log_prob(cond, act.extras["chain"])
        return log_prob, self.chain_entropy(cond.shape[0], cond.device), self.critic(cond).squeeze(-1)
