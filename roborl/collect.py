"""The one env-stepping loop: training rollouts (PPO), GRPO's episodes, SAC's transitions and evaluation all
step their envs through `run_steps`, and read episode statistics with `EpisodeLog`."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from roborl.policies.act import Act
from roborl.sim import VecEnv


@dataclass
class Step:
    """One batched step: what the envs saw (`obs`), what the policy did (`act`) and what followed."""
    obs: dict
    act: Act
    next_obs: dict
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    info: dict

    @property
    def done(self) -> torch.Tensor:
        return self.terminated | self.truncated


@torch.no_grad()
def run_steps(env: VecEnv, obs: dict, act: Callable[[dict], Act], record: Callable[[Step], bool | None],
              max_steps: int) -> dict:
    """Steps `env` from `obs`: `act(obs)`, `env.step`, `record(step)`; `max_steps` times, or until `record`
    returns True. Returns the observation after the last step."""
    for _ in range(max_steps):
        a = act(obs)
        next_obs, reward, terminated, truncated, info = env.step(a.action)
        stop = record(Step(obs, a, next_obs, reward, terminated, truncated, info))
        obs = next_obs
        if stop:
            break
    return obs


class EpisodeLog:
    """Per-iteration statistics of the training envs: shield interventions per step; return, success,
    cost and reward-machine state per ended episode; and the steps with a safety violation (cost > 0)."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {"return": [], "success": []}
        self.violations = 0.0

    def extend(self, key: str, values: list[float]) -> None:
        self.values.setdefault(key, []).extend(values)

    def record(self, info: dict) -> None:
        """The statistics of one step's `info`."""
        if "shield" in info:  # per step: intervention rate, correction size, infeasible QPs
            sh = info["shield"]
            for key, value in (("shield_intervention", sh["intervened"]), ("shield_correction", sh["correction"]),
                               ("shield_infeasible", sh["infeasible"])):
                self.extend(key, [float(value.float().mean())])
        if "episode" in info:
            done = info["done"]
            self.extend("return", info["episode"]["return"][done].tolist())
            self.extend("success", info["episode"]["success_at_end"][done].float().tolist())
            if "cost" in info["episode"]:
                self.extend("cost", info["episode"]["cost"][done].tolist())
            if "rm_state" in info:  # how far through the reward machine episodes got
                self.extend("rm_final_state", info["rm_state"][done].float().tolist())
        if "cost" in info:
            self.violations += float((info["cost"] > 0).sum())

    def means(self) -> dict[str, float]:
        return {k: sum(v) / len(v) for k, v in self.values.items() if v}
