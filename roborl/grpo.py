"""GRPO training (`train.algorithm: grpo`): rounds of whole episodes from group resets, one outcome
reward per episode, group-relative advantages, dynamic sampling, then PPO's minibatch update with the
GRPO loss (roborl/algos/grpo.py).

Each round resets all envs with groups of `grpo.group_size` consecutive envs sharing one initial state
(task, instruction and object poses; `reset(options={"group_size": G})`), runs every env until its first
episode ends and keeps the steps of that episode. Instructions are stored as ids into a vocabulary so
that language-conditioned policies see them again in the update.
"""
from __future__ import annotations

import time

import torch

import sim
from roborl.algos.grpo import GRPO, group_advantages, group_advantages_to_go, informative_groups
from roborl.config import GRPOConfig
from roborl.trainer import Trainer, start_groups_alike

OUTCOMES = {"success": "success_once", "success_at_end": "success_at_end", "return": "return",
            "return_to_go": "return"}  # groups are kept, and logged, by their episode returns


class Episodes:
    """One round: per-step tensors (T×N), which steps belong to each env's first episode (`valid`), per env
    the episode's return, success and length, and the per-step rewards of the first episodes (T×N)."""

    def __init__(self, steps: list[dict], valid: torch.Tensor, vocab: list[str], outcome: dict[str, torch.Tensor],
                 rewards: torch.Tensor):
        self.steps, self.valid, self.vocab, self.outcome, self.rewards = steps, valid, vocab, outcome, rewards


@torch.no_grad()
def collect_episodes(env: sim.VecEnv, act_fn, obs: dict, vocab: list[str], max_decisions: int) -> Episodes:
    """Runs all envs from `obs` (just reset) until each has ended one episode (or `max_decisions` passed)."""
    n = env.num_envs
    alive = torch.ones(n, dtype=torch.bool)
    outcome = {"return": torch.zeros(n), "success_once": torch.zeros(n), "success_at_end": torch.zeros(n),
               "length": torch.zeros(n)}
    index = {s: i for i, s in enumerate(vocab)}
    steps, valid, rewards = [], [], []
    for _ in range(max_decisions):
        act = act_fn(obs)
        step_obs = {k: v for k, v in obs.items() if isinstance(v, torch.Tensor)}
        if "instruction" in obs:
            ids = [index.setdefault(s, len(index)) for s in obs["instruction"]]
            step_obs["instruction_ids"] = torch.tensor(ids, device=act.action.device)
        steps.append({"obs": step_obs, "actions": act.action, "log_probs": act.log_prob, "extras": act.extras})
        valid.append(alive.clone())
        obs, reward, _, _, info = env.step(act.action)
        rewards.append(reward.cpu() * alive)
        outcome["return"] += rewards[-1]
        done = info["done"].cpu() & alive
        if done.any():
            ep = info["episode"]
            for key in ("success_once", "success_at_end", "length"):
                outcome[key][done] = ep[key].cpu()[done].float()
        alive &= ~done
        if not alive.any():
            break
    vocab[:] = sorted(index, key=index.get)
    return Episodes(steps, torch.stack(valid), vocab, outcome, torch.stack(rewards))


def stack_rows(steps: list[dict], rows: torch.Tensor) -> dict:
    """The (t, env) rows where `rows` (T×N bool) holds, of every tensor in the per-step dicts."""
    def gather(values: list) -> object:
        if isinstance(values[0], dict):
            return {k: gather([v[k] for v in values]) for k in values[0]}
        stacked = torch.stack(values)
        return stacked[rows.to(stacked.device)]

    return gather(steps)


class EpisodeBatch:
    """The rows GRPO trains on, in the shape `PPO.update` reads (`flat()`); `vocab` names instruction ids."""

    def __init__(self, data: dict, vocab: list[str]) -> None:
        self.data, self.vocab = data, vocab

    def flat(self) -> dict:
        return self.data


