"""The transitions of a human-in-the-loop run on a robot: the control loop's step records (`on_step`)
become (obs, action, reward, next_obs, terminated) in an online buffer, and the steps the operator commanded
go to an intervention buffer too, which also holds the demonstrations; the learner samples the two 50/50
(`roborl.replay.sample_mixed`). The reward is a function of the observation after the step: the task's
success on a twin, a reward classifier on camera frames on a real cell."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from roborl.replay import ReplayBuffer, sample_mixed
from roborl.robot.control_loop import StepRecord

RewardFn = Callable[[dict[str, np.ndarray]], float]


def _batch(obs: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """A robot observation as a one-row batch of the replay's keys (its arrays; scalars and text left out)."""
    return {k: torch.tensor(v)[None] for k, v in obs.items()
            if isinstance(v, np.ndarray) and v.dtype != object and v.ndim >= 1}


class HILBuffers:
    def __init__(self, reward_fn: RewardFn, capacity: int = 1_000_000, device: torch.device | str = "cpu") -> None:
        self.reward_fn = reward_fn
        self.online = ReplayBuffer(capacity, torch.device(device))
        self.interventions = ReplayBuffer(capacity, torch.device(device))
        self._pending: StepRecord | None = None

    def record(self, step: StepRecord) -> None:
        """The loop's `on_step`: completes the previous step's transition with this step's observation."""
        if self._pending is not None:
            self._add(self._pending, step.obs, terminated=False)
        self._pending = step

    def end_episode(self, final_obs: dict[str, np.ndarray], terminated: bool) -> None:
        """The last transition of an episode, with the observation after its last step."""
        if self._pending is not None:
            self._add(self._pending, final_obs, terminated)
        self._pending = None

    def _add(self, step: StepRecord, next_obs: dict[str, np.ndarray], terminated: bool) -> None:
        args = (_batch(step.obs), torch.as_tensor(step.action, dtype=torch.float32)[None],
                torch.tensor([self.reward_fn(next_obs)]), _batch(next_obs), torch.tensor([float(terminated)]))
        self.online.add(*args)
        if step.intervened:
            self.interventions.add(*args)

    def add_demos(self, obs: dict, action: torch.Tensor, reward: torch.Tensor, next_obs: dict,
                  terminated: torch.Tensor) -> None:
        """Demonstration transitions (batched), into the intervention buffer only."""
        self.interventions.add(obs, action, reward, next_obs, terminated)

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> dict:
        return sample_mixed(self.online, self.interventions, batch_size, 0.5, generator)
