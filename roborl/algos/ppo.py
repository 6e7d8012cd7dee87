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

As an algorithm (roborl/algos/base.py) PPO collects `train.rollout_steps` steps into its RolloutBuffer,
bootstrapping time-outs with the critic that saw them, and computes GAE. Options: PPO-Lagrangian
(`algo.cost_limit`: a cost critic and a PID-controlled multiplier on the cost advantages) and group resets
(`algo.group_size` G > 1: each iteration is one episode from groups of G envs that start alike, and each
step's advantage is centred on its group's at that step, a same-state baseline beside the critic's).
"""
from __future__ import annotations

import torch
from torch import nn

from roborl.algos.advantages import bootstrap_timeouts, center_in_groups, gae
from roborl.algos.base import Algorithm, Comm
from roborl.algos.groups import start_groups_alike
from roborl.algos.lagrangian import PIDLagrangian
from roborl.buffer import RolloutBuffer
from roborl.collect import EpisodeLog, Step, run_steps
from roborl.compiling import maybe_compile
from roborl.config import Config, PPOConfig
from roborl.errors import UserError
from roborl.policies.act import Act
from roborl.policies.base import Policy
from roborl.sim import VecEnv
from roborl.sim.batch import take


def clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, clip_low: float | torch.Tensor,
                      clip_high: float | torch.Tensor) -> torch.Tensor:
    """The per-row loss max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high)) (to minimize)."""
    return torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip_low, 1 + clip_high))


def asymmetric_surrogate(ratio: torch.Tensor, adv: torch.Tensor, clip_low: float | torch.Tensor,
                         clip_high: float | torch.Tensor) -> torch.Tensor:
    """PPO's clipped loss where A > 0 and SPO's −(A·r − |A|·(r − 1)²/(2ε_low)) where A < 0 (FPO++'s
    asymmetric trust region). Clipping only stops the gradient once r < 1 − ε; SPO's penalty pulls r back
    there. That matters for FPO, whose r = exp(ℓ_old − ℓ_new) lowers by raising the flow-matching loss ℓ
    without bound: under clipping alone the loss of the policy on its own samples keeps climbing."""
    spo = -(adv * ratio - adv.abs() * (ratio - 1).square() / (2 * clip_low))
    return torch.where(adv > 0, clipped_surrogate(ratio, adv, clip_low, clip_high), spo)


SURROGATES = {"clip": clipped_surrogate, "asymmetric": asymmetric_surrogate}  # algo.surrogate


def clip_active(ratio: torch.Tensor, adv: torch.Tensor, clip_low: float | torch.Tensor,
                clip_high: float | torch.Tensor) -> torch.Tensor:
    """Rows whose gradient the clip removes: the ratio is past the bound the advantage pushes toward."""
    return ((ratio > 1 + clip_high) & (adv > 0)) | ((ratio < 1 - clip_low) & (adv < 0))


def correct_off_policy(policy: nn.Module, buffer: RolloutBuffer, is_clip: float) -> None:
    """Rows of older policies: log-probs and values of `policy` (the learner's) replace the behaviour
    policy's, and each row gets min(π_learner/π_behaviour, is_clip) as its `behaviour_weights`."""
    T, N = buffer.T, buffer.N
    flat = buffer.flat_inputs()
    log_prob, _, value = policy.evaluate(flat["obs"], Act(flat["actions"], flat["log_probs"], extras=flat["extras"]))
    log_prob = log_prob.reshape(buffer.log_probs.shape)
    joint = (log_prob - buffer.log_probs).reshape(T, N, -1).sum(-1)  # all of a row's columns: one action
    buffer.behaviour_weights = joint.exp().clamp(max=is_clip)
    buffer.log_probs = log_prob
    buffer.values = value.reshape(T, N)


class PPO(Algorithm):
    name = "ppo"

    def __init__(self, policy: nn.Module, cfg: PPOConfig, compile: bool = False, comm: Comm | None = None) -> None:
        """The learner alone (optimizer, loss, update); `from_config` adds the rollout side."""
        super().__init__(policy, comm)
        self.cfg = cfg
        self._lr = cfg.lr
        params = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(self.param_groups(policy, params, cfg), lr=cfg.lr, eps=1e-5)
        self.params = params
        self.lagrangian: PIDLagrangian | None = None
        self.lagrange = 0.0  # λ of PPO-Lagrangian
        self.loss_fn = maybe_compile(self.loss, compile)
        self.buffer: RolloutBuffer | None = None
        self.generator: torch.Generator | None = None
        self.train_actor = True

    @classmethod
    def from_config(cls, cfg: Config, policy: nn.Module, env: VecEnv, device: torch.device,
                    comm: Comm | None = None) -> PPO:
        """PPO as the run's algorithm: its rollouts of `train.rollout_steps` steps in `env`."""
        a = cfg.algo
        if a.group_size > 1:
            start_groups_alike(cfg, env, a.group_size, "algo.group_size")
        algo = cls(policy, a, compile=cfg.resources.compile, comm=comm)
        if a.cost_limit is not None:
            algo.lagrangian = PIDLagrangian(a.cost_limit, a.lagrange_ki, a.lagrange_kp, a.lagrange_kd)
        algo.configure_rollouts(cfg, device)
        return algo

    def configure_rollouts(self, cfg: Config, device: torch.device) -> None:
        self.run_cfg, self.device = cfg, device
        self.act = maybe_compile(self.policy.act, cfg.resources.compile,  # in rollouts only
                                 cuda_graphs=cfg.resources.cuda_graphs and device.type == "cuda")
        self.gae = maybe_compile(gae, cfg.resources.compile)
        self.iteration = 0

    @property
    def lr(self) -> float:
        return self._lr

    def column_terms(self, log_ratio: torch.Tensor, adv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | float]:
        """Advantages and clip ranges shaped like `log_ratio` (B or B×S)."""
        clip: torch.Tensor | float = self.cfg.clip
        if log_ratio.dim() == 1:
            return adv, clip
        clip = self.policy.ratio_clip(self.cfg.clip)
        clip = clip.to(log_ratio.device) if isinstance(clip, torch.Tensor) else clip
        weights = self.policy.advantage_weights()
        adv = adv[:, None].expand_as(log_ratio)
        return (adv * weights.to(adv.device) if weights is not None else adv), clip

    # ---- what learners share (self.comm: the identity in one process, roborl/learners.py for several) ----
    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """The mean of `x` over the whole minibatch."""
        return self.comm.mean(x)

    def normalize_advantages(self, adv: torch.Tensor) -> torch.Tensor:
        if self.comm.world == 1:
            return (adv - adv.mean()) / (adv.std() + 1e-8)
        mean = self.mean(adv)
        n = adv.numel() * self.comm.world
        std = (self.mean((adv - mean).square()) * n / (n - 1)).sqrt()  # unbiased, as Tensor.std
        return (adv - mean) / (std + 1e-8)

    def reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """`x` summed (op "sum") or maxed ("max") over the learners: `x` itself in one process."""
        return self.comm.reduce(x, op)

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
        self.comm.average_gradients(self.params)

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
        policy_loss = SURROGATES[cfg.surrogate](ratio, adv, clip, clip_high)
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

    def update(self, buffer: RolloutBuffer | None = None, generator: torch.Generator | None = None,
               train_actor: bool | None = None) -> dict[str, float]:
        """One PPO update on `buffer` (default: the rollout `collect` gathered, then the normalizer learns its
        observations). `train_actor=False` fits only the critic (critic warm-up)."""
        if buffer is None:
            stats = self.update(self.buffer, self.generator, self.train_actor)
            self.policy.update_normalizer(self.comm.gather_state(self.buffer.obs))
            return stats
        cfg = self.cfg
        train_actor = True if train_actor is None else train_actor
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
                if not loss.requires_grad:
                    raise UserError(f"the {self.name} loss reaches no trainable parameter of the policy ("
                                    f"{type(self.policy).__name__}: frozen where it acts?); let part of it train, "
                                    "e.g. policy.vla.finetune lora or full, or policy.vla.action_head decoder")
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
        out["lr"] = self._lr
        if cfg.norm_adv_by_task:
            out.update({f"adv_std/task{k}": float(v) for k, v in enumerate(task_std) if not v.isnan()})
        if "cost_advantages" in data:
            out["lagrange_multiplier"] = self.lagrange
        out["explained_variance"] = float(1 - (data["returns"] - data["values"]).var() / (data["returns"].var() + 1e-8))
        # the rollout's mean log-prob of its own actions: a sharpening or spreading policy shows here; for FPO it is
        # minus the flow-matching loss on its own samples, which climbs when the flow drifts from them
        out["log_prob"] = float(data["log_probs"].mean())
        return out

    def _adapt_lr(self, kl: float) -> None:
        if kl > 2 * self.cfg.desired_kl:
            self._lr = max(1e-5, self._lr / 1.5)
        elif kl < self.cfg.desired_kl / 2:
            self._lr = min(1e-2, self._lr * 1.5)
        self.set_lr(self._lr)

    @staticmethod
    def param_groups(policy: Policy, params: list[nn.Parameter], cfg: PPOConfig) -> list[dict]:
        """The actor's parameters at `lr` (first), a VLA backbone's at `backbone_lr` (keeping its ratio
        to `lr`, `lr_scale`, when the lr is annealed or adapted), the critic's at a fixed `critic_lr`."""
        backbone: set[int] = set()
        if cfg.backbone_lr is not None:
            backbone = {id(p) for p in policy.backbone_parameters()}
            if not backbone:
                raise UserError("algo.backbone_lr needs a VLA policy whose backbone trains: set "
                                "policy.vla.finetune full or lora (or leave algo.backbone_lr unset)")
        critic = {id(p) for p in policy.critic_parameters()} - backbone if cfg.critic_lr is not None else set()
        groups = [{"params": [p for p in params if id(p) not in backbone | critic], "lr": cfg.lr},
                  {"params": [p for p in params if id(p) in backbone], "lr": cfg.backbone_lr,
                   "lr_scale": (cfg.backbone_lr or 0.0) / cfg.lr},
                  {"params": [p for p in params if id(p) in critic], "lr": cfg.critic_lr}]
        return [g for g in groups if g["params"]]

    def set_lr(self, lr: float) -> None:
        """The policy's learning rate (the first group); a backbone's follows at its ratio, the critic's stays."""
        self._lr = lr
        self.optimizer.param_groups[0]["lr"] = lr
        for group in self.optimizer.param_groups[1:]:
            if "lr_scale" in group:
                group["lr"] = lr * group["lr_scale"]

    # ---- the rollout side ------------------------------------------------------------------------
    def start_iteration(self, iteration: int, total_iterations: int) -> None:
        self.iteration = iteration
        if self.generator is None:
            self.generator = torch.Generator().manual_seed(self.run_cfg.train.seed + iteration)
        if self.cfg.anneal_lr:
            self.set_lr(self.cfg.lr * (1 - iteration / total_iterations))
        self.train_actor = iteration >= self.cfg.critic_warmup

    def new_buffer(self, num_envs: int, device: torch.device) -> RolloutBuffer:
        return RolloutBuffer(self.run_cfg.train.rollout_steps, num_envs, device, self.gae)

    def collect(self, env: VecEnv, obs: dict, log: EpisodeLog) -> dict:
        """T steps from `obs` on, time-outs bootstrapped with γ·V(final_obs) while the critic that saw the
        episode is at hand, then GAE. With `algo.group_size` G > 1 the T steps are one episode from a
        group reset (seeded by the run's seed and the iteration, as GRPO's rounds)."""
        cfg, group = self.cfg, self.cfg.group_size
        if group > 1:
            obs = env.reset(seed=self.run_cfg.train.seed * 1_000_003 + self.iteration)
        if self.buffer is None:
            self.buffer = self.new_buffer(env.num_envs, self.device)
        buffer, safe = self.buffer, self.lagrangian is not None
        policy = self.policy

        def record(step: Step) -> None:
            reward, cost = step.reward, step.info.get("cost")
            if safe and cost is None:
                raise UserError("algo.cost_limit needs a task that publishes info['cost']; this env does not")
            if step.truncated.any():
                final_obs = step.info["final_obs"]
                reward = bootstrap_timeouts(reward, step.truncated, policy.value(final_obs), cfg.gamma)
                if safe:
                    cost = bootstrap_timeouts(cost, step.truncated, policy.cost_value(final_obs), cfg.gamma)
            done = step.done | step.info["option_end"] if "option_end" in step.info else step.done  # options end returns
            buffer.add(step.obs, step.act, reward, done, cost if safe else None,
                       policy.cost_value(step.obs) if safe else None)
            log.record(step.info)

        obs = run_steps(env, obs, self.act, record, buffer.T)
        with torch.no_grad():
            buffer.finish(policy.value(obs), cfg.gamma, cfg.gae_lambda, policy.cost_value(obs) if safe else None)
        if group > 1:
            buffer.advantages = center_in_groups(buffer.advantages, group)
        self.env_steps = buffer.T * buffer.N * self.run_cfg.env.action_chunk
        self.update_multiplier(log)
        return obs

    def rollout_part(self, obs: dict) -> dict:
        """What `collect` gathered, for a learner elsewhere (a Ray env worker's share, see `absorb`)."""
        b, safe = self.buffer, self.lagrangian is not None
        with torch.no_grad():
            last_value = self.policy.value(obs)
            last_cost_value = self.policy.cost_value(obs) if safe else None
        return {"obs": b.obs, "actions": b.actions, "log_probs": b.log_probs, "values": b.values,
                "extras": b.extras, "rewards": b.rewards, "dones": b.dones, "costs": b.costs,
                "cost_values": b.cost_values, "last_obs": obs, "last_value": last_value,
                "last_cost_value": last_cost_value}

    def absorb(self, parts: list[dict], obs: dict, log: EpisodeLog, update_rows: int | None = None) -> None:
        """The rollouts of Ray env workers (`rollout_part`s, concatenated along the envs) as this iteration's
        buffer. Parts marked `stale` were collected by an older policy: the rows are then corrected
        (`correct_off_policy`) and bootstrapped with the current critic."""
        cfg, safe = self.cfg, self.lagrangian is not None
        self.buffer = buffer = RolloutBuffer.concat_envs(parts, self.device, self.gae)
        with torch.no_grad():
            if any(p["stale"] for p in parts):
                correct_off_policy(self.policy, buffer, self.run_cfg.resources.is_clip)
                last_value = self.policy.value(obs)
                last_cost_value = self.policy.cost_value(obs) if safe else None
            else:
                last_value = torch.cat([p["last_value"] for p in parts]).to(self.device)
                last_cost_value = torch.cat([p["last_cost_value"] for p in parts]).to(self.device) if safe else None
            buffer.finish(last_value, cfg.gamma, cfg.gae_lambda, last_cost_value)
        self.env_steps = buffer.T * buffer.N * self.run_cfg.env.action_chunk
        self.update_multiplier(log)

    def update_multiplier(self, log: EpisodeLog) -> None:
        """PPO-Lagrangian: λ from this iteration's mean episode cost (over every learner's episodes)."""
        if self.lagrangian is None:
            return
        costs = log.values.get("cost", [])
        total, count = self.comm.reduce(torch.tensor([sum(costs), len(costs)], dtype=torch.float64)).tolist()
        if count:
            self.lagrange = self.lagrangian.update(total / count)

    def state_dict(self) -> dict:
        state = {"optimizer": self.optimizer.state_dict(), "lr": self._lr}
        if self.lagrangian is not None:
            state["lagrangian"] = self.lagrangian.state()
        return state

    def load_state_dict(self, state: dict) -> None:
        if state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.set_lr(state["lr"])
        if self.lagrangian is not None and "lagrangian" in state:
            self.lagrangian.load(state["lagrangian"])
            self.lagrange = self.lagrangian.value
