import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MUJOCO_GL", "egl")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

TASKS = ["mujoco/Reach", "mujoco/Push", "mujoco/PickPlace", "mujoco/Stack", "mujoco/Sequence", "mujoco/ReachAvoid"]


@pytest.fixture(params=TASKS)
def task_id(request) -> str:
    return request.param
