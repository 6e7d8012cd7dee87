"""Demonstrations as LeRobot v3 datasets both ways: `roborl demos --format lerobot` writes one that LeRobot's own
`LeRobotDataset` reads back (states, actions, tasks, the camera's video), `roborl bc` trains from it with the
same windows as from the HDF5 recording, and a bad target or a broken dataset is a one-line error."""
import json
import os

import h5py
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from roborl import cli  # noqa: E402
from roborl.algos.bc import BC  # noqa: E402
from roborl.builder import make_env, make_policy  # noqa: E402
from roborl.config import config_from_dict  # noqa: E402
from roborl.demos import load_demos, record_demos  # noqa: E402
from roborl.errors import UserError  # noqa: E402
from roborl.lerobot_dataset import write_dataset  # noqa: E402
from roborl.policies.lerobot import compat  # noqa: E402

compat.require()
from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: E402

TASK = "mujoco/LangTabletopFixed-ReachPushLift"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Six LangTabletop episodes with 32×32 frames, as HDF5 and as the LeRobot dataset written from it."""
    root = tmp_path_factory.mktemp("demos")
    record_demos(TASK, 6, root / "hdf5", num_envs=6, seed=0, rgb=True, render_size=(32, 32), progress=False,
                 episode_length=20)
    write_dataset(root / "hdf5", root / "lerobot", progress=False)
    return root


def test_lerobot_reads_back_what_roborl_wrote(recorded):
    dataset = LeRobotDataset("local/lerobot", root=recorded / "lerobot")
    with h5py.File(recorded / "hdf5" / "demos.hdf5") as f:
        episodes = [f["data"][f"demo_{i}"] for i in range(6)]
        states = torch.cat([torch.from_numpy(g["obs/state"][()]) for g in episodes])
        actions = torch.cat([torch.from_numpy(g["actions"][()]) for g in episodes])
        frames = torch.cat([torch.from_numpy(g["obs/rgb"][()]) for g in episodes])
        instructions = [str(g.attrs["instruction"]) for g in episodes for _ in range(len(g["actions"]))]
    assert len(dataset) == len(states) == 120 and dataset.meta.total_episodes == 6
    table = dataset.hf_dataset.with_format("torch")[:]
    assert torch.equal(table["observation.state"], states)
    assert torch.equal(table["action"], actions)
    for i in (0, 37, 119):
        item = dataset[i]
        assert item["task"] == instructions[i]
        decoded = (item["observation.images.camera"] * 255).permute(1, 2, 0)
        assert decoded.shape == (32, 32, 3)
        assert (decoded - frames[i].float()).abs().mean() < 12  # AV1 is lossy; another frame differs by far more
    assert json.loads((recorded / "lerobot" / "meta" / "info.json").read_text())["roborl"]["env_args"]["env_id"] == TASK


def test_bc_reads_the_same_windows_from_the_lerobot_dataset_and_trains(recorded):
    ours = load_demos(recorded / "hdf5", obs_history=1, horizon=4, success_only=False, images=True)
    theirs = load_demos(recorded / "lerobot", obs_history=1, horizon=4, success_only=False, images=True)
    assert torch.equal(ours.obs, theirs.obs) and torch.equal(ours.actions, theirs.actions)
    assert ours.instructions == theirs.instructions and ours.env_args == theirs.env_args
    assert (ours.rgb.float() - theirs.rgb.float()).abs().mean() < 12
    successes = load_demos(recorded / "hdf5", horizon=4, images=True).episodes
    assert load_demos(recorded / "lerobot", horizon=4, images=True).episodes == successes
    cfg = config_from_dict({"env": {"id": TASK, "obs_mode": "rgb", "render_size": [32, 32], "action_chunk": 2},
                            "policy": {"kind": "lerobot", "horizon": 4, "steps": 4,
                                       "lerobot": {"type": "act", "hidden": 32, "layers": 1}},
                            "bc": {"demos": str(recorded / "lerobot"), "steps": 60, "eval_every": 30, "batch_size": 32,
                                   "success_only": False}})
    env = make_env(cfg.env, 1, 0, torch.device("cpu"))
    try:
        torch.manual_seed(0)
        policy = make_policy(cfg.policy, env, 2)
        bc = BC(policy, cfg, env, torch.device("cpu"))
        first, second = bc.update()["loss"], bc.update()["loss"]
    finally:
        env.close()
    assert second < first


def test_demos_format_lerobot_writes_nothing_over_an_existing_directory(tmp_path, capsys):
    target = tmp_path / "taken"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    code = cli.main(["demos", "Push", "--episodes", "1", "--envs", "1", "--format", "lerobot", "--out", str(target),
                     "--quiet"])
    assert code == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    code = cli.main(["demos", "Push", "--episodes", "2", "--envs", "2", "--episode-length", "5", "--format", "lerobot",
                     "--out", str(tmp_path / "push"), "--quiet"])
    assert code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["push", "taken"]  # no temporary recording left behind
    assert LeRobotDataset("local/push", root=tmp_path / "push").meta.total_episodes == 2


def test_a_broken_lerobot_dataset_is_a_one_line_error(recorded, tmp_path):
    broken = tmp_path / "broken"
    (broken / "meta").mkdir(parents=True)
    (broken / "meta" / "info.json").write_text("{not json")
    with pytest.raises(UserError, match="not a readable LeRobot v3 dataset"):
        load_demos(broken, horizon=4)
