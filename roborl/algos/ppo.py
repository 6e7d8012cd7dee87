"""PPO (clipped surrogate, clipped value loss, advantage normalization, KL early stop / adaptive lr).

Sees only `log_prob`, `entropy` and `value` from `policy.evaluate`, so one PPO serves every policy kind.
`log_prob` is N for most policies; a policy may return N×S (DPPO: one column per fine-tuned denoising
step; FPO: one per (τ, ε) pair). Each column then gets its own ratio and clip, with the policy's
optional per-column clip ranges (`ratio_clip`) and advantage weights (`advantage_weights`). With
`algo.clip_high` the ratio is clipped to [1 − ε, 1 + ε_high] (DAPO's clip-higher: a good action's
probability may grow further per update than a bad one's may shrink); per-column ranges scale by ε_high/ε.

Rows collected by an older policy (asynchronous Ray rollouts) carry `behaviour_weights`: the ratio and
its clip are then taken against the learner's policy at the start of the update (the proximal policy),
and each row's term is weighted by π_prox/π_behaviour, truncated (decoupled PPO, Hilton et al. 2022).
"""
from __future__ import annotations

import torch
from torch import nn

from policies.act import Act
from roborl.buffer import RolloutBuffer
from roborl.compiling import maybe_compile
from roborl.config import PPOConfig
from roborl.errors import UserError


def take(data: dict, idx: torch.Tensor) -> dict:
    """The rows `idx` of every tensor in `data` (a `RolloutBuffer.flat()`, nested dicts included)."""
    return {k: take(v, idx) if isinstance(v, dict) else v[idx] for k, v in data.items()}


def clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, clip_low: float | torch.Tensor,
                      clip_high: float | torch.Tensor) -> torch.Tensor:
    """The per-row loss max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high)) (to minimize)."""
    return torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip_low, 1 + clip_high))


def clip_active(ratio: torch.Tensor, adv: torch.Tensor, clip_low: float | torch.Tensor,
                clip_high: float | torch.Tensor) -> torch.Tensor:
    """Rows whose gradient the clip removes: the ratio is past the bound the advantage pushes toward."""
    return ((ratio > 1 + clip_high) & (adv > 0)) | ((ratio < 1 - clip_low) & (adv < 0))


