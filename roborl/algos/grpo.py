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

As an algorithm (roborl/algos/base.py) GRPO collects rounds of whole episodes: each round resets all envs
with groups of `grpo.group_size` consecutive envs sharing one initial state (task, instruction and object
poses), runs every env until its first episode ends and keeps the steps of that episode. Instructions are
stored as ids into a vocabulary so that language-conditioned policies see them again in the update.
"""
from __future__ import annotations

import time

import torch
from torch import nn

from roborl.algos.advantages import group_advantages, group_advantages_to_go, informative_groups
from roborl.algos.base import Comm
from roborl.algos.groups import start_groups_alike
from roborl.algos.ppo import PPO, clip_active, clipped_surrogate
from roborl.collect import EpisodeLog, Step, run_steps
from roborl.config import Config, GRPOConfig, PPOConfig
from roborl.policies.act import Act
from roborl.sim import VecEnv
from roborl.sim.batch import concat, stack, take, to_device

OUTCOMES = {"success": "success_once", "success_at_end": "success_at_end", "return": "return",
            "return_to_go": "return"}  # groups are kept, and logged, by their episode returns

class Episodes:
    """One round: per-step tensors (T×N), which steps belong to each env's first episode (`valid`), per env
    the episode's return, success and length, and the per-step rewards of the first episodes (T×N)."""

    def __init__(self, steps: list[dict], valid: torch.Tensor, vocab: list[str], outcome: dict[str, torch.Tensor],
                 rewards: torch.Tensor):
        self.steps, self.valid, self.vocab, self.outcome, self.rewards = steps, valid, vocab, outcome, rewards


def collect_episodes(env: VecEnv, act_fn, obs: dict, vocab: list[str], max_decisions: int) -> Episodes:
    """Runs all envs from `obs` (just reset) until each has ended one episode (or `max_decisions` passed)."""
    n = env.num_envs
    alive = torch.ones(n, dtype=torch.bool)
    outcome = {"return": torch.zeros(n), "success_once": torch.zeros(n), "success_at_end": torch.zeros(n),
               "length": torch.zeros(n)}
    index = {s: i for i, s in enumerate(vocab)}
    steps, valid, rewards = [], [], []

    def record(step: Step) -> bool:
        act, info = step.act, step.info
        step_obs = {k: v for k, v in step.obs.items() if isinstance(v, torch.Tensor)}
        if "instruction" in step.obs:
            ids = [index.setdefault(s, len(index)) for s in step.obs["instruction"]]
            step_obs["instruction_ids"] = torch.tensor(ids, device=act.action.device)
        steps.append({"obs": step_obs, "actions": act.action, "log_probs": act.log_prob, "extras": act.extras})
        valid.append(alive.clone())
        rewards.append(step.reward.cpu() * alive)
        outcome["return"] += rewards[-1]
        done = info["done"].cpu() & alive
        if done.any():
            ep = info["episode"]
            for key in ("success_once", "success_at_end", "length"):
                outcome[key][done] = ep[key].cpu()[done].float()
        alive.logical_and_(~done)
        return not alive.any()

    run_steps(env, obs, act_fn, record, max_decisions)
    vocab[:] = sorted(index, key=index.get)
    return Episodes(steps, torch.stack(valid), vocab, outcome, torch.stack(rewards))


class EpisodeBatch:
    """The rows GRPO trains on, in the shape `PPO.update` reads (`flat()`); `vocab` names instruction ids."""

    def __init__(self, data: dict, vocab: list[str]) -> None:
        self.data, self.vocab = data, vocab

    def flat(self) -> dict:
        return self.data


