"""GRPO: PPO's clipped surrogate with group-relative advantages instead of a critic.

G episodes start from one initial state (a group); each gets one outcome reward R_i, and every step of
episode i the advantage A_i = (R_i − mean_group) / (std_group + eps) (Shao et al. 2024; std with
Bessel's correction, as TRL computes it), or A_i = R_i − mean_group without the std (Dr.GRPO, Liu et al.
2025). With reward `return_to_go`, step t of episode i gets its return from t on, compared with the
group's at the same step (`group_advantages_to_go`). DAPO's additions (Yu et al. 2025): groups whose
rewards all agree carry no signal and are dropped (dynamic sampling); the ratio is clipped asymmetrically
to [1 − ε_low, 1 + ε_high] with ε_high > ε_low (clip-higher, against entropy collapse); the loss is
averaged over steps ("token_mean"), not first within each episode ("seq_mean_token_mean", the original
GRPO).

The update is PPO's (epochs, minibatches, gradient clipping, KL early stop: roborl/algos/ppo.py); only
the loss differs. Batches carry per-row `weights` for the loss aggregation and may carry
`instruction_ids` into a vocabulary, so that language instructions survive minibatching.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from policies.act import Act
from roborl.algos.ppo import PPO, clip_active, clipped_surrogate
from roborl.config import GRPOConfig, PPOConfig

if TYPE_CHECKING:
    from roborl.grpo import EpisodeBatch


def center_in_groups(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """`x` (T×N, groups of `group_size` consecutive columns) less its group's mean at each step."""
    g = x.view(len(x), -1, group_size)
    return (g - g.mean(dim=2, keepdim=True)).reshape(x.shape)


def group_advantages(rewards: torch.Tensor, group_size: int, std_normalize: bool = True,
                     eps: float = 1e-6) -> torch.Tensor:
    """Per-episode advantages from per-episode rewards (N, groups of `group_size` consecutive rows)."""
    r = rewards.float().view(-1, group_size)
    adv = r - r.mean(dim=1, keepdim=True)
    if std_normalize:
        adv = adv / (r.std(dim=1, keepdim=True) + eps)
    return adv.flatten()


def group_advantages_to_go(rewards: torch.Tensor, group_size: int, std_normalize: bool = True,
                           eps: float = 1e-6) -> torch.Tensor:
    """Per-step advantages (T×N) from per-step rewards (T×N, zero after an episode's end): the return from
    step t on, less its group's mean at the same step, over the std of the group's episode returns.

    An action cannot change the rewards before it (REINFORCE's causality), so leaving them out of its
    advantage removes their noise; the episode-return std keeps GRPO's scale, where a per-step std would
    blow up the late steps, whose returns-to-go barely differ.
    """
    to_go = rewards.float().flip(0).cumsum(0).flip(0)
    adv = center_in_groups(to_go, group_size)
    if std_normalize:
        episode_std = to_go[0].view(-1, group_size).std(dim=1).repeat_interleave(group_size)  # per env
        adv = adv / (episode_std + eps)
    return adv


def informative_groups(rewards: torch.Tensor, group_size: int, tol: float = 1e-8) -> torch.Tensor:
    """Which groups have rewards that differ (bool, one per group): the others give zero advantages."""
    r = rewards.float().view(-1, group_size)
    return (r.max(dim=1).values - r.min(dim=1).values) > tol


class GRPO(PPO):
    """PPO's optimizer and update loop with the GRPO loss (no value loss: the critic, if any, stays idle)."""

    def __init__(self, policy: nn.Module, cfg: PPOConfig, grpo: GRPOConfig, compile: bool = False) -> None:
        super().__init__(policy, cfg, compile=compile)
        self.grpo = grpo
        self.vocab: list[str] = []

    def minibatch_loss(self, mb: dict, train_actor: bool = True) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self.loss_fn(mb, mb["advantages"], train_actor)  # already normalized within their groups

    def loss(self, mb: dict, adv: torch.Tensor, train_actor: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        g = self.grpo
        obs = dict(mb["obs"])
        if "instruction_ids" in obs:
            obs["instruction"] = [self.vocab[i] for i in obs.pop("instruction_ids").tolist()]
        act = Act(mb["actions"], mb["log_probs"], extras=mb["extras"])
        log_prob, entropy, _ = self.policy.evaluate(obs, act)
        log_ratio = log_prob - mb["log_probs"]
        ratio = log_ratio.exp()
        weights = mb["weights"]
        if log_ratio.dim() > 1:  # one column per denoising step / flow sample: each clipped on its own
            adv, weights = adv[:, None].expand_as(log_ratio), weights[:, None].expand_as(log_ratio)
        with torch.no_grad():
            approx_kl = ((ratio - 1) - log_ratio).mean()
            clip_frac = clip_active(ratio, adv, g.clip_low, g.clip_high).float().mean()
        per_row = clipped_surrogate(ratio, adv, g.clip_low, g.clip_high)
        policy_loss = (per_row * weights).sum() / weights.sum().clamp(min=1e-8)
        loss = policy_loss - self.cfg.ent_coef * entropy.mean()  # no critic: nothing to warm up without the actor
        return loss, {"policy_loss": policy_loss, "entropy": entropy.mean(), "approx_kl": approx_kl,
                      "clip_frac": clip_frac}

    def update(self, buffer: EpisodeBatch, generator: torch.Generator | None = None,
               train_actor: bool = True) -> dict[str, float]:
        """PPO's update over `buffer.flat()` (the kept episodes' steps), without critic statistics."""
        self.vocab = getattr(buffer, "vocab", [])
        out = super().update(buffer, generator, train_actor)
        for key in ("value_loss", "explained_variance"):
            out.pop(key, None)
        return out
