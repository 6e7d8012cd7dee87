"""One on-policy rollout of T steps into a RolloutBuffer: the loop the trainer runs, and every Ray env
worker runs with its own copy of the policy (roborl/ray_workers.py)."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

import sim
from policies.act import Act
from roborl.buffer import RolloutBuffer, bootstrap_timeouts
from roborl.errors import UserError


def record_episodes(episodes: dict[str, list[float]], info: dict) -> float:
    """Appends the episode statistics of one step's `info` to `episodes` (shield interventions per step;
    return, success, cost, reward-machine state per ended episode). Returns the step's safety violations
    (envs with a cost > 0)."""
    if "shield" in info:  # per step: intervention rate, correction size, infeasible QPs
        sh = info["shield"]
        for key, value in (("shield_intervention", sh["intervened"]), ("shield_correction", sh["correction"]),
                           ("shield_infeasible", sh["infeasible"])):
            episodes.setdefault(key, []).append(float(value.float().mean()))
    if "episode" in info:
        done = info["done"]
        episodes.setdefault("return", []).extend(info["episode"]["return"][done].tolist())
        episodes.setdefault("success", []).extend(info["episode"]["success_at_end"][done].float().tolist())
        if "cost" in info["episode"]:
            episodes.setdefault("cost", []).extend(info["episode"]["cost"][done].tolist())
        if "rm_state" in info:  # how far through the reward machine episodes got
            episodes.setdefault("rm_final_state", []).extend(info["rm_state"][done].float().tolist())
    return float((info["cost"] > 0).sum()) if "cost" in info else 0.0


@torch.no_grad()
def collect(policy: nn.Module, env: sim.VecEnv, buffer: RolloutBuffer, obs: dict, act_fn: Callable[[dict], Act],
            gamma: float, record: Callable[[dict], None], safe: bool = False) -> dict:
    """Fills `buffer` with `buffer.T` steps from `obs` on; returns the observation after the last step.

    Time-outs are bootstrapped with γ·V(final_obs) here, while the critic that saw the episode is at hand.
    `safe` also stores costs and cost values (PPO-Lagrangian)."""
    for _ in range(buffer.T):
        act = act_fn(obs)
        cost_value = policy.cost_value(obs) if safe else None
        next_obs, reward, term, trunc, info = env.step(act.action)
        cost = info.get("cost")
        if safe and cost is None:
            raise UserError("algo.cost_limit needs a task that publishes info['cost']; this env does not")
        if trunc.any():
            final_obs = info["final_obs"]
            reward = bootstrap_timeouts(reward, trunc, policy.value(final_obs), gamma)
            if safe:
                cost = bootstrap_timeouts(cost, trunc, policy.cost_value(final_obs), gamma)
        buffer.add(obs, act, reward, term | trunc, cost if safe else None, cost_value)
        record(info)
        obs = next_obs
    return obs
