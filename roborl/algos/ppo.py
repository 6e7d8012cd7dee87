"""PPO (clipped surrogate, clipped value loss, advantage normalization, KL early stop / adaptive lr).

Sees only `log_prob`, `entropy` and `value` from `policy.evaluate`, so one PPO serves every policy kind.
`log_prob` is N for most policies; a policy may return N×S (DPPO: one column per fine-tuned denoising
step; FPO: one per (τ, ε) pair). Each column then gets its own ratio and clip, with the policy's
optional per-column clip ranges (`ratio_clip`) and advantage weights (`advantage_weights`).
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
        params = [p for p in policy.parameters() if p.requires_grad]
        if cfg.critic_lr is not None:
            critic = {id(p) for p in policy.critic.parameters()}
            groups = [{"params": [p for p in params if id(p) not in critic], "lr": cfg.lr},
                      {"params": [p for p in params if id(p) in critic], "lr": cfg.critic_lr}]
            self.optimizer = torch.optim.Adam(groups, lr=cfg.lr, eps=1e-5)
        else:
            self.optimizer = torch.optim.Adam(params, lr=cfg.lr, eps=1e-5)
        self.params = params
        self.lagrange = 0.0  # λ of PPO-Lagrangian, set by the trainer

    def column_terms(self, log_ratio: torch.Tensor, adv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | float]:
        """Advantages and clip ranges shaped like `log_ratio` (B or B×S)."""
        clip: torch.Tensor | float = self.cfg.clip
        if log_ratio.dim() == 1:
            return adv, clip
        ratio_clip = getattr(self.policy, "ratio_clip", None)
        if ratio_clip is not None:
            clip = ratio_clip(self.cfg.clip)
            clip = clip.to(log_ratio.device) if isinstance(clip, torch.Tensor) else clip
        weights = getattr(self.policy, "advantage_weights", lambda: None)()
        adv = adv[:, None].expand_as(log_ratio)
        return (adv * weights.to(adv.device) if weights is not None else adv), clip

    def update(self, buffer: RolloutBuffer, generator: torch.Generator | None = None,
               train_actor: bool = True) -> dict[str, float]:
        """One PPO update on the buffer. `train_actor=False` fits only the critic (critic warm-up)."""
        cfg = self.cfg
        data = buffer.flat()
        n = data["advantages"].shape[0]
        mb_size = max(1, n // cfg.minibatches)
        stats: dict[str, list[float]] = {k: [] for k in
                                         ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac")}
        if cfg.bc_coef > 0:
            stats["bc_loss"] = []
        stop = False
        for _ in range(cfg.epochs):
            perm = torch.randperm(n, generator=generator).to(data["advantages"].device)
            for start in range(0, n - mb_size + 1, mb_size):
                idx = perm[start:start + mb_size]
                obs = {k: v[idx] for k, v in data["obs"].items()}
                act = Act(data["actions"][idx], data["log_probs"][idx],
                          extras={k: v[idx] for k, v in data["extras"].items()})
                log_prob, entropy, value = self.policy.evaluate(obs, act)
                log_ratio = log_prob - data["log_probs"][idx]
                ratio = log_ratio.exp()
                adv = data["advantages"][idx]
                if cfg.norm_adv:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                if "cost_advantages" in data:  # PPO-Lagrangian: maximize A_r − λ·A_c, scaled by 1/(1 + λ)
                    cost_adv = data["cost_advantages"][idx]
                    cost_adv = cost_adv - cost_adv.mean()
                    adv = (adv - self.lagrange * cost_adv) / (1 + self.lagrange)
                adv, clip = self.column_terms(log_ratio, adv)
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - log_ratio).mean()
                    clip_frac = ((ratio - 1).abs() > clip).float().mean()
                policy_loss = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - clip, 1 + clip)).mean()
                ret, old_v = data["returns"][idx], data["values"][idx]
                if cfg.clip_value_loss:
                    vclip = cfg.clip if cfg.value_clip is None else cfg.value_clip
                    v_clipped = old_v + (value - old_v).clamp(-vclip, vclip)
                    value_loss = 0.5 * torch.max((value - ret).square(), (v_clipped - ret).square()).mean()
                else:
                    value_loss = 0.5 * (value - ret).square().mean()
                loss = cfg.vf_coef * value_loss
                if "cost_returns" in data:
                    cost_value_loss = 0.5 * (self.policy.cost_value(obs) - data["cost_returns"][idx]).square().mean()
                    loss = loss + cfg.vf_coef * cost_value_loss
                    stats.setdefault("cost_value_loss", []).append(cost_value_loss.item())
                if train_actor:
                    loss = loss + policy_loss - cfg.ent_coef * entropy.mean()
                    if cfg.bc_coef > 0:
                        bc = self.policy.bc_regularizer(obs, act)
                        loss = loss + cfg.bc_coef * bc
                        stats["bc_loss"].append(bc.item())
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
                self.optimizer.step()
                for k, v in (("policy_loss", policy_loss), ("value_loss", value_loss), ("entropy", entropy.mean()),
                             ("approx_kl", approx_kl), ("clip_frac", clip_frac)):
                    stats[k].append(v.item())
                if cfg.adaptive_lr and train_actor:
                    self._adapt_lr(float(approx_kl))
                if train_actor and cfg.target_kl is not None and approx_kl > cfg.target_kl:
                    stop = True
                    break
            if stop:
                break
        out = {k: sum(v) / max(len(v), 1) for k, v in stats.items()}
        out["lr"] = self.lr
        if "cost_advantages" in data:
            out["lagrange_multiplier"] = self.lagrange
        out["explained_variance"] = float(1 - (data["returns"] - data["values"]).var() / (data["returns"].var() + 1e-8))
        return out

    def _adapt_lr(self, kl: float) -> None:
        if kl > 2 * self.cfg.desired_kl:
            self.lr = max(1e-5, self.lr / 1.5)
        elif kl < self.cfg.desired_kl / 2:
            self.lr = min(1e-2, self.lr * 1.5)
        self.set_lr(self.lr)

    def set_lr(self, lr: float) -> None:
        """The policy's learning rate (the first parameter group; the critic's own `critic_lr` stays)."""
        self.lr = lr
        self.optimizer.param_groups[0]["lr"] = lr
