"""DPPO (Ren et al. 2024) on a DDIM chain of diffusers' scheduler: the denoising chain is an inner MDP whose
steps are Gaussian, π(x_{k+1} | x_k, s) = N(μ_θ(x_k, t_k, s), σ_k²), so their log-densities are exact.

Only the last `finetune_steps` denoising steps are fine-tuned (their log-probs form the columns of
`log_prob`); earlier steps run the frozen pretrained copy. Sampling and log-prob std have floors; the
advantage of denoising step j is scaled by γ_d^(K'-1-j) and its clip range grows over the steps.

`DPPOChain` serves any noise-predicting network: a policy gives `eps(net, x, t, cond)` with `net` its
trainable network or its frozen `reference`, and the `executed_log_prob` / `executed_entropy` of its chunks.
roborl's DiffusionPolicy and LeRobot's Diffusion Policy (its U-Net) both run on it.
"""
from __future__ import annotations

import math

import torch
from diffusers import DDIMScheduler


class DPPOChain:
    def setup_chain(self, scheduler_config, steps: int, eta: float, finetune_steps: int, min_sampling_std: float,
                    min_logprob_std: float, denoise_discount: float, clip_base: float) -> None:
        """A DDIM sampler of `steps` steps over the betas of `scheduler_config` (a DDPM training scheduler's)."""
        self.scheduler = DDIMScheduler.from_config(scheduler_config)
        self.scheduler.set_timesteps(steps)
        self.steps, self.eta = steps, eta
        self.finetune_steps = min(finetune_steps, steps)
        self.min_sampling_std, self.min_logprob_std = min_sampling_std, min_logprob_std
        self.denoise_discount, self.clip_base = denoise_discount, clip_base
        stride = scheduler_config.num_train_timesteps // steps
        self.ddim_std = [eta * float(self.scheduler._get_variance(int(t), int(t) - stride)) ** 0.5
                         for t in self.scheduler.timesteps]

    def first_finetuned(self) -> int:
        """The first denoising step that θ runs; earlier steps run the frozen copy. Without an RL mode
        (BC) θ runs them all."""
        return self.steps - self.finetune_steps if self.rl_mode else 0

    def step_mean(self, net, x: torch.Tensor, k: int, cond) -> torch.Tensor:
        """μ(x_k): the DDIM step of diffusers' scheduler with zero variance noise."""
        t = int(self.scheduler.timesteps[k])
        eps = self.eps(net, x, torch.full((x.shape[0],), float(t), device=x.device), cond)
        return self.scheduler.step(eps, t, x, eta=self.eta, variance_noise=torch.zeros_like(x)).prev_sample

    def sampling_std(self, k: int) -> float:
        std = self.ddim_std[k]
        return max(std, self.min_sampling_std) if k >= self.first_finetuned() else std

    def logprob_std(self, k: int) -> float:
        return max(self.sampling_std(k), self.min_logprob_std)

    def chain_log_prob(self, cond, chain: torch.Tensor) -> torch.Tensor:
        """Log-probs (B×K') of the fine-tuned denoising steps of `chain` (B×(K'+1)×H×A) under θ."""
        k0 = self.first_finetuned()
        cols = [self.executed_log_prob(chain[:, j + 1], self.step_mean(self.denoiser, chain[:, j], k0 + j, cond),
                                       self.logprob_std(k0 + j))
                for j in range(self.finetune_steps)]
        return torch.stack(cols, -1)

    def chain_entropy(self, batch: int, device: torch.device) -> torch.Tensor:
        k0 = self.first_finetuned()
        return sum(self.executed_entropy(self.logprob_std(k0 + j), batch, device) for j in range(self.finetune_steps))

    def sample_chain(self, cond, shape: tuple, device: torch.device, deterministic: bool):
        """(chunk, the fine-tuned steps' chain B×(K'+1)×H×A): from zero noise along the means (deterministic),
        else from Gaussian noise with each step's sampling std."""
        x = torch.zeros(shape, device=device) if deterministic else torch.randn(shape, device=device)
        k0 = self.first_finetuned()
        chain = []
        for k in range(self.steps):
            if k >= k0:
                chain.append(x)
            mean = self.step_mean(self.reference if k < k0 else self.denoiser, x, k, cond)
            x = mean if deterministic else mean + self.sampling_std(k) * torch.randn_like(mean)
        return x, torch.stack([*chain, x], 1)

    # ---- DPPO's per-step PPO terms --------------------------------------------------------------
    def ratio_clip(self, clip: float) -> torch.Tensor:
        """ε(j) = ε_b + (ε − ε_b)(e^{3τ_j} − 1)/(e^3 − 1), τ_j from 0 (first fine-tuned step) to 1 (last)."""
        n = self.finetune_steps
        tau = torch.linspace(0, 1, n) if n > 1 else torch.ones(1)
        return self.clip_base + (clip - self.clip_base) * (torch.exp(3 * tau) - 1) / (math.exp(3) - 1)

    def advantage_weights(self) -> torch.Tensor:
        return self.denoise_discount ** torch.arange(self.finetune_steps - 1, -1, -1, dtype=torch.float32)
