"""Does a VLA's value head read the push direction? On `mujoco/LangTabletopFixed-Push` the policy runs
deterministically; at some decisions each state is scored under its own instruction and under the same
sentence with the direction swapped for each other one: V from the value head, and the reward the task
would pay for that state under that direction. A critic that reads the direction values the state
higher under the direction it is being pushed in, as the reward does; one that does not gives PPO's
bootstrapped advantages no reason to prefer the named side over another.

Prints, per probed decision: the mean over states of V(own) − V(other directions) and of
r(own) − r(other directions), and the mean over states of the correlation, across the four directions,
between V and r. An asymmetric critic (`env.critic_state`) also gets that direction's goal in its
privileged `critic_state`.

Usage: python bench/vla_critic_directions.py CHECKPOINT [--episodes 100] [--at 0 5 10 15 20]   (≈ 1 min)
"""
from __future__ import annotations

import argparse
import json

import torch

from roborl.checkpoint import Checkpoint
from roborl.evaluate import load_for_eval
from tasks.language import DIRECTION_WORDS, DIRECTIONS

TASK = "mujoco/LangTabletopFixed-Push"


def with_direction(text: str, own: int, new: int) -> str:
    """`text` with its direction phrase (the longest of `own`'s that it contains) in `new`'s words."""
    phrases = DIRECTION_WORDS[DIRECTIONS[own]]
    index = max((i for i, p in enumerate(phrases) if p in text), key=lambda i: len(phrases[i]))
    return text.replace(phrases[index], DIRECTION_WORDS[DIRECTIONS[new]][index])


def scores(policy: torch.nn.Module, sim, obs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """V and reward of every env's state under each direction (N×4); the task's own direction restored."""
    own = sim.direction.clone()
    values, rewards = [], []
    for d in range(len(DIRECTIONS)):
        sim.direction[:] = d
        sim._goal_cache = None
        swapped = {**obs, "instruction": [with_direction(t, int(o), d) for t, o in zip(obs["instruction"], own)]}
        if "critic_state" in obs:  # an asymmetric critic reads the goal of that direction as well
            swapped["critic_state"] = sim._critic_state_obs().float()
        values.append(policy.value(swapped).double())
        rewards.append(sim._evaluate()["reward"].double())
    sim.direction[:] = own
    sim._goal_cache = None
    return torch.stack(values, -1), torch.stack(rewards, -1)


def own_minus_others(x: torch.Tensor, own: torch.Tensor) -> float:
    mine = x.gather(-1, own[:, None]).squeeze(-1)
    return float((mine - (x.sum(-1) - mine) / (x.shape[-1] - 1)).mean())


def correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    """The mean over rows of the correlation across columns (rows where either is constant left out)."""
    a, b = a - a.mean(-1, keepdim=True), b - b.mean(-1, keepdim=True)
    norm = a.norm(dim=-1) * b.norm(dim=-1)
    keep = norm > 1e-9
    return float(((a * b).sum(-1)[keep] / norm[keep]).mean())


@torch.no_grad()
def critic_directions(checkpoint: str, episodes: int = 100, at: tuple[int, ...] = (0, 5, 10, 15, 20),
                      seed: int = 12345) -> dict[int, dict[str, float]]:
    env, policy = load_for_eval(Checkpoint(checkpoint), episodes, torch.device("cpu"), TASK)
    try:
        sim = env.unwrapped
        obs = env.reset(seed=seed)
        own = sim.direction.clone()
        out = {}
        for decision in range(max(at) + 1):
            if decision in at:
                v, r = scores(policy, sim, obs)
                out[decision] = {"value_own_minus_others": round(own_minus_others(v, own), 4),
                                 "reward_own_minus_others": round(own_minus_others(r, own), 4),
                                 "value_reward_correlation": round(correlation(v, r), 3)}
            obs, *_ = env.step(policy.act(obs, deterministic=True).action)
        return out
    finally:
        env.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument("--at", type=int, nargs="+", default=[0, 5, 10, 15, 20])
    p.add_argument("--seed", type=int, default=12345)
    a = p.parse_args()
    print(json.dumps(critic_directions(a.checkpoint, a.episodes, tuple(a.at), a.seed), indent=1))


if __name__ == "__main__":
    main()
