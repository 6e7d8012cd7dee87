"""Tour: touch the red, blue, red, yellow, red, then blue target (a long task whose sub-task repeats).

Sequence's scene, labels (`at_a`, `at_b`, `at_c`) and approach terms, with six touches in order instead of
three. The task's own reward is the sparse 1 when the tour is done (the episode then ends). `tasks/tour.rm`
is the task as a hierarchy of reward machines: a root that calls `touch_a`, `touch_b`, `touch_a`, `touch_c`,
`touch_a`, `touch_b`, each paying its approach term while it waits and 1 when its target is touched. The flat
learner runs the flattened hierarchy (13 configurations); the option learner learns three options
(roborl/rm/hierarchy_env.py).
"""
from __future__ import annotations

from roborl.sim.registry import register
from roborl.tasks.sequence import SequenceEnv, SequenceExpert


class TourEnv(SequenceEnv):
    instruction = "touch the red, blue, red, yellow, red, then blue target"
    episode_length = 150
    order = (0, 1, 0, 2, 0, 1)


class TourExpert(SequenceExpert):
    """Sequence's expert over the tour's order."""


@register("mujoco/Tour")
def make_tour(num_envs: int = 1, **kwargs) -> TourEnv:
    return TourEnv(num_envs, **kwargs)
