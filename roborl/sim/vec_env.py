"""The batched environment contract every simulator backend keeps (docs/architecture.md, "VecEnv")."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch

Obs = dict[str, Any]


@dataclass(frozen=True)
class AgentSpace:
    """One agent of an env that several agents share (`VecEnv.agents`): the columns of `state` it observes and
    the action dims it commands (`action[:, start:stop]`). The state stays whole for a centralized critic."""
    state: tuple[int, ...]
    action: tuple[int, int]

    @property
    def action_dim(self) -> int:
        return self.action[1] - self.action[0]


class VecEnv:
    """N environments stepped together; everything in and out is a torch tensor with leading dim N.

    Subclasses set `num_envs`, `device`, `observation_space` (per-env `spaces.Dict`), `action_space`
    (per-env `Box` in [-1, 1]), `label_names`, and implement `reset` and `step`. Environments that end
    reset themselves inside `step`; `info["final_obs"]` then holds their last observation.
    """

    num_envs: int
    device: torch.device
    observation_space: gym.spaces.Dict
    action_space: gym.spaces.Box
    label_names: tuple[str, ...] = ()
    reward_term_names: tuple[str, ...] = ()  # columns of info["reward_terms"], where the task has them
    # label -> the reward term that is this step's progress toward it (a difference of distances): a machine
    # split from an LTLf formula pays it while it waits for that label (roborl/rm/ltlf_split.py)
    label_progress: dict[str, str] = {}
    max_episode_steps: int | None = None
    control_dt: float = 0.05
    # whether info["success"] means something (Gymnasium envs without `is_success` report False throughout);
    # where it does not, the runner keeps its best checkpoint by mean return (train.best_metric auto)
    reports_success: bool = True
    one_per_process: bool = False  # the simulator allows one env per process (Isaac Lab): trainers evaluate in it
    # several agents in one env (tasks/two_arms.py): name -> AgentSpace, their action dims partitioning the
    # action in order; empty for one agent. Rewards, success and episode ends are shared (a cooperative task).
    agents: dict[str, AgentSpace] = {}

    def reset(self, seed: int | None = None, options: dict | None = None) -> Obs:
        """`options` follows Gymnasium's convention; backends that support it take `group_size` (groups
        of G consecutive envs start from one initial state, for GRPO)."""
        raise NotImplementedError

    def step(self, action: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        raise NotImplementedError

    @property
    def supports_group_resets(self) -> bool:
        """Whether `set_group_size` works: the simulator under all wrappers can start groups alike."""
        return self.unwrapped is not self and self.unwrapped.supports_group_resets

    def set_group_size(self, group_size: int) -> None:
        """Every later full reset starts groups of `group_size` consecutive envs from one initial state
        (through any wrapper: it reaches the simulator). Backends that support it override this."""
        if self.unwrapped is self:
            raise NotImplementedError(f"{type(self).__name__} has no group resets")
        self.unwrapped.set_group_size(group_size)

    @contextmanager
    def unobserved(self) -> Iterator[None]:
        """Steps taken inside return observations nobody reads (an action chunk's inner steps), so a
        simulator may leave out what is costly to make, such as camera frames; `info["final_obs"]` stays
        whole. Here nothing is left out."""
        yield

    def render(self, env_ids: list[int] | None = None) -> torch.Tensor:
        """RGB frames of the given (default: all) environments, uint8 n×H×W×3."""
        raise NotImplementedError(f"{type(self).__name__} does not render")

    def close(self) -> None:
        pass

    @property
    def unwrapped(self) -> VecEnv:
        """The simulator under all wrappers (itself for a simulator)."""
        return self

    @property
    def action_dim(self) -> int:
        """A of one control step's action: the last dim of `action_space` (K×A for a chunked env)."""
        return int(self.action_space.shape[-1])

    def action_scaling(self) -> dict[str, list]:
        """What an action in [-1, 1] commands: `scale`·a + `offset` in `units` per dimension (exported
        with deployed policies, so the robot side knows what it executes)."""
        n = int(self.action_space.shape[-1])
        return {"scale": [1.0] * n, "offset": [0.0] * n, "units": ["normalized"] * n}

    def __enter__(self) -> VecEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
