"""Checks every VLA policy family passes (token and flow VLAs, pi0, LeRobot's SmolVLA)."""
import math

import torch

from roborl.algos.ppo import PPO
from roborl.buffer import RolloutBuffer
from roborl.config import PPOConfig
from roborl.policies import Act

TABLETOP_INSTRUCTIONS = ["push the red cube left", "lift the blue cube", "reach the green ball"]


def language_obs(n: int = 4, seed: int = 0, *, state: int, size: int,
                 instructions: list[str] = TABLETOP_INSTRUCTIONS) -> dict:
    """A seeded batch of n observations as the language tabletop envs give them: size×size RGB, state, and the
    instructions in turn."""
    g = torch.Generator().manual_seed(seed)
    return {"rgb": torch.randint(0, 256, (n, size, size, 3), dtype=torch.uint8, generator=g),
            "state": torch.randn(n, state, generator=g),
            "instruction": [instructions[i % len(instructions)] for i in range(n)]}


def check_ppo_starts_at_ratio_one(policy, obs_batch, atol: float = 1e-4) -> dict:
    """Two rollout steps of 4 envs into a RolloutBuffer: re-scoring the stored actions under unchanged weights
    gives the rollout's log-probs and values (the PPO ratio is 1 before the first update), and one PPO update
    on them is finite. The buffer keeps tensors only: prompt tokens travel in `extras`. Returns the flat data."""
    T, N = 2, 4
    buf = RolloutBuffer(T, N, torch.device("cpu"))
    with torch.no_grad():
        for t in range(T):
            obs = obs_batch(N, seed=t)
            buf.add(obs, policy.act(obs), torch.randn(N), torch.zeros(N, dtype=torch.bool))
        buf.finish(torch.zeros(N), 0.9, 0.9)
    data = buf.flat()
    with torch.no_grad():
        log_prob, _, value = policy.evaluate(data["obs"], Act(data["actions"], data["log_probs"], extras=data["extras"]))
    assert torch.allclose(log_prob, data["log_probs"], atol=atol)
    assert torch.allclose(value, data["values"], atol=1e-5)
    stats = PPO(policy, PPOConfig(epochs=1, minibatches=2)).update(buf)
    assert math.isfinite(stats["policy_loss"]) and math.isfinite(stats["value_loss"])
    return data


def executed_gaussian(x, mean, std, execute: int, action_dim: int) -> torch.Tensor:
    """The Gaussian log-density of the executed actions' real dims, written out (B×H×D -> B)."""
    log = -0.5 * ((x - mean) / std) ** 2 - std.log() - 0.5 * math.log(2 * math.pi)
    return log[:, :execute, :action_dim].sum((-1, -2))


def flow_noise_expected(policy, chain, predicted: list, cond, execute: int, action_dim: int) -> torch.Tensor:
    """The flow-noise chain's log-prob from a library's own predictions of noise − actions at each step
    (its time running from 1 down to 0, Euler steps of dt = −1/steps) and the policy's noise-std head."""
    steps, n = policy.steps, chain.shape[0]
    expected = 0.0
    for k in range(steps):
        mean = chain[:, k] - predicted[k] / steps
        std = policy.noise_min + (policy.noise_max - policy.noise_min) * (torch.tanh(policy.noise_std_head(
            chain[:, k], torch.full((n,), 1000 * k / steps), cond)) + 1) / 2
        expected = expected + executed_gaussian(chain[:, k + 1], mean, std, execute, action_dim)
    return expected


def flow_sde_expected(extras: dict, predicted: torch.Tensor, t: torch.Tensor, steps: int, noise_level: float,
                      execute: int, action_dim: int) -> torch.Tensor:
    """πRL's one-SDE-step log-prob at time t = 1 − τ from a library's prediction of noise − actions there."""
    v, delta, tt = -predicted, 1 / steps, t[:, None, None]
    sigma = noise_level * (tt / torch.where(tt >= 1, torch.full_like(tt, delta), 1 - tt)).sqrt()
    x0_hat, x1_hat = extras["x_pre"] + tt * v, extras["x_pre"] - (1 - tt) * v
    mean = x0_hat * (1 - tt + delta) + x1_hat * (tt - delta - sigma ** 2 * delta / (2 * tt))
    return executed_gaussian(extras["x_post"], mean, (sigma * delta ** 0.5).expand_as(mean), execute, action_dim)
