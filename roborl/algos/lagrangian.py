"""The Lagrange multiplier of PPO-Lagrangian, updated by a PID controller on the constraint violation
(Stooke et al., "Responsive Safety in RL by PID Lagrangian Methods"): with e = J_c − limit,
λ = max(0, kp·e + I + kd·max(0, J_c − J_c,prev)) where I = max(0, I + ki·e). kp = kd = 0 is plain
gradient ascent on λ; kp and kd damp its oscillation."""
from __future__ import annotations


class PIDLagrangian:
    def __init__(self, limit: float, ki: float, kp: float = 0.0, kd: float = 0.0) -> None:
        self.limit, self.ki, self.kp, self.kd = limit, ki, kp, kd
        self.integral = 0.0
        self.previous: float | None = None
        self.value = 0.0

    def update(self, episode_cost: float) -> float:
        error = episode_cost - self.limit
        self.integral = max(0.0, self.integral + self.ki * error)
        rise = 0.0 if self.previous is None else max(0.0, episode_cost - self.previous)
        self.previous = episode_cost
        self.value = max(0.0, self.kp * error + self.integral + self.kd * rise)
        return self.value

    def state(self) -> dict:
        return {"integral": self.integral, "previous": self.previous, "value": self.value}

    def load(self, state: dict) -> None:
        self.integral, self.previous, self.value = state["integral"], state["previous"], state["value"]
