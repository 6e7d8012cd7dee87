"""Residual policy: a small Gaussian policy that corrects a frozen base controller.

action = clamp(base_action + scale·tanh(u), −1, 1) in the normalized action space, with u ~ N(μ(x), σ)
and x = [state, image features, base_action] (`inputs="obs+base"`, ResiP / Policy Decorator) or the
observation alone (`inputs="obs"`). Where the env observes `rgb`, the residual sees it through its own
small CNN: a residual blind to the scene cannot tell where the base's action misses the object (a base
VLA reads the image; its residual must too). The base's action arrives as `obs["base_action"]` (see
`sim.base_action`), computed once per step outside this module, so it is never recomputed and never
receives a gradient. With `critic_state_dim` the critic also reads the env's privileged `critic_state`.

μ's last layer starts at zero, so the deterministic policy is exactly the base at step 0. The std is a
learned state-independent parameter for PPO (ResiP) or a state-dependent head for SAC
(`state_std=True`). `log_prob` is that of the executed residual tanh(u), tanh Jacobian included; u is
kept in `extras` so PPO re-evaluates the same sample.
"""
from __future__ import annotations

import torch
from torch import nn

from roborl.policies.act import Act
from roborl.policies.base import Policy
from roborl.policies.cnn import CNNEncoder
from roborl.policies.gaussian import GaussianOnStateAndImage, mlp, squashed_log_prob
from roborl.policies.normalizer import RunningNormalizer
from roborl.policies.value_head import ValueHead

INPUTS = ("obs+base", "obs")


class ResidualPolicy(GaussianOnStateAndImage, Policy):
    def __init__(self, obs_dim: int, action_dim: int, scale: float = 0.1, inputs: str = "obs+base",
                 hidden: list[int] = (256, 256), activation: str = "tanh", init_log_std: float = -1.0,
                 state_std: bool = False, normalize_obs: bool = True, critic: bool = True,
                 image_shape: tuple[int, int] | None = None, image_features: int = 256,
                 critic_state_dim: int = 0) -> None:
        """`image_shape` (H, W): the env observes `rgb`, which the residual encodes with its own CNN.
        `critic_state_dim` > 0: the critic also reads the env's privileged `critic_state` (asymmetric)."""
        super().__init__()
        if inputs not in INPUTS:
            raise ValueError(f"residual.inputs '{inputs}' is unknown; available: {', '.join(INPUTS)}")
        if scale <= 0:
            raise ValueError(f"residual.scale must be > 0, got {scale}")
        self.scale, self.inputs, self.state_std, self.action_dim = scale, inputs, state_std, action_dim
        self.normalizer = RunningNormalizer(obs_dim) if normalize_obs else None
        self.encoder = CNNEncoder(*image_shape, image_features) if image_shape else None
        self.feature_dim = in_dim = (obs_dim + (image_features if image_shape else 0)
                                     + (action_dim if inputs == "obs+base" else 0))
        self.actor = mlp([in_dim, *hidden, action_dim * (2 if state_std else 1)], activation, 0.01)
        last = self.actor[-1]
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        if state_std:
            nn.init.constant_(last.bias[action_dim:], init_log_std)
            self.log_std = None
        else:
            self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))
        self.critic = ValueHead(in_dim, list(hidden), False, critic_state_dim, activation) if critic else None

    def features(self, obs: dict) -> torch.Tensor:
        x = self.state_and_image(obs)
        if self.inputs == "obs+base":
            x = torch.cat([x, obs["base_action"].float()], -1)
        return x

    def compose(self, obs: dict, u: torch.Tensor) -> torch.Tensor:
        """The executed action for pre-squash residual u."""
        return (obs["base_action"].float() + self.scale * torch.tanh(u)).clamp(-1, 1)

    def act(self, obs: dict, deterministic: bool = False) -> Act:
        x = self.features(obs)
        dist = self.distribution(x)
        u = dist.mean if deterministic else dist.sample()
        value = self.critic(x, obs) if self.critic is not None else None
        return Act(self.compose(obs, u), squashed_log_prob(dist, u), value, {"residual_u": u})

    def evaluate(self, obs: dict, act: Act) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.features(obs)
        dist = self.distribution(x)
        return squashed_log_prob(dist, act.extras["residual_u"]), dist.entropy().sum(-1), self.critic(x, obs)

    def value(self, obs: dict) -> torch.Tensor:
        return self.critic(self.features(obs), obs)

    def sample(self, obs: dict, features: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A reparameterized action, its log-prob and the features it was drawn from (SAC's actor loss);
        `features`: this obs's, where the caller has them."""
        x = self.features(obs) if features is None else features
        dist = self.distribution(x)
        u = dist.rsample()
        return self.compose(obs, u), squashed_log_prob(dist, u), x

    def bc_regularizer(self, obs: dict, act: Act) -> torch.Tensor:
        """Penalty on the residual's magnitude, mean tanh(μ)²: PPO's `bc_coef` pulls toward the base."""
        return torch.tanh(self.distribution(self.features(obs)).mean).square().sum(-1).mean()