class PPO:
    def __init__(self, policy: nn.Module, cfg: PPOConfig, compile: bool = False) -> None:
        self.policy = policy
        self.cfg = cfg
        self.lr = cfg.lr
        params = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(self.param_groups(policy, params, cfg), lr=cfg.lr, eps=1e-5)
        self.params = params
        self.lagrange = 0.0  # λ of PPO-Lagrangian, set by the trainer
        self.loss_fn = maybe_compile(self.loss, compile)

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

    # ---- what learners share: roborl/distributed.py overrides these four for several processes ----
    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """The mean of `x` over the whole minibatch."""
        return x.mean()

    def normalize_advantages(self, adv: torch.Tensor) -> torch.Tensor:
        return (adv - adv.mean()) / (adv.std() + 1e-8)

    def reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """`x` summed (op "sum") or maxed ("max") over the learners: `x` itself in one process."""
        return x

    def normalize_advantages_by_task(self, adv: torch.Tensor, task: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each task's advantages standardized over its own rows of the rollout (every learner's), and each
        task's std before (NaN for a task id with no rows), for the logs.

        In a multi-task batch the tasks' advantage scales differ (a lift's shaped return varies several
        times more than a push's), and one batch-wide std lets the widest task take most of the gradient;
        GRPO's per-group std does not, and this gives PPO the same per-task scale."""
        k = int(self.reduce(task.max(), "max")) + 1
        onehot = nn.functional.one_hot(task.long(), k).to(adv.dtype)
        count, total, squares = self.reduce(torch.stack([onehot.sum(0), adv @ onehot, adv.square() @ onehot]))
        mean = total / count.clamp(min=1)
        std = ((squares - count * mean.square()) / (count - 1).clamp(min=1)).clamp(min=0).sqrt()
        return (adv - mean[task]) / (std[task] + 1e-8), torch.where(count > 0, std, torch.nan)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    # ---- the loss ------------------------------------------------------------------------------
    def minibatch_loss(self, mb: dict, train_actor: bool = True) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The PPO loss of a minibatch (rows of `buffer.flat()`, see `take`) and its terms, for the logs."""
        adv = mb["advantages"]
        if self.cfg.norm_adv and not self.cfg.norm_adv_by_task:  # by task: once per update, in `update`
            adv = self.normalize_advantages(adv)
        if "cost_advantages" in mb:  # PPO-Lagrangian: maximize A_r − λ·A_c, scaled by 1/(1 + λ)
            cost_adv = mb["cost_advantages"]
            cost_adv = cost_adv - self.mean(cost_adv)
            adv = (adv - self.lagrange * cost_adv) / (1 + self.lagrange)
        return self.loss_fn(mb, adv, train_actor)

    def loss(self, mb: dict, adv: torch.Tensor, train_actor: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """`minibatch_loss` once the advantages are final: it reads this process's rows alone, so that
        torch.compile can take it whole (forward and backward)."""
        cfg = self.cfg
        obs = mb["obs"]
        act = Act(mb["actions"], mb["log_probs"], extras=mb["extras"])
        log_prob, entropy, value = self.policy.evaluate(obs, act)
        log_ratio = log_prob - mb["log_probs"]
        ratio = log_ratio.exp()
        adv, clip = self.column_terms(log_ratio, adv)
        clip_high = clip if cfg.clip_high is None else clip * (cfg.clip_high / cfg.clip)
        with torch.no_grad():
            approx_kl = ((ratio - 1) - log_ratio).mean()
            clip_frac = ((ratio > 1 + clip_high) | (ratio < 1 - clip)).float().mean()
        policy_loss = clipped_surrogate(ratio, adv, clip, clip_high)
        if "behaviour_weights" in mb:  # rows from an older policy (asynchronous rollouts): decoupled PPO
            w = mb["behaviour_weights"]
            policy_loss = policy_loss * (w if policy_loss.dim() == 1 else w[:, None])
        policy_loss = policy_loss.mean()
        ret, old_v = mb["returns"], mb["values"]
        if cfg.clip_value_loss:
            vclip = cfg.clip if cfg.value_clip is None else cfg.value_clip
            v_clipped = old_v + (value - old_v).clamp(-vclip, vclip)
            value_loss = 0.5 * torch.max((value - ret).square(), (v_clipped - ret).square()).mean()
        else:
            value_loss = 0.5 * (value - ret).square().mean()
        terms = {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy.mean(),
                 "approx_kl": approx_kl, "clip_frac": clip_frac}
        loss = cfg.vf_coef * value_loss
        if "cost_returns" in mb:
            terms["cost_value_loss"] = 0.5 * (self.policy.cost_value(obs) - mb["cost_returns"]).square().mean()
            loss = loss + cfg.vf_coef * terms["cost_value_loss"]
        if train_actor:
            loss = loss + policy_loss - cfg.ent_coef * entropy.mean()
            if cfg.bc_coef > 0:
                terms["bc_loss"] = self.policy.bc_regularizer(obs, act)
                loss = loss + cfg.bc_coef * terms["bc_loss"]
        return loss, terms

    def update(self, buffer: RolloutBuffer, generator: torch.Generator | None = None,
               train_actor: bool = True) -> dict[str, float]:
        """One PPO update on the buffer. `train_actor=False` fits only the critic (critic warm-up)."""
        cfg = self.cfg
        data = buffer.flat()
        if cfg.norm_adv_by_task:
            if "task_id" not in data["obs"]:
                raise UserError("algo.norm_adv_by_task needs a multi-task env that gives obs['task_id'] "
                                "(e.g. mujoco/LangTabletop*, libero/*); set algo.norm_adv_by_task false")
            data["advantages"], task_std = self.normalize_advantages_by_task(data["advantages"], data["obs"]["task_id"])
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
                loss, terms = self.minibatch_loss(take(data, perm[start:start + mb_size]), train_actor)
                self.optimizer.zero_grad(set_to_none=True)
                self.backward(loss)
                nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
                self.optimizer.step()
                terms["approx_kl"] = approx_kl = self.mean(terms["approx_kl"])  # all learners stop together
                for k, v in terms.items():
                    stats.setdefault(k, []).append(v.item())
                if cfg.adaptive_lr and train_actor:
                    self._adapt_lr(float(approx_kl))
                if train_actor and cfg.target_kl is not None and approx_kl > cfg.target_kl:
                    stop = True
                    break
            if stop:
                break
        out = {k: sum(v) / max(len(v), 1) for k, v in stats.items()}
        out["minibatches"] = len(stats["policy_loss"])  # of epochs × minibatches: fewer once target_kl stops it
        out["lr"] = self.lr
        if cfg.norm_adv_by_task:
            out.update({f"adv_std/task{k}": float(v) for k, v in enumerate(task_std) if not v.isnan()})
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

    @staticmethod
    def param_groups(policy: nn.Module, params: list[nn.Parameter], cfg: PPOConfig) -> list[dict]:
        """The actor's parameters at `lr` (first), a VLA backbone's at `backbone_lr` (keeping its ratio
        to `lr`, `lr_scale`, when the lr is annealed or adapted), the critic's at a fixed `critic_lr`."""
        backbone: set[int] = set()
        if cfg.backbone_lr is not None:
            backbone = {id(p) for p in getattr(policy, "backbone", nn.Module()).parameters() if p.requires_grad}
            if not backbone:
                raise UserError("algo.backbone_lr needs a VLA policy whose backbone trains: set "
                                "policy.vla.finetune full or lora (or leave algo.backbone_lr unset)")
        critic = {id(p) for p in policy.critic.parameters()} - backbone if cfg.critic_lr is not None else set()
        groups = [{"params": [p for p in params if id(p) not in backbone | critic], "lr": cfg.lr},
                  {"params": [p for p in params if id(p) in backbone], "lr": cfg.backbone_lr,
                   "lr_scale": (cfg.backbone_lr or 0.0) / cfg.lr},
                  {"params": [p for p in params if id(p) in critic], "lr": cfg.critic_lr}]
        return [g for g in groups if g["params"]]

    def set_lr(self, lr: float) -> None:
        """The policy's learning rate (the first group); a backbone's follows at its ratio, the critic's stays."""
        self.lr = lr
        self.optimizer.param_groups[0]["lr"] = lr
        for group in self.optimizer.param_groups[1:]:
            if "lr_scale" in group:
                group["lr"] = lr * group["lr_scale"]
