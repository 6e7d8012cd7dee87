"""Gaussian MLP actor-critic (optionally with a CNN for `rgb`), with running observation normalization.

For SAC (`sac=True`) the actor is SAC's own: a state-dependent std and tanh-squashed actions (the executed
action is tanh(u), its log-prob includes the tanh Jacobian; deterministic: tanh(mean)), with `sample` for the
reparameterized actor loss and `features` as the input the critics share. There is no value head then."""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributions import Normal

from roborl.policies.act import Act
from roborl.policies.activations import ACTIVATIONS
from roborl.policies.base import Policy
from roborl.policies.cnn import CNNEncoder
from roborl.policies.multi_agent import PerAgentActor
from roborl.policies.normalizer import RunningNormalizer
from roborl.policies.per_machine import PerMachineActor

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


def normal_head(out: torch.Tensor, log_std: torch.Tensor | None) -> Normal:
    """The Gaussian an actor's output parameterizes: its mean and a learned state-independent `log_std`, or
    (None) its mean and a state-dependent log-std as the output's second half; the log-std clamped."""
    mean, log_std = out.chunk(2, -1) if log_std is None else (out, log_std.expand_as(out))
    return Normal(mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp())


def squashed_log_prob(dist: Normal, u: torch.Tensor) -> torch.Tensor:
    """log-density of tanh(u): the Gaussian's minus log|d tanh/du| (numerically stable form)."""
    log_det = 2 * (math.log(2) - u - nn.functional.softplus(-2 * u))
    return (dist.log_prob(u) - log_det).sum(-1)


def mlp(sizes: list[int], activation: str, out_gain: float, layer_norm: bool = False) -> nn.Sequential:
    """Linear layers with `activation` between them (and LayerNorm before it, with `layer_norm`)."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        linear = nn.Linear(sizes[i], sizes[i + 1])
        last = i == len(sizes) - 2
        nn.init.orthogonal_(linear.weight, out_gain if last else math.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers.append(linear)
        if not last:
            layers += [nn.LayerNorm(sizes[i + 1])] if layer_norm else []
            layers.append(ACTIVATIONS[activation]())
    return nn.Sequential(*layers)


class GaussianOnStateAndImage:
    """What a Gaussian actor on the env's `state` (running-normalized) and its own CNN's features of `rgb` does
    with them; the policy sets `normalizer`, `encoder` (each may be None) and `log_std` (None: state-dependent)."""

    normalizer: RunningNormalizer | None
    encoder: CNNEncoder | None
    log_std: nn.Parameter | None

    def state_and_image(self, obs: dict) -> torch.Tensor:
        x = obs["state"].float()
        if self.normalizer is not None:
            x = self.normalizer(x)
        if self.encoder is not None:
            x = torch.cat([x, self.encoder(obs["rgb"])], -1)
        return x

    def update_normalizer(self, obs: dict) -> None:
        if self.normalizer is not None:
            self.normalizer.update(obs["state"])

    def distribution(self, x: torch.Tensor) -> Normal:
        return normal_head(self.actor(x), self.log_std)


class GaussianActorCritic(GaussianOnStateAndImage, Policy):
    """Diagonal Gaussian over actions with a state-independent learned log-std; separate critic."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: list[int] = (256, 256), activation: str = "tanh",
                 init_log_std: float = -0.5, normalize_obs: bool = True,
                 image_shape: tuple[int, int] | None = None, image_features: int = 256, cost_critic: bool = False,
                 sac: bool = False, agents: dict[str, tuple[tuple[int, ...], int]] | None = None,
                 option_machines: list[int] | None = None) -> None:
        """`agents` (name -> state columns, action dims): one actor per agent on its own columns, the critic on
        the whole state (MAPPO; policies/multi_agent.py). `option_machines`: the machine of each of the last
        columns of `state` (an option's one-hot): one actor per machine (policies/per_machine.py)."""
        super().__init__()
        self.sac, self.action_dim = sac, action_dim
        self.normalizer = RunningNormalizer(obs_dim) if normalize_obs else None
        self.encoder = CNNEncoder(*image_shape, image_features) if image_shape else None
        in_dim = obs_dim + (image_features if image_shape else 0)
        # with per-machine actors: option one-hot (raw) → machine one-hot, appended to the features as their gate
        self.register_buffer("option_machine", nn.functional.one_hot(torch.tensor(option_machines)).float()
                             if option_machines else None)
        self.feature_dim = in_dim + (self.option_machine.shape[1] if option_machines else 0)
        out = action_dim * (2 if sac else 1)
        if agents:
            if sac or image_shape:
                raise ValueError("policy.actors per_agent: per-agent actors are PPO's on state observations (no SAC, "
                                 "no images)")
            self.actor = PerAgentActor(agents, lambda inputs, out: mlp([inputs, *hidden, out], activation, 0.01))
        elif option_machines:
            self.actor = PerMachineActor(self.option_machine.shape[1], lambda: mlp([in_dim, *hidden, out], activation, 0.01))
        else:
            self.actor = mlp([in_dim, *hidden, out], activation, 0.01)
        if sac:
            for net in self.actor.nets if option_machines else [self.actor]:
                nn.init.constant_(net[-1].bias[action_dim:], float(init_log_std))
        self.critic = None if sac else mlp([self.feature_dim, *hidden, 1], activation, 1.0)
        self.log_std = None if sac else nn.Parameter(torch.full((action_dim,), float(init_log_std)))
        # a second critic for the expected safety cost (PPO-Lagrangian)
        self.cost_critic = mlp([self.feature_dim, *hidden, 1], activation, 1.0) if cost_critic else None

    def features(self, obs: dict) -> torch.Tensor:
        x = self.state_and_image(obs)
        if self.option_machine is not None:
            options = self.option_machine.shape[0]
            x = torch.cat([x, obs["state"][:, -options:].float() @ self.option_machine], -1)
        return x

    def act(self, obs: dict, deterministic: bool = False) -> Act:
        x = self.features(obs)
        dist = self.distribution(x)
        if self.sac:
            u = dist.mean if deterministic else dist.sample()
            return Act(torch.tanh(u), squashed_log_prob(dist, u))
        action = dist.mean if deterministic else dist.sample()
        return Act(action, dist.log_prob(action).sum(-1), self.critic(x).squeeze(-1))

    def sample(self, obs: dict, features: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A reparameterized squashed action, its log-prob, and the features it was drawn from (SAC's critics
        read them: the image encoder runs once for both); `features`: this obs's, where the caller has them."""
        if not self.sac:
            raise NotImplementedError("this Gaussian policy was built for PPO; SAC builds its own (sac=True)")
        x = self.features(obs) if features is None else features
        dist = self.distribution(x)
        u = dist.rsample()
        return torch.tanh(u), squashed_log_prob(dist, u), x

    def evaluate(self, obs: dict, act: Act) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.features(obs)
        dist = self.distribution(x)
        return dist.log_prob(act.action).sum(-1), dist.entropy().sum(-1), self.critic(x).squeeze(-1)

    def value(self, obs: dict) -> torch.Tensor:
        return self.critic(self.features(obs)).squeeze(-1)

    def cost_value(self, obs: dict) -> torch.Tensor:
        return self.cost_critic(self.features(obs)).squeeze(-1)
