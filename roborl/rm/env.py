"""The product of an env and a reward machine: the machine's state joins the observation, its rewards
replace (or add to) the task's, and its terminal states end episodes.

`state` gets the one-hot machine state appended (and `obs["rm_state"]` holds its index), so every
policy sees it without change. The machine steps inside the simulator's step through a termination
hook, so an episode that reaches a terminal machine state ends in that same step, with `final_obs`
and episode statistics as for any other end. Optional potential-based shaping
r' = r + γΦ(u') − Φ(u) uses Φ = V from value iteration on the machine (Φ = 0 once an episode
terminates), which leaves optimal policies unchanged.

`counterfactuals` gives CRM's experience for off-policy learners: the same env transition seen from
every non-terminal machine state.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import gymnasium as gym
import numpy as np
import torch

from roborl.rm.compiled import CompiledRM
from roborl.rm.machine import RewardMachine
from roborl.sim.batch import concat
from roborl.sim.errors import SimError
from roborl.sim.vec_env import Obs, VecEnv
from roborl.sim.wrapper import VecEnvWrapper

REWARD_MODES = ("replace", "add")
T = TypeVar("T")


def state_space_plus(env: VecEnv, extra: int) -> gym.spaces.Dict:
    """The env's observation space with `extra` more columns of `state` (a machine's one-hot)."""
    spaces = dict(env.observation_space.spaces)
    spaces["state"] = gym.spaces.Box(-np.inf, np.inf, (spaces["state"].shape[0] + extra,), np.float32)
    return gym.spaces.Dict(spaces)


def compile_for(env: VecEnv, compile: Callable[..., T], machine, reward_mode: str) -> T:
    """A machine compiled against the env's labels and reward terms on its device, for a wrapper adding its
    rewards by `reward_mode`; either one wrong is a SimError that says what is wrong."""
    if reward_mode not in REWARD_MODES:
        raise SimError(f"rm.reward '{reward_mode}' is unknown; available: {', '.join(REWARD_MODES)}")
    try:
        return compile(machine, env.label_names, env.reward_term_names, env.device)
    except ValueError as exc:
        raise SimError(str(exc)) from exc


def add_termination_hook(env: VecEnv, hook, where: str) -> None:
    """Steps a machine inside the simulator's step, so that an episode ends in the step its machine does."""
    sim_env = env.unwrapped
    if not hasattr(sim_env, "termination_hooks"):
        raise SimError(f"{type(sim_env).__name__} cannot end episodes {where} (no termination_hooks); use a "
                       "mujoco/ task")
    sim_env.termination_hooks.append(hook)


class RewardMachineEnv(VecEnvWrapper):
    def __init__(self, env: VecEnv, rm: RewardMachine, reward_mode: str = "replace",
                 shaping_gamma: float | None = None, term_bound: float = 0.0) -> None:
        self.machine = compile_for(env, CompiledRM, rm, reward_mode)
        super().__init__(env)
        self.reward_mode = reward_mode
        self.shaping_gamma = shaping_gamma
        U = self.machine.num_states
        self.machine_columns = U  # the one-hot's width at the end of `state`
        self.potential = (self.machine.values(shaping_gamma, term_bound=term_bound) if shaping_gamma is not None
                          else torch.zeros(U, device=env.device))
        self.observation_space = state_space_plus(env, U)
        self.u = torch.full((env.num_envs,), self.machine.initial, dtype=torch.long, device=env.device)
        self._pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        add_termination_hook(env, self._advance, "at terminal reward-machine states")

    def _advance(self, labels: torch.Tensor, terms: torch.Tensor | None) -> torch.Tensor:
        if self._pending is not None:
            raise SimError("the reward machine must wrap the simulator inside action chunking (one simulator "
                           "step per machine step)")
        labels = labels.to(self.device)
        terms = terms.to(self.device) if terms is not None else None
        nxt, reward = self.machine.step(self.u, labels, terms)
        self._pending = (self.u.clone(), nxt, reward)
        return self.machine.terminal[nxt]

    def with_machine_state(self, obs: Obs, u: torch.Tensor) -> Obs:
        onehot = torch.nn.functional.one_hot(u, self.machine.num_states).to(obs["state"].dtype)
        return {**obs, "state": torch.cat([obs["state"], onehot], -1), "rm_state": u.clone()}

    def reset(self, seed: int | None = None, options: dict | None = None) -> Obs:
        obs = self.env.reset(seed=seed, options=options)
        self.u.fill_(self.machine.initial)
        return self.with_machine_state(obs, self.u)

    def step(self, action: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        self._pending = None
        obs, env_reward, term, trunc, info = self.env.step(action)
        if self._pending is None:
            raise SimError("the reward machine was not stepped: wrap the simulator directly (inside chunking)")
        u, nxt, rm_reward = self._pending
        reward = rm_reward if self.reward_mode == "replace" else env_reward + rm_reward
        if self.shaping_gamma is not None:
            phi_next = torch.where(term, torch.zeros_like(reward), self.potential[nxt])
            reward = reward + self.shaping_gamma * phi_next - self.potential[u]
        info["env_reward"], info["rm_reward"] = env_reward, rm_reward
        info["rm_state"], info["rm_accepted"] = nxt, self.machine.accepting[nxt]
        if "final_obs" in info:
            info["final_obs"] = self.with_machine_state(info["final_obs"], nxt)
        done = term | trunc
        self.u = torch.where(done, torch.full_like(nxt, self.machine.initial), nxt)
        return self.with_machine_state(obs, self.u), reward, term, trunc, info

    def counterfactuals(self, state: torch.Tensor, next_state: torch.Tensor, labels: torch.Tensor,
                        env_reward: torch.Tensor, env_terminated: torch.Tensor,
                        terms: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """CRM: for one env transition (`state`, `next_state` without the machine part; N rows) the
        experience ⟨s,u⟩ → ⟨s',δ(u,L)⟩ with reward of δ_r(u, L) for every non-terminal u. Returns
        (states, next_states, rewards, terminated), U'·N rows ordered by u then env, shaped like the
        env's own rewards when `shaping_gamma` is set."""
        U = self.machine.num_states
        us = (~self.machine.terminal).nonzero().flatten()
        n = state.shape[0]
        u = us.repeat_interleave(n)
        rep = lambda x: concat([x] * len(us))  # noqa: E731
        nxt, rm_reward = self.machine.step(u, rep(labels), rep(terms))
        onehot = lambda v: torch.nn.functional.one_hot(v, U).to(state.dtype)  # noqa: E731
        reward = rm_reward if self.reward_mode == "replace" else rep(env_reward) + rm_reward
        terminated = rep(env_terminated) | self.machine.terminal[nxt]
        if self.shaping_gamma is not None:
            phi_next = torch.where(terminated, torch.zeros_like(reward), self.potential[nxt])
            reward = reward + self.shaping_gamma * phi_next - self.potential[u]
        states = torch.cat([rep(state), onehot(u)], -1)
        next_states = torch.cat([rep(next_state), onehot(nxt)], -1)
        return states, next_states, reward, terminated
