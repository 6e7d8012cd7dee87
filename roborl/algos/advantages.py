"""Advantage and return estimators: GAE for critics, group-relative advantages for GRPO's critic-free
groups (episodes from one initial state), and the time-out bootstrap. Pure functions of T×N tensors."""
from __future__ import annotations

import torch


def bootstrap_timeouts(reward: torch.Tensor, truncated: torch.Tensor, final_value: torch.Tensor,
                       gamma: float) -> torch.Tensor:
    """A time-out is not an end of the task: add γ·V(final_obs) to the reward of truncated envs, so that
    GAE can cut the chain at every done without biasing values toward zero."""
    return reward + gamma * final_value * truncated.float()


def gae(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, last_value: torch.Tensor,
        gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over T×N tensors.

    `dones[t]` marks that the episode ended after step t (terminated or truncated); time-outs are
    bootstrapped beforehand by adding γ·V(final_obs) to their reward, so the chain is cut at every done.
    Returns (advantages, returns).
    """
    T = rewards.shape[0]
    adv = torch.zeros_like(rewards)
    last = torch.zeros_like(last_value)
    for t in reversed(range(T)):
        next_value = last_value if t == T - 1 else values[t + 1]
        not_done = 1.0 - dones[t].float()
        delta = rewards[t] + gamma * next_value * not_done - values[t]
        last = delta + gamma * lam * not_done * last
        adv[t] = last
    return adv, adv + values


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