class GRPOTrainer(Trainer):
    def make_algo(self) -> GRPO:
        cfg, g = self.cfg, self.cfg.grpo
        start_groups_alike(cfg, self.env, g.group_size, "grpo.group_size")
        self.lagrangian = None
        self.vocab: list[str] = []  # instructions seen so far; batches refer to them by index
        return GRPO(self.policy, cfg.algo, g, compile=cfg.resources.compile)

    def collect_round(self, index: int = 0) -> Episodes:
        """Round `index` of this iteration, from group resets seeded by the run's seed, the iteration and
        the round (so a resumed run draws the starts it would have drawn)."""
        rounds = 1 + self.cfg.grpo.resample_rounds
        obs = self.env.reset(seed=self.cfg.train.seed * 1_000_003 + self.iteration * rounds + index)
        return collect_episodes(self.env, self.act, obs, self.vocab, self.cfg.train.rollout_steps)

    def iterate(self, total_iters: int) -> dict[str, float]:
        cfg, g = self.cfg, self.cfg.grpo
        if cfg.algo.anneal_lr:
            self.algo.set_lr(cfg.algo.lr * (1 - self.iteration / total_iters))
        groups_needed = self.env.num_envs // g.group_size
        parts, kept_groups, dropped, seen, rewards_seen = [], 0, 0, 0, []
        collect_start, steps_collected = time.time(), 0
        for round_ in range(1 + g.resample_rounds):
            eps = self.collect_round(round_)
            steps_collected += eps.valid.shape[0] * self.env.num_envs  # every env steps until all have ended
            reward = eps.outcome[OUTCOMES[g.reward]]
            rewards_seen.append(reward)
            self.log_round(eps)
            keep = informative_groups(reward, g.group_size) if g.dynamic_sampling else \
                torch.ones(len(reward) // g.group_size, dtype=torch.bool)
            seen += len(keep)
            dropped += int((~keep).sum())
            keep &= torch.cumsum(keep.long(), 0) <= groups_needed - kept_groups  # fill, do not overfill
            kept_groups += int(keep.sum())
            parts.append((eps, reward, keep))
            if not g.dynamic_sampling or kept_groups >= groups_needed:
                break
        # the loop counts N · rollout_steps per iteration; count what was stepped (early ends, extra rounds)
        self.env_steps += steps_collected - self.env.num_envs * cfg.train.rollout_steps
        collect_time = time.time() - collect_start
        stats = {"groups": float(seen), "groups_dropped": float(dropped), "groups_dropped_frac": dropped / max(seen, 1),
                 "groups_kept": float(kept_groups), "rounds": float(round_ + 1),
                 "outcome_mean": float(torch.cat(rewards_seen).mean()),
                 "collect_sps": steps_collected / max(collect_time, 1e-9)}
        batch = self.build_batch(parts)
        if batch is None:
            stats["skipped_update"] = 1.0
            return stats
        stats["skipped_update"] = 0.0
        stats.update(self.algo.update(batch, self.generator))
        self.update_normalizer(batch.data["obs"])
        return stats

    def log_round(self, eps: Episodes) -> None:
        out = eps.outcome
        self.episodes.setdefault("return", []).extend(out["return"].tolist())
        self.episodes.setdefault("success", []).extend(out["success_at_end"].tolist())
        self.episodes.setdefault("success_once", []).extend(out["success_once"].tolist())
        self.episodes.setdefault("length", []).extend(out["length"].tolist())

    def build_batch(self, parts: list) -> EpisodeBatch | None:
        return build_batch_for(self.cfg.grpo, parts, self.device, self.vocab)


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
        data = stack_rows(eps.steps, rows)
        length = eps.valid.sum(0).clamp(min=1).float()
        per_step = 1.0 / length if g.loss_agg == "seq_mean_token_mean" else torch.ones_like(length)
        data["advantages"] = adv[rows].to(device)
        data["weights"] = per_step[None].expand(T, -1)[rows].to(device)
        chunks.append(data)
    if not chunks:
        return None
    data = cat_rows(chunks)
    zeros = torch.zeros_like(data["advantages"])
    data["values"], data["returns"] = zeros, zeros  # PPO.update's critic statistics (unused here)
    return EpisodeBatch(data, list(vocab))


def cat_rows(chunks: list[dict]) -> dict:
    if isinstance(chunks[0], dict):
        return {k: cat_rows([c[k] for c in chunks]) for k in chunks[0]}
    return torch.cat(chunks)