class GRPO(PPO):
    """PPO's optimizer and update loop with the GRPO loss (no value loss: the critic, if any, stays idle)."""
    name = "grpo"

    def __init__(self, policy: nn.Module, cfg: PPOConfig, grpo: GRPOConfig, compile: bool = False,
                 comm: Comm | None = None) -> None:
        super().__init__(policy, cfg, compile=compile, comm=comm)
        self.grpo = grpo
        self.vocab: list[str] = []  # instructions seen so far; batches refer to them by index
        self.batch: EpisodeBatch | None = None
        self.collect_stats: dict[str, float] = {}

    @classmethod
    def from_config(cls, cfg: Config, policy: nn.Module, env: VecEnv, device: torch.device,
                    comm: Comm | None = None) -> GRPO:
        start_groups_alike(cfg, env, cfg.grpo.group_size, "grpo.group_size")
        algo = cls(policy, cfg.algo, cfg.grpo, compile=cfg.resources.compile, comm=comm)
        algo.configure_rollouts(cfg, device)
        return algo

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

    def update(self, buffer: EpisodeBatch | None = None, generator: torch.Generator | None = None,
               train_actor: bool | None = None) -> dict[str, float]:
        """PPO's update over `buffer.flat()` (default: the batch `collect` kept), without critic statistics."""
        if buffer is None:
            stats = dict(self.collect_stats)
            stats["skipped_update"] = float(self.batch is None)
            if self.batch is not None:
                stats.update(self.update(self.batch, self.generator))
                self.policy.update_normalizer(self.batch.data["obs"])
            return stats
        self.vocab = buffer.vocab
        out = super().update(buffer, generator, True)
        for key in ("value_loss", "explained_variance"):
            out.pop(key, None)
        return out

    # ---- the rollout side ------------------------------------------------------------------------
    def collect_round(self, env: VecEnv, index: int) -> Episodes:
        """Round `index` of this iteration, from group resets seeded by the run's seed, the iteration and
        the round (so a resumed run draws the starts it would have drawn)."""
        rounds = 1 + self.grpo.resample_rounds
        obs = env.reset(seed=self.run_cfg.train.seed * 1_000_003 + self.iteration * rounds + index)
        return collect_episodes(env, self.act, obs, self.vocab, self.run_cfg.train.rollout_steps)

    def collect(self, env: VecEnv, obs: dict, log: EpisodeLog) -> dict:
        """Rounds of group episodes until the batch holds `env.num_envs / grpo.group_size` groups with signal
        (dynamic sampling) or the rounds run out; the kept groups' steps with their advantages."""
        g = self.grpo
        groups_needed = env.num_envs // g.group_size
        parts, kept_groups, dropped, seen, rewards_seen = [], 0, 0, 0, []
        collect_start, decisions = time.time(), 0
        for round_ in range(1 + g.resample_rounds):
            eps = self.collect_round(env, round_)
            decisions += eps.valid.shape[0] * env.num_envs  # every env steps until all have ended
            reward = eps.outcome[OUTCOMES[g.reward]]
            rewards_seen.append(reward)
            out = eps.outcome
            for key, name in (("return", "return"), ("success", "success_at_end"), ("success_once", "success_once"),
                              ("length", "length")):
                log.extend(key, out[name].tolist())
            keep = informative_groups(reward, g.group_size) if g.dynamic_sampling else \
                torch.ones(len(reward) // g.group_size, dtype=torch.bool)
            seen += len(keep)
            dropped += int((~keep).sum())
            keep &= torch.cumsum(keep.long(), 0) <= groups_needed - kept_groups  # fill, do not overfill
            kept_groups += int(keep.sum())
            parts.append((eps, reward, keep))
            if not g.dynamic_sampling or kept_groups >= groups_needed:
                break
        self.env_steps = decisions * self.run_cfg.env.action_chunk
        self.collect_stats = {
            "groups": float(seen), "groups_dropped": float(dropped), "groups_dropped_frac": dropped / max(seen, 1),
            "groups_kept": float(kept_groups), "rounds": float(round_ + 1),
            "outcome_mean": float(torch.cat(rewards_seen).mean()),
            "collect_sps": self.env_steps / max(time.time() - collect_start, 1e-9)}
        self.batch = build_batch_for(g, parts, self.device, self.vocab)
        return obs

    def rollout_part(self, obs: dict) -> dict:
        """A Ray env worker's kept groups (steps, advantages, weights; instructions as ids into its vocabulary)
        and its round statistics, for the learner's `absorb`."""
        return {"batch": None if self.batch is None else self.batch.data, "vocab": list(self.vocab),
                "stats": self.collect_stats, "env_steps": self.env_steps, "last_obs": obs}

    def absorb(self, parts: list[dict], obs: dict, log: EpisodeLog, update_rows: int | None = None) -> None:
        """The workers' kept groups as one batch: instruction ids mapped into the learner's vocabulary, the
        group counts summed over the workers."""
        index = {s: i for i, s in enumerate(self.vocab)}
        chunks = []
        for part in parts:
            data = part["batch"]
            if data is None:
                continue
            if "instruction_ids" in data["obs"]:
                to_learner = torch.tensor([index.setdefault(s, len(index)) for s in part["vocab"]], dtype=torch.long)
                ids = data["obs"]["instruction_ids"]
                data["obs"]["instruction_ids"] = to_learner.to(ids.device)[ids]
            chunks.append(to_device(data, self.device))
        self.vocab[:] = sorted(index, key=index.get)
        self.batch = EpisodeBatch(concat(chunks), list(self.vocab)) if chunks else None
        stats = [p["stats"] for p in parts]
        summed = ("groups", "groups_dropped", "groups_kept")
        self.collect_stats = {k: sum(s[k] for s in stats) for k in summed}
        self.collect_stats.update(groups_dropped_frac=self.collect_stats["groups_dropped"] /
                                  max(self.collect_stats["groups"], 1),
                                  rounds=max(s["rounds"] for s in stats),
                                  outcome_mean=sum(s["outcome_mean"] for s in stats) / len(stats))
        self.env_steps = sum(p["env_steps"] for p in parts)


def build_batch_for(g: GRPOConfig, parts: list[tuple[Episodes, torch.Tensor, torch.Tensor]], device: torch.device,
                    vocab: list[str]) -> EpisodeBatch | None:
    """The kept groups' episode steps with their advantages and loss weights, from every round (`parts`:
    the round, its per-env outcome rewards, which groups to keep); None when no group is kept."""
    chunks = []
    for eps, reward, keep in parts:
        if not keep.any():
            continue
        T = eps.valid.shape[0]
        if g.reward == "return_to_go":
            adv = group_advantages_to_go(eps.rewards, g.group_size, g.std_normalize, g.eps)
        else:
            adv = group_advantages(reward, g.group_size, g.std_normalize, g.eps)[None].expand(T, -1)
        rows = eps.valid & keep.repeat_interleave(g.group_size)[None]
        data = take(stack(eps.steps), rows)
        length = eps.valid.sum(0).clamp(min=1).float()
        per_step = 1.0 / length if g.loss_agg == "seq_mean_token_mean" else torch.ones_like(length)
        data["advantages"] = adv[rows].to(device)
        data["weights"] = per_step[None].expand(T, -1)[rows].to(device)
        chunks.append(data)
    if not chunks:
        return None
    data = concat(chunks)
    zeros = torch.zeros_like(data["advantages"])
    data["values"], data["returns"] = zeros, zeros  # PPO.update's critic statistics (unused here)
    return EpisodeBatch(data, list(vocab))
