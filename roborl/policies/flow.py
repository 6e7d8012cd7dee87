"""Flow-matching policy (rectified flow): x_τ = τ·a + (1 − τ)·ε with τ = 0 noise and τ = 1 data, the
network predicts the velocity a − ε, and sampling integrates dx/dτ = v with `steps` Euler steps (one
step works). RL fine-tuning gives PPO a log-prob in one of three ways (see `policies/flow_rl.py`):

- `flow_noise` (ReinFlow / πRL): a learned, bounded noise std on every Euler step; log π is the sum of
  the Gaussian step log-densities of the whole chain.
- `flow_sde` (Flow-GRPO / πRL): the ODE turned into an SDE with noise level a; one step per sample,
  chosen at random, is stochastic and its log-density is the log-prob; the others are ODE steps.
- `fpo` (flow policy optimization): log_prob := −ℓ(τ_i, ε_i), the conditional flow-matching loss on M
  stored (τ, ε) pairs, so the PPO ratio is exp(ℓ_old − ℓ_new), clipped per pair.

Deterministic sampling (evaluation) starts from zero noise and integrates the ODE: reproducible.
"""
from __future__ import annotations

import torch
from torch import nn

from roborl.policies import flow_rl
from roborl.policies.act import Act
from roborl.policies.denoisers import make_denoiser
from roborl.policies.generative import GenerativePolicy

RL_MODES = tuple(flow_rl.RL_MODES)  # policy.rl_mode of a flow policy


class FlowPolicy(GenerativePolicy):
    def __init__(self, obs_dim: int, action_dim: int, horizon: int, execute: int, *, denoiser: str = "mlp",
                 hidden: list[int] = (256, 256, 256), critic_hidden: list[int] = (256, 256),
                 normalize_obs: bool = True, steps: int = 4, rl_mode: str | None = None,
                 noise_min: float = 0.08, noise_max: float = 0.16, noise_level: float = 0.5,
                 fpo_samples: int = 8) -> None:
        super().__init__(obs_dim, action_dim, horizon, execute, denoiser, hidden, critic_hidden, normalize_obs)
        if rl_mode not in (None, *RL_MODES):
            raise ValueError(f"policy.rl_mode '{rl_mode}' does not apply to flow; available: {', '.join(RL_MODES)}")
        self.steps, self.rl_mode = steps, rl_mode
        self.noise_min, self.noise_max, self.noise_level = noise_min, noise_max, noise_level
        self.fpo_samples = fpo_samples
        if rl_mode == "flow_noise":
            self.noise_head = make_denoiser("mlp", action_dim, horizon, obs_dim, [128, 128])
            last = self.noise_head.net[-1]
            nn.init.zeros_(last.weight)
            nn.init.zeros_(last.bias)

    # ---- the flow -------------------------------------------------------------------------------
    def velocity(self, x: torch.Tensor, tau: torch.Tensor, cond: torch.Tensor, net: nn.Module | None = None) -> torch.Tensor:
        tau = tau.expand(x.shape[0]) if tau.dim() == 0 else tau
        return (net or self.denoiser)(x, tau * 1000, cond)

    def cfm_loss(self, cond: torch.Tensor, actions: torch.Tensor, tau: torch.Tensor, eps: torch.Tensor,
                 executed_only: bool = False) -> torch.Tensor:
        """‖v_θ(τa + (1−τ)ε, τ) − (a − ε)‖² per sample: B×H×A actions, B×M taus, B×M×H×A noises -> B×M."""
        B, M = tau.shape
        a = actions[:, None].expand(-1, M, -1, -1)
        t = tau[..., None, None]
        x = t * a + (1 - t) * eps
        v = self.velocity(x.flatten(0, 1), tau.flatten(), cond.repeat_interleave(M, 0)).view_as(x)
        err = (v - (a - eps)).square()
        if executed_only:
            err = err[:, :, :self.execute]
        return err.mean((-1, -2))

    def bc_loss(self, obs: dict, actions: torch.Tensor) -> torch.Tensor:
        tau = torch.rand(actions.shape[0], 1, device=actions.device)
        return self.cfm_loss(self.cond(obs), actions, tau, torch.randn_like(actions)[:, None]).mean()

    def taus(self, device: torch.device) -> torch.Tensor:
        return torch.linspace(0, 1, self.steps + 1, device=device)

    def initial_noise(self, B: int, device: torch.device, deterministic: bool) -> torch.Tensor:
        shape = (B, self.horizon, self.action_dim)
        return torch.zeros(shape, device=device) if deterministic else torch.randn(shape, device=device)

    def sample_ode(self, cond: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return flow_rl.sample_ode(self, cond, x)

    def noise_std_head(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return self.noise_head(x, t, cond)

    # ---- the Policy interface -------------------------------------------------------------------
    def act(self, obs: dict, deterministic: bool = False) -> Act:
        cond = self.cond(obs)
        value = self.critic_value(cond, obs)
        x0 = self.initial_noise(cond.shape[0], cond.device, deterministic)
        if deterministic or self.rl_mode is None:
            x = self.sample_ode(cond, x0)
            return Act(x.clamp(-1, 1), torch.zeros(cond.shape[0], device=cond.device), value)
        sample, _ = flow_rl.RL_MODES[self.rl_mode]
        x, log_prob, extras = sample(self, cond, x0)
        return Act(x.clamp(-1, 1), log_prob, value, extras)

    def evaluate(self, obs: dict, act: Act) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.rl_mode is None:
            raise ValueError("a flow policy needs policy.rl_mode (flow_noise, flow_sde or fpo) to be fine-tuned by PPO")
        cond = self.cond(obs)
        _, chain_log_prob = flow_rl.RL_MODES[self.rl_mode]
        log_prob, entropy = chain_log_prob(self, cond, act.extras)
        return log_prob, entropy, self.critic_value(cond, obs)
