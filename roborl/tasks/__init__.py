"""Embedded arm tasks (MJCF in `tasks/assets`, no downloads). Importing registers `mujoco/<Task>`."""
from roborl.tasks.errands import ErrandsEnv, ErrandsExpert
from roborl.tasks.grand_tour import GrandTourEnv, GrandTourExpert
from roborl.tasks.language import TASK_NAMES as LANG_TASKS
from roborl.tasks.multitask_experts import LangTabletopExpert
from roborl.tasks.multitask_tabletop import LANG_TABLETOP_IDS, LangTabletopEnv
from roborl.tasks.pick_place import PickPlaceEnv, PickPlaceExpert
from roborl.tasks.push import PushEnv, PushExpert
from roborl.tasks.reach import ReachEnv, ReachExpert
from roborl.tasks.reach_avoid import ReachAvoidEnv, ReachAvoidExpert
from roborl.tasks.sequence import SequenceEnv, SequenceExpert
from roborl.tasks.stack import StackEnv, StackExpert
from roborl.tasks.tour import TourEnv, TourExpert
from roborl.tasks.two_arms import TwoArmReachEnv, TwoArmReachExpert

EXPERTS = {"mujoco/Reach": ReachExpert, "mujoco/Push": PushExpert,
           "mujoco/PickPlace": PickPlaceExpert, "mujoco/Stack": StackExpert, "mujoco/Sequence": SequenceExpert,
           "mujoco/ReachAvoid": ReachAvoidExpert, "mujoco/Tour": TourExpert, "mujoco/GrandTour": GrandTourExpert,
           "mujoco/Errands": ErrandsExpert,
           "mujoco/TwoArmReach": TwoArmReachExpert, **{task: LangTabletopExpert for task in LANG_TABLETOP_IDS}}

__all__ = ["EXPERTS", "ErrandsEnv", "ErrandsExpert", "GrandTourEnv", "GrandTourExpert", "LangTabletopEnv",
           "LangTabletopExpert", "LANG_TASKS",
           "PickPlaceEnv", "PushEnv", "ReachAvoidEnv", "ReachEnv", "SequenceEnv", "StackEnv", "TourEnv",
           "PickPlaceExpert", "PushExpert", "ReachAvoidExpert", "ReachExpert", "SequenceExpert", "StackExpert",
           "TourExpert", "TwoArmReachEnv", "TwoArmReachExpert"]
