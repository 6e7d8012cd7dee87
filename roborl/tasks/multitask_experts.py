"""The scripted expert of LangTabletop: the single-task experts run side by side on the whole batch (each
with its own phases) and every env takes the action of its own episode's task."""
from __future__ import annotations

import torch

from roborl.tasks.expert import ScriptedExpert
from roborl.tasks.language import TASK_NAMES
from roborl.tasks.multitask_tabletop import LangTabletopEnv
from roborl.tasks.pick_place import PickPlaceExpert
from roborl.tasks.push import PushExpert
from roborl.tasks.reach import ReachExpert
from roborl.tasks.stack import StackExpert

# the single-task experts read `goal`, `cube`, `push_direction`, `push_pose` and `stack_target`, which
# LangTabletopEnv defines per env for the instructed objects
SUB_EXPERTS: dict[str, type[ScriptedExpert]] = {"reach": ReachExpert, "push": PushExpert, "lift": PickPlaceExpert,
                                                "stack": StackExpert}


class LangTabletopExpert:
    def __init__(self, env: LangTabletopEnv) -> None:
        if not isinstance(env, LangTabletopEnv):
            raise ValueError(f"LangTabletopExpert drives LangTabletopEnv, not {type(env).__name__}")
        self.env = env
        self.experts = [SUB_EXPERTS[name](env) for name in TASK_NAMES]

    def reset(self, mask: torch.Tensor | None = None) -> None:
        for expert in self.experts:
            expert.reset(mask)

    def act(self, obs: dict | None = None) -> torch.Tensor:
        actions = torch.stack([expert.act(obs) for expert in self.experts], 0)
        return actions[self.env.task_id.to(actions.device), torch.arange(self.env.num_envs, device=actions.device)]
