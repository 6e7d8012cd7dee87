"""Replay buffer for off-policy learners: a ring of transitions kept as torch tensors on one device."""
from __future__ import annotations

import torch

from roborl.sim.batch import concat


class ReplayBuffer:
    """(obs, action, reward, next_obs, terminated) for N envs per `add`; `next_obs` of an env whose
    episode ended is its `final_obs`, and only termination (not a time-out) stops bootstrapping."""

    def __init__(self, capacity: int, device: torch.device) -> None:
        self.capacity, self.device = capacity, device
        self.data: dict[str, torch.Tensor] = {}
        self.pos = 0
        self.size = 0

    def _store(self, key: str, value: torch.Tensor, idx: torch.Tensor) -> None:
        if key not in self.data:
            self.data[key] = torch.zeros((self.capacity, *value.shape[1:]), dtype=value.dtype, device=self.device)
        self.data[key][idx] = value.to(self.device)

    def add(self, obs: dict, action: torch.Tensor, reward: torch.Tensor, next_obs: dict,
            terminated: torch.Tensor) -> None:
        n = action.shape[0]
        if n > self.capacity:
            raise ValueError(f"sac.buffer_size ({self.capacity}) is smaller than one step of {n} envs")
        idx = (self.pos + torch.arange(n, device=self.device)) % self.capacity
        for key, value in obs.items():
            if isinstance(value, torch.Tensor):
                self._store(f"obs.{key}", value, idx)
                self._store(f"next_obs.{key}", next_obs[key], idx)
        self._store("action", action, idx)
        self._store("reward", reward.float(), idx)
        self._store("terminated", terminated.float(), idx)
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> dict:
        idx = torch.randint(0, self.size, (batch_size,), generator=generator).to(self.device)
        out: dict = {"obs": {}, "next_obs": {}}
        for key, value in self.data.items():
            group, _, name = key.partition(".")
            if name:
                out[group][name] = value[idx]
            else:
                out[key] = value[idx]
        return out

    def __len__(self) -> int:
        return self.size

    def state_dict(self) -> dict:
        """The filled part of the ring (in ring order) and its write position, for checkpoints."""
        return {"pos": self.pos, "size": self.size, "data": {k: v[:self.size] for k, v in self.data.items()}}

    def load_state_dict(self, state: dict) -> None:
        if state["size"] > self.capacity:
            raise ValueError(f"the checkpoint's replay holds {state['size']} transitions, more than "
                             f"sac.buffer_size ({self.capacity})")
        self.data = {}
        for key, value in state["data"].items():
            self.data[key] = torch.zeros((self.capacity, *value.shape[1:]), dtype=value.dtype, device=self.device)
            self.data[key][:len(value)] = value.to(self.device)
        self.pos, self.size = state["pos"], state["size"]


def sample_mixed(online: ReplayBuffer, offline: ReplayBuffer, batch_size: int, offline_fraction: float = 0.5,
                 generator: torch.Generator | None = None) -> dict:
    """RLPD's symmetric sampling (Ball et al. 2023, as HIL-SERL trains): `offline_fraction` of the batch from
    the demonstrations and interventions, the rest from all online data; all online while `offline` is empty."""
    n_offline = round(batch_size * offline_fraction) if len(offline) else 0
    parts = [buf.sample(n, generator) for buf, n in ((online, batch_size - n_offline), (offline, n_offline)) if n]
    return parts[0] if len(parts) == 1 else concat(parts)
