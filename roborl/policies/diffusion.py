"""Diffusion policy on diffusers' schedulers: DDPM noise-prediction training, DDIM sampling with η > 0,
and DPPO fine-tuning (Ren et al. 2024): the denoising chain is an inner MDP whose steps are Gaussian,
π(x_{k+1} | x_k, s) = N(μ_θ(x_k, t_k, s), σ_k²), so their log-densities are exact.

Only the last `finetune_steps` denoising steps are fine-tuned (their log-probs form the columns of
`log_prob`); earlier steps run the frozen pretrained copy. Sampling and log-prob std have floors; the
advantage of denoising step j is scaled by γ_d^(K'-1-j) and its clip range grows over the steps.
"""
from __future__ import annotations

import math

import torch
from diffusers import DDIMScheduler, DDPMScheduler

from roborl.policies.act import Act
from roborl.policies.generative import GenerativePolicy


class DiffusionPolicy(GenerativePolicy):
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
        self.scheduler = DDIMScheduler.from_config(self.train_scheduler.config)
        self.scheduler.set_timesteps(steps)
        self.steps, self.eta = steps, eta
        self.finetune_steps = min(finetune_steps, steps)
        self.min_sampling_std, self.min_logprob_std = min_sampling_std, min_logprob_std
        self.denoise_discount, self.clip_base = denoise_discount, clip_base
        stride = train_timesteps // steps
        self.ddim_std = [eta * float(self.scheduler._get_variance(int(t), int(t) - stride)) ** 0.5
                         for t in self.scheduler.timesteps]

    # ---- pretraining ----------------------------------------------------------------------------
    def bc_loss(self, obs: dict, actions: torch.Tensor) -> torch.Tensor:
        noise = torch.randn_like(actions)
        t = torch.randint(0, self.train_scheduler.config.num_train_timesteps, (actions.shape[0],), device=actions.device)
        noisy = self.train_scheduler.add_noise(actions, noise, t)
        return (self.denoiser(noisy, t.float(), self.cond(obs)) - noise).square().mean()

    # ---- the chain ------------------------------------------------------------------------------
    def first_finetuned(self) -> int:
        """The first denoising step that θ runs; earlier steps run the frozen copy. Without an RL mode
        (BC) θ runs them all."""
        return self.steps - self.finetune_steps if self.rl_mode else 0

    def step_mean(self, net: torch.nn.Module, x: torch.Tensor, k: int, cond: torch.Tensor) -> torch.Tensor:
        """μ(x_k): the DDIM step of diffusers' scheduler with zero variance noise."""
        t = int(self.scheduler.timesteps[k])
        eps = net(x, torch.full((x.shape[0],), float(t), device=x.device), cond)
        return self.scheduler.step(eps, t, x, eta=self.eta, variance_noise=torch.zeros_like(x)).prev_sample

    def sampling_std(self, k: int) -> float:
        std = self.ddim_std[k]
        return max(std, self.min_sampling_std) if k >= self.first_finetuned() else std

    def logprob_std(self, k: int) -> float:
        return max(self.sampling_std(k), self.min_logprob_std)

    def chain_log_prob(self, cond: torch.Tensor, chain: torch.Tensor) -> torch.Tensor:
        """Log-probs (B×K') of the fine-tuned denoising steps of `chain` (B×(K'+1)×H×A) under θ."""
        k0 = self.first_finetuned()
        cols = [self.executed_log_prob(chain[:, j + 1], self.step_mean(self.denoiser, chain[:, j], k0 + j, cond),
                                       self.logprob_std(k0 + j))
                for j in range(self.finetune_steps)]
        return torch.stack(cols, -1)

    def act(self, obs: dict, deterministic: bool = False) -> Act:
        cond = self.cond(obs)
        B = cond.shape[0]
        shape = (B, self.horizon, self.action_dim)
        x = torch.zeros(shape, device=cond.device) if deterministic else torch.randn(shape, device=cond.device)
        k0 = self.first_finetuned()
        chain = []
        for k in range(self.steps):
            if k >= k0:
                chain.append(x)
            mean = self.step_mean(self.reference if k < k0 else self.denoiser, x, k, cond)
            x = mean if deterministic else mean + self.sampling_std(k) * torch.randn_like(mean)
        value = self.critic(cond).squeeze(-1)
        if self.rl_mode is None:
            return Act(x.clamp(-1, 1), torch.zeros(B, device=cond.device), value)
        chain = torch.stack([*chain, x], 1)
        return Act(x.clamp(-1, 1), self.chain_log_prob(cond, chain), value, {"chain": chain})

    def evaluate(self, obs: dict, act: Act) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.rl_mode is None:
            raise ValueError("a diffusion policy needs policy.rl_mode=dppo to be fine-tuned by PPO")
        cond = self.cond(obs)
        log_prob = self.chain_log_prob(cond, act.extras["chain"])
        B, k0 = cond.shape[0], self.first_finetuned()
        entropy = sum(self.executed_entropy(self.logprob_std(k0 + j), B, cond.device) for j in range(self.finetune_steps))
        return log_prob, entropy, self.critic(cond).squeeze(-1)

    # ---- DPPO's per-step PPO terms --------------------------------------------------------------
    def ratio_clip(self, clip: float) -> torch.Tensor:
        """ε(j) = ε_b + (ε − ε_b)(e^{3τ_j} − 1)/(e^3 − 1), τ_j from 0 (first fine-tuned step) to 1 (last)."""
        n = self.finetune_steps
        tau = torch.linspace(0, 1, n) if n > 1 else torch.ones(1)
        return self.clip_base + (clip - self.clip_base) * (torch.exp(3 * tau) - 1) / (math.exp(3) - 1)

    def advantage_weights(self) -> torch.Tensor:
        return self.denoise_discount ** torch.arange(self.finetune_steps - 1, -1, -1, dtype=torch.float32)
