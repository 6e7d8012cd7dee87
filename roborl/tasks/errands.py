"""Errands: touch the red and the blue target, in either order, then the yellow one (a task with a choice).

Sequence's scene, labels (`at_a`, `at_b`, `at_c`) and approach terms. Which of red and blue to touch first is
free, and the shorter tour depends on where the targets are, so a learner that picks the order per episode
finishes sooner than one that always goes the same way. `tasks/errands.rm` is the task as a hierarchy whose
root starts with a choice between calling `touch_a` and `touch_b` (roborl/rm/hierarchy.py); the option learner
learns which call to pursue (roborl/rm/hierarchy_env.py). The task's own reward is the sparse 1 at the end.
"""
from __future__ import annotations

import torch

from roborl.sim.registry import register
from roborl.tasks.sequence import APPROACH_GAIN, TOUCH_DIST, SequenceEnv, SequenceExpert


class ErrandsEnv(SequenceEnv):
    instruction = "touch the red and the blue target, in either order, then the yellow one"
    episode_length = 100

    def _evaluate(self) -> dict[str, torch.Tensor]:
        dist = self.distances()
        at = dist < TOUCH_DIST
        self.progress |= at[:, 0].long() | at[:, 1].long() << 1  # bits: red touched, blue touched
        success = (self.progress == 3) & at[:, 2]
        approach = APPROACH_GAIN * (self.last_dist - dist)
        self.last_dist = dist
        return {"reward": success.double(), "success": success, "terminated": success, "labels": at,
                "reward_terms": approach}

    def shorter_first(self) -> torch.Tensor:
        """Per env, the target (0 red, 1 blue) to touch first on the shorter tour from where the TCP is now."""
        return shorter_first(self.targets - self.tcp[:, None])


def shorter_first(rel: torch.Tensor) -> torch.Tensor:
    """From the targets relative to the TCP (N×3×3, red, blue, yellow): per row, which of red (0) and blue (1)
    starts the shorter straight-line tour red-blue-yellow or blue-red-yellow."""
    leg = lambda x: x.norm(dim=-1)  # noqa: E731
    via_red = leg(rel[:, 0]) + leg(rel[:, 0] - rel[:, 1]) + leg(rel[:, 1] - rel[:, 2])
    via_blue = leg(rel[:, 1]) + leg(rel[:, 1] - rel[:, 0]) + leg(rel[:, 0] - rel[:, 2])
    return (via_blue < via_red).long()


class ErrandsExpert(SequenceExpert):
    """Touches red and blue in the order of the shorter tour (chosen when its episode starts), then yellow."""

    def __init__(self, env: ErrandsEnv, gain: float = 2.0) -> None:
        super().__init__(env, gain)
        self.first = env.shorter_first()

    def reset(self, mask: torch.Tensor | None = None) -> None:
        super().reset(mask)
        mask = torch.ones_like(self.phase, dtype=torch.bool) if mask is None else mask.cpu()
        self.first[mask] = self.env.shorter_first()[mask]

    def plan(self):
        env = self.env
        rows = torch.arange(env.num_envs)
        first, second = env.targets[rows, self.first], env.targets[rows, 1 - self.first]
        target = self.select([first, second, env.targets[:, 2]])
        return target, torch.ones(env.num_envs), self.at(target, 0.02) & (self.phase < 3)


@register("mujoco/Errands")
def make_errands(num_envs: int = 1, **kwargs) -> ErrandsEnv:
    return ErrandsEnv(num_envs, **kwargs)
