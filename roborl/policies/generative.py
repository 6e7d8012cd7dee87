"""What diffusion and flow policies share: state conditioning with a normalizer fitted on demonstrations,
a critic for PPO, action-chunk bookkeeping (predict H actions, the env executes the first K) and a frozen
reference copy of the pretrained network (DPPO's frozen early steps, the BC regularizer)."""
from __future__ import annotations

import torch

from roborl.policies.base import Policy
from roborl.policies.denoisers import make_denoiser
from roborl.policies.executed import ExecutedChunk
from roborl.policies.gaussian import mlp
from roborl.policies.normalizer import RunningNormalizer


class GenerativePolicy(ExecutedChunk, Policy):
    def __init__(self, obs_dim: int, action_dim: int, horizon: int, execute: int, denoiser: str = "mlp",
                 hidden: list[int] = (256, 256, 256), critic_hidden: list[int] = (256, 256),
                 normalize_obs: bool = True) -> None:
        super().__init__()
        if not 1 <= execute <= horizon:
            raise ValueError(f"policy.horizon ({horizon}) must be >= env.action_chunk ({execute}) >= 1: a decision "
                             "executes the first action_chunk actions of the predicted chunk")
        self.action_dim, self.horizon, self.execute = action_dim, horizon, execute
        self.env_action_dim = action_dim
        self.normalizer = RunningNormalizer(obs_dim) if normalize_obs else None
        self.register_buffer("normalizer_fitted", torch.tensor(False))
        self.denoiser = make_denoiser(denoiser, action_dim, horizon, obs_dim, list(hidden))
        self.reference = make_denoiser(denoiser, action_dim, horizon, obs_dim, list(hidden)).requires_grad_(False)
        self.reference.load_state_dict(self.denoiser.state_dict())
        self.critic = mlp([obs_dim, *critic_hidden, 1], "tanh", 1.0)

    # ---- observations ---------------------------------------------------------------------------
    def cond(self, obs: dict) -> torch.Tensor:
        x = obs["state"].float()
        return self.normalizer(x) if self.normalizer is not None else x

    @torch.no_grad()
    def fit_normalizer(self, states: torch.Tensor) -> None:
        """Fix the normalizer to the statistics of the demonstrations; RL fine-tuning keeps it fixed,
        since moving it would shift the inputs the pretrained network was trained on."""
        if self.normalizer is not None:
            self.normalizer.fit(states)
        self.normalizer_fitted.fill_(True)

    def update_normalizer(self, obs: dict) -> None:
        if self.normalizer is not None and not bool(self.normalizer_fitted):
            self.normalizer.update(obs["state"])

    def value(self, obs: dict) -> torch.Tensor:
        return self.critic_value(self.cond(obs), obs)

    def critic_value(self, cond: torch.Tensor, obs: dict) -> torch.Tensor:
        """V from the condition (a VLA's critic also reads privileged observations)."""
        return self.critic(cond).squeeze(-1)

    # ---- fine-tuning ----------------------------------------------------------------------------
    def start_finetuning(self) -> None:
        """Freeze a copy of the current (pretrained) network as the reference."""
        self.reference.load_state_dict(self.denoiser.state_dict())

    def bc_regularizer(self, obs: dict, act) -> torch.Tensor:
        """Distance of the network's output from the frozen pretrained reference at random noise levels
        around the rollout's actions: pulls fine-tuning toward the BC policy (PPO's `algo.bc_coef`)."""
        a = act.action
        cond = self.cond(obs)
        tau = torch.rand(a.shape[0], device=a.device)
        noise = torch.randn_like(a)
        x = tau[:, None, None] * a + (1 - tau[:, None, None]) * noise
        t = tau * 1000
        with torch.no_grad():
            target = self.reference(x, t, cond)
        return (self.denoiser(x, t, cond) - target).square().mean()

    def ratio_clip(self, clip: float) -> float | torch.Tensor:
        """PPO's clip range, per column of `log_prob` when it has one per denoising step."""
        return clip

    def advantage_weights(self) -> torch.Tensor | None:
        """Per-column advantage weights when `log_prob` has one column per denoising step."""
        return None
