"""A VecEnv with several agents (`VecEnv.agents`) seen as a PettingZoo `ParallelEnv`.

Each agent observes its own columns of `state` and commands its slice of the action; the reward, success and the
episode's end are shared (the tasks are cooperative). One environment of the batch is the PettingZoo env, as
Gymnasium's single-env view (`GymnasiumEnv`) does; a batched trainer uses the VecEnv itself. Needs the `multiagent`
extra (`pettingzoo`).
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from roborl.sim.errors import SimError
from roborl.sim.vec_env import VecEnv

try:
    from pettingzoo import ParallelEnv
except ImportError as exc:
    raise SimError("the PettingZoo view needs pettingzoo: pip install 'roborl[multiagent]'") from exc


class PettingZooEnv(ParallelEnv):
    """`env` (one environment, two or more agents) as a `pettingzoo.ParallelEnv`."""

    metadata = {"name": "roborl", "is_parallelizable": True}

    def __init__(self, env: VecEnv) -> None:
        if not env.agents:
            raise SimError(f"{type(env).__name__} has one agent (VecEnv.agents is empty); use GymnasiumEnv for it")
        if env.num_envs != 1:
            raise SimError(f"the PettingZoo view wraps a VecEnv with num_envs=1, got {env.num_envs}")
        self.venv = env
        self.possible_agents = list(env.agents)
        self.agents: list[str] = []
        state = env.observation_space["state"]
        self.observation_spaces = {
            name: gym.spaces.Box(state.low[list(a.state)], state.high[list(a.state)], dtype=np.float32)
            for name, a in env.agents.items()}
        self.action_spaces = {
            name: gym.spaces.Box(env.action_space.low[slice(*a.action)], env.action_space.high[slice(*a.action)],
                                 dtype=np.float32)
            for name, a in env.agents.items()}

    def observation_space(self, agent: str) -> gym.spaces.Box:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> gym.spaces.Box:
        return self.action_spaces[agent]

    def _split(self, state: torch.Tensor) -> dict[str, np.ndarray]:
        s = state[0].cpu().numpy().astype(np.float32)
        return {name: s[list(a.state)] for name, a in self.venv.agents.items()}

    def reset(self, seed: int | None = None, options: dict | None = None):
        """`options` is accepted and unused: the VecEnv's own reset options concern batches (group starts)."""
        obs = self.venv.reset(seed=seed)
        self.agents = list(self.possible_agents)
        return self._split(obs["state"]), {name: {} for name in self.agents}

    def step(self, actions: dict[str, np.ndarray]):
        if set(actions) != set(self.agents):
            raise SimError(f"step needs one action for each live agent {self.agents}, got {sorted(actions)}")
        joint = np.zeros(self.venv.action_space.shape, dtype=np.float32)
        for name, a in self.venv.agents.items():
            joint[slice(*a.action)] = actions[name]
        obs, reward, term, trunc, info = self.venv.step(torch.as_tensor(joint)[None])
        ended = bool(info["done"][0])
        # an episode that ended reports its last observation, not the one the auto-reset produced
        state = info["final_obs"]["state"] if ended else obs["state"]
        agents, self.agents = self.agents, ([] if ended else self.agents)
        shared = {"success": bool(info["success"][0])}
        if "cost" in info:
            shared["cost"] = float(info["cost"][0])
        return (self._split(state), {n: float(reward[0]) for n in agents}, {n: bool(term[0]) for n in agents},
                {n: bool(trunc[0]) for n in agents}, {n: dict(shared) for n in agents})

    def render(self) -> np.ndarray:
        return self.venv.render([0])[0].cpu().numpy()

    def close(self) -> None:
        self.venv.close()
