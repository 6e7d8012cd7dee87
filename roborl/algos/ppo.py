"""PPO (clipped surrogate, clipped value loss, advantage normalization, KL early stop / adaptive lr).

Sees only `log_prob`, `entropy` and `value` from `policy.evaluate`, so one PPO serves every policy kind.
"""
from __future__ import annotations

import torch
from torch import nn

from policies.act import Act
from roborl.buffer import RolloutBuffer
from roborl.config import PPOConfig


class PPO:
    def __init__(self, policy: nn.Module, cfg: PPOConfig) -> None:
        self.policy = policy
        self.cfg = cfg
        self.lr = cfg.lr
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr, eps=1e-5)

    def update(self, buffer: RolloutBuffer, generator: torch.Generator | None = None) -> dict[str, float]:
        cfg = self.cfg
        data = buffer.flat()
        n = data["advantages"].shape[0]
        mb_size = max(1, n // cfg.minibatches)
        stats: dict[str, list[float]] = {k: [] for k in
                                         ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac")}
        stop = False
        for _ in range(cfg.epochs):
            perm = torch.randperm(n, generator=generator).to(data["advantages"].device)
            for start in range(0, n - mb_size + 1, mb_size):
                idx = perm[start:start + mb_size]
                obs = {k: v[idx] for k, v in data["obs"].items()}
                act = Act(data["actions"][idx], data["log_probs"][idx])
                log_prob, entropy, value = self.policy.evaluate(obs, act)
                log_ratio = log_prob - data["log_probs"][idx]
                ratio = log_ratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - log_ratio).mean()
                    clip_frac = ((ratio - 1).abs() > cfg.clip).float().mean()
                adv = data["advantages"][idx]
                if cfg.norm_adv:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip, 1 + cfg.clip)).mean()
                ret, old_v = data["returns"][idx], data["values"][idx]
                if cfg.clip_value_loss:
                    v_clipped = old_v + (value - old_v).clamp(-cfg.clip, cfg.clip)
                    value_loss = 0.5 * torch.max((value - ret).square(), (v_clipped - ret).square()).mean()
                else:
                    value_loss = 0.5 * (value - ret).square().mean()
                loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy.mean()
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                for k, v in (("policy_loss", policy_loss), ("value_loss", value_loss), ("entropy", entropy.mean()),
                             ("approx_kl", approx_kl), ("clip_frac", clip_frac)):
                    stats[k].append(v.item())
                if cfg.adaptive_lr:
                    self._adapt_lr(float(approx_kl))
                if cfg.target_kl is not None and approx_kl > cfg.target_kl:
                    stop = True
                    break
            if stop:
                break
        out = {k: sum(v) / max(len(v), 1) for k, v in stats.items()}
        out["lr"] = self.lr
        out["explained_variance"] = float(1 - (data["returns"] - data["values"]).var() / (data["returns"].var() + 1e-8))
        return out

    def _adapt_lr(self, kl: float) -> None:
        if kl > 2 * self.cfg.desired_kl:
            self.lr = max(1e-5, self.lr / 1.5)
        elif kl < self.cfg.desired_kl / 2:
            self.lr = min(1e-2, self.lr * 1.5)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
