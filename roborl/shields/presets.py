"""Ready-made shields for the embedded tasks, for `env.shield.automaton: module:factory`."""
from __future__ import annotations

from pathlib import Path

from roborl import tasks
from roborl.rm import RewardMachine
from roborl.shields.automaton import AutomatonShield
from roborl.tasks.pick_place import GRIPPER_SAFETY_LABELS, gripper_safety_labels, keep_gripper_closed


def pick_place_gripper() -> AutomatonShield:
    """PickPlace: never open the gripper while the cube is lifted, unless it is at the goal
    (`tasks/pick_place_gripper.rm`); the fallback keeps the gripper closed."""
    machine = RewardMachine.from_file(Path(tasks.__file__).with_name("pick_place_gripper.rm"))
    return AutomatonShield(machine, list(GRIPPER_SAFETY_LABELS), gripper_safety_labels, keep_gripper_closed)
