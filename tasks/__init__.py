"""Embedded arm tasks (MJCF in `tasks/assets`, no downloads). Importing registers `mujoco/<Task>`."""
from tasks.language import TASK_NAMES as LANG_TASKS
from tasks.multitask_experts import LangTabletopExpert
from tasks.multitask_tabletop import LANG_TABLETOP_IDS, LangTabletopEnv
from tasks.pick_place import PickPlaceEnv, PickPlaceExpert
from tasks.push import PushEnv, PushExpert
from tasks.reach import ReachEnv, ReachExpert
from tasks.reach_avoid import ReachAvoidEnv, ReachAvoidExpert
from tasks.sequence import SequenceEnv, SequenceExpert
from tasks.stack import StackEnv, StackExpert

EXPERTS = {"mujoco/Reach": ReachExpert, "mujoco/Push": PushExpert,
           "mujoco/PickPlace": PickPlaceExpert, "mujoco/Stack": StackExpert, "mujoco/Sequence": SequenceExpert,
           "mujoco/ReachAvoid": ReachAvoidExpert, **{task: LangTabletopExpert for task in LANG_TABLETOP_IDS}}

__all__ = ["EXPERTS", "LangTabletopEnv", "LangTabletopExpert", "LANG_TASKS",
           "PickPlaceEnv", "PushEnv", "ReachAvoidEnv", "ReachEnv", "SequenceEnv", "StackEnv",
           "PickPlaceExpert", "PushExpert", "ReachAvoidExpert", "ReachExpert", "SequenceExpert", "StackExpert"]
