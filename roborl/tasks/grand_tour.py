"""GrandTour: Tour's six touches three times over (18 touches in one episode), a task long enough that a flat
reward machine does not learn it within the budget in which the hierarchy does.

Tour's scene, labels and approach terms (tasks/tour.py); only the order repeats. `tasks/grand_tour.rm` is the
task as a hierarchy of depth two: a root that calls `lap` three times, a lap that calls Tour's touch machines.
The option learner learns the same three touch options as on Tour, however many laps there are; the flat
learner sees every configuration of the call stack (37 here against Tour's 13), each a state it must learn to
act in, reached only once every touch before it is done.
"""
from __future__ import annotations

from roborl.sim.registry import register
from roborl.tasks.tour import TourEnv, TourExpert

LAPS = 3


class GrandTourEnv(TourEnv):
    instruction = "touch the red, blue, red, yellow, red, then blue target, three times over"
    episode_length = TourEnv.episode_length * LAPS
    order = TourEnv.order * LAPS


class GrandTourExpert(TourExpert):
    """Sequence's expert over the grand tour's order."""


@register("mujoco/GrandTour")
def make_grand_tour(num_envs: int = 1, **kwargs) -> GrandTourEnv:
    return GrandTourEnv(num_envs, **kwargs)
