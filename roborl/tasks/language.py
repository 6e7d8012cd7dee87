"""Instruction sets of the language-conditioned tabletop tasks: templates, paraphrases and parameters.

Every task family has several templates; each template is filled with the episode's parameters (the
cube's colour, the target ball's colour, the push direction), and every direction has several
phrasings, so one goal reads many ways ("push the red cube forward", "slide the red block ahead").
Directions are in the robot's frame: forward is away from its base (+x), left is +y.
"""
from __future__ import annotations

import torch

CUBE_COLORS = ("red", "blue")  # the scene's two cubes (tasks/assets/multitask_tabletop.xml)
TARGET_COLORS = ("green", "yellow", "purple")  # the reach task's three balls
TARGET_RGBA = ((0.1, 0.85, 0.1, 0.9), (0.95, 0.85, 0.1, 0.9), (0.6, 0.2, 0.85, 0.9))
DIRECTIONS = ("forward", "backward", "left", "right")
DIRECTION_XY = ((1.0, 0.0), (-1.0, 0.0), (0.0, 1.0), (0.0, -1.0))
DIRECTION_WORDS = {
    "forward": ("forward", "ahead", "away from the robot"),
    "backward": ("backward", "back", "toward the robot"),
    "left": ("left", "to the left", "to the robot's left"),
    "right": ("right", "to the right", "to the robot's right"),
}
TEMPLATES = {
    "reach": (
        "move the gripper to the {target} ball",
        "reach the {target} sphere",
        "touch the {target} ball with the gripper",
        "go to the {target} marker",
    ),
    "push": (
        "push the {cube} cube {direction}",
        "slide the {cube} block {direction}",
        "nudge the {cube} cube {direction} along the table",
        "move the {cube} cube {direction} without lifting it",
    ),
    "lift": (
        "pick up the {cube} cube",
        "lift the {cube} block",
        "grasp the {cube} cube and raise it",
        "pick the {cube} cube up off the table",
    ),
    "stack": (
        "put the {cube} cube on the {other} cube",
        "stack the {cube} block on top of the {other} block",
        "place the {cube} cube onto the {other} one",
    ),
}
TASK_NAMES = tuple(TEMPLATES)
MAX_WORDS = max(len(w) for w in DIRECTION_WORDS.values())


def instruction(task: str, template: int, cube: int = 0, target: int = 0, direction: int = 0, word: int = 0) -> str:
    """One instruction; indices wrap around, so any sampled integers give a valid sentence."""
    templates = TEMPLATES[task]
    words = DIRECTION_WORDS[DIRECTIONS[direction % len(DIRECTIONS)]]
    return templates[template % len(templates)].format(
        cube=CUBE_COLORS[cube % 2], other=CUBE_COLORS[(cube + 1) % 2], target=TARGET_COLORS[target % 3],
        direction=words[word % len(words)])


def instructions(tasks: torch.Tensor, template: torch.Tensor, cube: torch.Tensor, target: torch.Tensor,
                 direction: torch.Tensor, word: torch.Tensor) -> list[str]:
    """A batch of instructions from per-env indices (`tasks` indexes TASK_NAMES)."""
    rows = zip(tasks.tolist(), template.tolist(), cube.tolist(), target.tolist(), direction.tolist(), word.tolist())
    return [instruction(TASK_NAMES[t], *rest) for t, *rest in rows]


def all_instructions(task: str) -> list[str]:
    """Every distinct instruction of a task family (for vocabularies and tests)."""
    out = {instruction(task, t, c, g, d, w) for t in range(len(TEMPLATES[task])) for c in range(2)
           for g in range(len(TARGET_COLORS)) for d in range(len(DIRECTIONS)) for w in range(MAX_WORDS)}
    return sorted(out)
