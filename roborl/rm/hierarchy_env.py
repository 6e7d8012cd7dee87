"""The option learner's view of a hierarchy of reward machines (`env.rm.learner: options`).

HRMs are learned with one option per callable machine (Furelos-Blanco et al. 2023): the policy of a machine
is trained on that machine's own reward and ends when the machine returns, so a sub-task called several
times (touch A, then B, then A again) is one option, learned once. Here the options share one network: the
observation's `state` gets the one-hot of the innermost machine and its state (not the whole call stack,
which is what the flat learner sees through `flatten`), the reward is what that machine's own edges pay
(`CompiledHierarchy`'s `own`, reward terms included), and `info["option_end"]` marks the steps where a
call returned, which PPO treats as the end of a return (no bootstrap across it; the env goes on). The root's
calls are fixed by their contexts here (a state calls at most one machine for given labels), so there is no
choice among calls to learn.
"""
from __future__ import annotations

import torch

from roborl.rm.env import REWARD_MODES, add_termination_hook, state_space_plus
from roborl.rm.hierarchy import CompiledHierarchy, Hierarchy
from roborl.sim.errors import SimError
from roborl.sim.vec_env import Obs, VecEnv
from roborl.sim.wrapper import VecEnvWrapper


class HierarchyEnv(VecEnvWrapper):
    def __init__(self, env: VecEnv, h: Hierarchy, reward_mode: str = "replace") -> None:
        if reward_mode not in REWARD_MODES:
            raise SimError(f"rm.reward '{reward_mode}' is unknown; available: {', '.join(REWARD_MODES)}")
        super().__init__(env)
        try:
            self.machine = CompiledHierarchy(h, env.label_names, env.reward_term_names, env.device)
        except ValueError as exc:
            raise SimError(str(exc)) from exc
        self.reward_mode = reward_mode
        sizes = torch.tensor([len(h.machines[name].states) for name in self.machine.names])
        self.offsets = (torch.cumsum(sizes, 0) - sizes).to(env.device)  # option of (machine k, state u): offsets[k] + u
        self.num_options = int(sizes.sum())
        self.option_names = [f"{name}.{state}" for name in self.machine.names for state in h.machines[name].states]
        self.observation_space = state_space_plus(env, self.num_options)
        self.stack = self.machine.reset(env.num_envs)
        self._pending: dict | None = None
        add_termination_hook(env, self._advance, "where the hierarchy accepts or fails")

    def _advance(self, labels: torch.Tensor, terms: torch.Tensor | None) -> torch.Tensor:
        if self._pending is not None:
            raise SimError("the hierarchy must wrap the simulator inside action chunking (one simulator step per "
                           "machine step)")
        terms = terms.to(self.device) if terms is not None else None
        self._pending = self.machine.step(self.stack, labels.to(self.device), terms)[0]
        return self.machine.accepts(self._pending) | self._pending["failed"]

    def option(self, stack: dict) -> torch.Tensor:
        """The option index of each env: its innermost machine and that machine's state."""
        rows = torch.arange(len(stack["depth"]), device=self.device)
        return self.offsets[stack["machine"][rows, stack["depth"]]] + stack["state"][rows, stack["depth"]]

    def with_option(self, obs: Obs, stack: dict) -> Obs:
        option = self.option(stack)
        onehot = torch.nn.functional.one_hot(option, self.num_options).to(obs["state"].dtype)
        return {**obs, "state": torch.cat([obs["state"], onehot], -1), "rm_state": option}

    def reset(self, seed: int | None = None, options: dict | None = None) -> Obs:
        obs = self.env.reset(seed=seed, options=options)
        self.stack = self.machine.reset(self.num_envs)
        return self.with_option(obs, self.stack)

    def step(self, action: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        self._pending = None
        obs, env_reward, term, trunc, info = self.env.step(action)
        if self._pending is None:
            raise SimError("the hierarchy was not stepped: wrap the simulator directly (inside chunking)")
        stack = self._pending
        own = stack["own"].to(env_reward.dtype)
        reward = own if self.reward_mode == "replace" else env_reward + own
        accepted = self.machine.accepts(stack)
        info["env_reward"], info["rm_reward"] = env_reward, own
        info["rm_state"], info["rm_accepted"] = stack["state"][:, 0], accepted  # the root's state: how far it got
        info["option_end"] = stack["returned"] | accepted | stack["failed"]
        if "final_obs" in info:
            info["final_obs"] = self.with_option(info["final_obs"], stack)
        done = term | trunc
        fresh = self.machine.reset(self.num_envs)
        self.stack = {k: torch.where(done.view(-1, *[1] * (v.dim() - 1)), fresh[k], v) for k, v in stack.items()}
        return self.with_option(obs, self.stack), reward, term, trunc, info
