"""The three ways a flow policy gives PPO a log-prob: `sample_<mode>(policy, cond, x0) -> (chunk,
log_prob, extras)` at rollout time and `log_prob_<mode>(policy, cond, extras) -> (log_prob, entropy)`
under the current parameters. Rollout log-probs are computed by the very function PPO calls later, so
the ratio starts at exactly 1.

A policy gives them `steps`, `taus(device)`, `velocity(x, τ, cond)` (τ = 0 noise, τ = 1 actions),
`noise_std_head(x, 1000·τ, cond)`, `noise_min`, `noise_max`, `noise_level`, `executed_log_prob` and
`executed_entropy`; `cond` is whatever its velocity reads (FlowPolicy: a tensor; pi0: the prefix's cache)."""
from __future__ import annotations

import dataclasses

import torch


def sample_ode(policy, cond, x: torch.Tensor) -> torch.Tensor:
    """The deterministic chain: `policy.steps` Euler steps of dx/dτ = v from τ = 0 (noise) to 1 (actions)."""
    taus = policy.taus(x.device)
    for k in range(policy.steps):
        x = x + (taus[k + 1] - taus[k]) * policy.velocity(x, taus[k], cond)
    return x


def sample_chunk(policy, cond, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """A chunk (N×horizon×action_dim) of a policy on `cond`: with `deterministic` (or without an rl_mode) the
    deterministic chain from zero (or random) noise with log-prob 0; else its rl_mode's chain, log-prob, extras."""
    n = cond.shape[0]
    shape = (n, policy.horizon, policy.action_dim)
    x0 = torch.zeros(shape, device=cond.device) if deterministic else torch.randn(shape, device=cond.device)
    if deterministic or policy.rl_mode is None:
        return sample_ode(policy, cond, x0), torch.zeros(n, device=cond.device), {}
    sample, _ = RL_MODES[policy.rl_mode]
    return sample(policy, cond, x0)


@dataclasses.dataclass
class PooledCondition:
    """The base of a VLA's flow condition: `pooled` features of its prefix (the value and noise heads' input)."""
    pooled: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.pooled.shape

    @property
    def device(self) -> torch.device:
        return self.pooled.device


# ---- flow-noise: a learned noise std on every Euler step, joint log-prob of the chain ------------
def noise_std(policy, x: torch.Tensor, tau: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    """σ_θ'(x, τ, s) squashed by tanh into [noise_min, noise_max], one per action element."""
    h = policy.noise_std_head(x, tau.expand(x.shape[0]) * 1000, cond)
    return policy.noise_min + (policy.noise_max - policy.noise_min) * (torch.tanh(h) + 1) / 2


def _noisy_euler_step(policy, x: torch.Tensor, k: int, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    taus = policy.taus(x.device)
    mean = x + (taus[k + 1] - taus[k]) * policy.velocity(x, taus[k], cond)
    return mean, noise_std(policy, x, taus[k], cond)


def sample_flow_noise(policy, cond: torch.Tensor, x0: torch.Tensor):
    chain = [x0]
    for k in range(policy.steps):
        mean, std = _noisy_euler_step(policy, chain[-1], k, cond)
        chain.append(mean + std * torch.randn_like(mean))
    extras = {"chain": torch.stack(chain, 1)}
    log_prob, _ = log_prob_flow_noise(policy, cond, extras)
    return chain[-1], log_prob, extras


def log_prob_flow_noise(policy, cond: torch.Tensor, extras: dict) -> tuple[torch.Tensor, torch.Tensor]:
    chain = extras["chain"]
    log_prob = entropy = 0.0
    for k in range(policy.steps):
        mean, std = _noisy_euler_step(policy, chain[:, k], k, cond)
        log_prob = log_prob + policy.executed_log_prob(chain[:, k + 1], mean, std)
        entropy = entropy + policy.executed_entropy(std, cond.shape[0], cond.device)
    return log_prob, entropy


# ---- flow-SDE: one stochastic step per sample -----------------------------------------------------
def sde_step(policy, x: torch.Tensor, tau: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From flow time τ (per sample) one step of Δ = 1/steps: the ODE step, and the SDE step's mean and
    std in πRL's convention t = 1 − τ: σ = a·√(t/(1−t)) (1 − t taken at the next grid point when t = 1),
    mean = x̂0(1 − t + Δ) + x̂1(t − Δ − σ²Δ/(2t)), std = σ√Δ, with x̂0 = x + t·v and x̂1 = x − (1 − t)·v."""
    delta = 1.0 / policy.steps
    v = policy.velocity(x, tau, cond)
    t = (1 - tau)[:, None, None]
    denom = torch.where(t >= 1 - 1e-6, torch.full_like(t, delta), 1 - t)
    sigma = policy.noise_level * (t / denom).sqrt()
    x0_hat, x1_hat = x + t * v, x - (1 - t) * v
    mean = x0_hat * (1 - t + delta) + x1_hat * (t - delta - sigma.square() * delta / (2 * t))
    std = (sigma * delta ** 0.5).expand_as(x)
    return x + delta * v, mean, std


def sample_flow_sde(policy, cond: torch.Tensor, x0: torch.Tensor):
    B = x0.shape[0]
    taus = policy.taus(x0.device)
    index = torch.randint(0, policy.steps, (B,), device=x0.device)
    x, x_pre, x_post = x0, x0, x0
    for k in range(policy.steps):
        ode, mean, std = sde_step(policy, x, taus[k].expand(B), cond)
        chosen = (index == k)[:, None, None]
        nxt = torch.where(chosen, mean + std * torch.randn_like(mean), ode)
        x_pre = torch.where(chosen, x, x_pre)
        x_post = torch.where(chosen, nxt, x_post)
        x = nxt
    extras = {"x_pre": x_pre, "x_post": x_post, "index": index}
    log_prob, _ = log_prob_flow_sde(policy, cond, extras)
    return x, log_prob, extras


def log_prob_flow_sde(policy, cond: torch.Tensor, extras: dict) -> tuple[torch.Tensor, torch.Tensor]:
    tau = policy.taus(cond.device)[extras["index"]]
    _, mean, std = sde_step(policy, extras["x_pre"], tau, cond)
    return (policy.executed_log_prob(extras["x_post"], mean, std),
            policy.executed_entropy(std, cond.shape[0], cond.device))


# ---- FPO: the negative flow-matching loss on stored (τ, ε) as the log-prob ------------------------
def sample_fpo(policy, cond: torch.Tensor, x0: torch.Tensor):
    x = sample_ode(policy, cond, x0)
    B, M = x.shape[0], policy.fpo_samples
    extras = {"sample": x, "tau": torch.rand(B, M, device=x.device),
              "eps": torch.randn(B, M, *x.shape[1:], device=x.device)}
    log_prob, _ = log_prob_fpo(policy, cond, extras)
    return x, log_prob, extras


def log_prob_fpo(policy, cond: torch.Tensor, extras: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """B×M: one column per (τ, ε) pair, so PPO clips each pair's ratio exp(ℓ_old − ℓ_new) on its own."""
    loss = policy.cfm_loss(cond, extras["sample"], extras["tau"], extras["eps"], executed_only=True)
    return -loss, torch.zeros(cond.shape[0], device=cond.device)


# policy.rl_mode -> (sample a chain with its log-probability, the log-probability of a stored chain)
RL_MODES = {"flow_noise": (sample_flow_noise, log_prob_flow_noise), "flow_sde": (sample_flow_sde, log_prob_flow_sde),
            "fpo": (sample_fpo, log_prob_fpo)}
