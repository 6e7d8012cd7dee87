import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MUJOCO_GL", "egl")

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import ROOT, roborl  # noqa: E402

torch.set_num_threads(1)

TASKS = ["mujoco/Reach", "mujoco/Push", "mujoco/PickPlace", "mujoco/Stack", "mujoco/Sequence", "mujoco/ReachAvoid",
         "mujoco/Tour", "mujoco/GrandTour", "mujoco/Errands", "mujoco/TwoArmReach"]


@pytest.fixture(params=TASKS)
def task_id(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def reach_run(tmp_path_factory):
    """The Reach recipe trained for 80k steps by the CLI, once per session: test_training checks that it
    learned, test_franka drives a simulated FR3 with it. (the run directory, the finished process)"""
    run_dir = tmp_path_factory.mktemp("reach")
    proc = roborl("train", str(ROOT / "configs" / "ppo_reach.yaml"), f"train.run_dir={run_dir}", "train.name=learn",
                  "train.total_steps=80000", "train.eval_every=5", "train.video_envs=2", "train.progress=false")
    return run_dir / "learn", proc
