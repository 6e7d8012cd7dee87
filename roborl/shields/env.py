"""Applies a shield between the policy and the simulator, so training, evaluation and deployment run
the same shield. The policy is updated on what it proposed (the buffer stores the proposal), with
`penalty` subtracted from the reward of every step where the shield intervened; `info["shield"]`
carries `intervened`, `correction` (‖executed − proposed‖) and `infeasible` per env, and
`info["executed_action"]` what actually ran."""
from __future__ import annotations

import torch

from roborl.shields.base import Shield
from roborl.sim.vec_env import Obs, VecEnv
from roborl.sim.wrapper import VecEnvWrapper


class ShieldEnv(VecEnvWrapper):
    def __init__(self, env: VecEnv, shield: Shield, penalty: float = 0.0) -> None:
        super().__init__(env)
        self.shield, self.penalty = shield, penalty
        self.obs: Obs | None = None

    def reset(self, seed: int | None = None, options: dict | None = None) -> Obs:
        self.obs = self.env.reset(seed=seed, options=options)
        self.shield.reset()
        return self.obs

    def step(self, action: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        with torch.no_grad():
            safe, intervened, shield_info = self.shield(self.obs, action)
        obs, reward, term, trunc, info = self.env.step(safe)
        self.shield.observe(self.obs, safe, info)
        self.shield.reset(term | trunc)
        if self.penalty:
            reward = reward - self.penalty * intervened.to(reward)
        info["shield"] = {"intervened": intervened, **shield_info}
        info["executed_action"] = safe
        self.obs = obs
        return obs, reward, term, trunc, info
