"""The Policy interface: what PPO, GRPO, SAC, evaluation, export and the residual wrapper rely on.

A policy sees observation dicts of batched tensors (`state`, and where the env gives them `rgb`,
`instruction`, `task_id`, `base_action`, `critic_state`) and knows no simulator. Every policy family
subclasses `Policy`: the three abstract methods are required; the hooks below them have defaults that
say "this policy has no such thing", so nobody probes a policy for what it has.

Required
- `act(obs, deterministic=False) -> Act`: the action (a chunk of H actions for chunking policies, flat),
  its log-probability under the current parameters (N, or N×S with one column per denoising step or
  flow sample), the critic's value where the policy has one, and `extras` that `evaluate` needs to score
  the same action again (denoising chains, sampled noise, token ids).
- `evaluate(obs, act) -> (log_prob, entropy, value)`: the same quantities for a stored `Act`, under the
  current parameters and with gradients (the PPO/GRPO loss).
- `value(obs) -> V`: the critic's estimate (N); used to bootstrap time-outs and the rollout's end.

Hooks (defaults in brackets)
- `update_normalizer(obs)`: learn running observation statistics [nothing to learn].
- `cost_value(obs)`: the cost critic of PPO-Lagrangian [no cost critic: an error].
- `bc_regularizer(obs, act)`: the pull toward the pretrained policy, `algo.bc_coef` [none: an error].
- `ratio_clip(clip)`: PPO's clip range per log-prob column [`clip` for every column].
- `advantage_weights()`: a weight per log-prob column [None: all alike].
- `start_finetuning()`: called once a pretrained policy is loaded for RL (freeze a reference copy) [nothing].
- `backbone_parameters()`: a pretrained backbone's parameters, for `algo.backbone_lr` [none].
- `critic_parameters()`: the critic's parameters, for `algo.critic_lr` [those of a submodule `critic`].
- `sample(obs) -> (action, log_prob, features)` and `features(obs)`, `feature_dim`: what SAC needs (a
  reparameterized sample, and the input its critics share, computed once for both) [not an off-policy policy:
  an error].
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

from roborl.policies.act import Act


class Policy(nn.Module, ABC):
    @abstractmethod
    def act(self, obs: dict, deterministic: bool = False) -> Act:
        """An action for each env (see the module's docstring)."""

    @abstractmethod
    def evaluate(self, obs: dict, act: Act) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(log_prob, entropy, value) of a stored `act` under the current parameters."""

    @abstractmethod
    def value(self, obs: dict) -> torch.Tensor:
        """The critic's value of each observation (N)."""

    def update_normalizer(self, obs: dict) -> None:
        """Learns running statistics of the observations; here there are none."""

    def cost_value(self, obs: dict) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no cost critic (PPO-Lagrangian needs policy.kind "
                                  "gaussian)")

    def bc_regularizer(self, obs: dict, act: Act) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no pull toward a pretrained policy (algo.bc_coef)")

    def ratio_clip(self, clip: float) -> float | torch.Tensor:
        """PPO's clip range of each log-prob column."""
        return clip

    def advantage_weights(self) -> torch.Tensor | None:
        """A weight per log-prob column (None: every column weighs alike)."""
        return None

    def start_finetuning(self) -> None:
        """Called once pretrained weights are loaded for RL fine-tuning."""

    def backbone_parameters(self) -> list[nn.Parameter]:
        """A pretrained backbone's trainable parameters (their own learning rate: algo.backbone_lr)."""
        return []

    def critic_parameters(self) -> list[nn.Parameter]:
        """The critic's parameters (their own learning rate: algo.critic_lr): a submodule named `critic`."""
        critic = self._modules.get("critic")
        return [] if critic is None else list(critic.parameters())

    feature_dim = 0  # the size of `features(obs)`, for SAC's critics

    def sample(self, obs: dict, features: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError(f"{type(self).__name__} has no reparameterized sample: SAC trains residual "
                                  "policies (policy.kind residual)")

    def features(self, obs: dict) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no features for SAC's critics")
