"""The Isaac Lab adapter: a one-line error where Isaac Lab is missing, and its pure mappings (obs, actions, dones).
The adapter itself runs only where Isaac Lab is installed (Python 3.12, CUDA GPU); nothing here fakes it."""
import importlib.util

import pytest
import torch
from helpers import ROOT, roborl_in_process
from test_cli_errors import assert_one_line_error

from roborl import sim
from roborl.sim.isaaclab_env import NOT_INSTALLED, policy_state, split_dones, to_task_action

CARTPOLE = "isaaclab/Isaac-Cartpole-Direct-v0"
missing = pytest.mark.skipif(importlib.util.find_spec("isaaclab") is not None, reason="Isaac Lab is installed")


@missing
def test_make_without_isaaclab_is_one_line():
    with pytest.raises(sim.SimError) as err:
        sim.make(CARTPOLE, 4)
    assert str(err.value) == NOT_INSTALLED and "\n" not in NOT_INSTALLED
    assert "isaaclab/<id>" in sim.available()


@missing
def test_train_without_isaaclab_exits_with_one_line(tmp_path):
    proc = roborl_in_process("train", str(ROOT / "configs" / "ppo_reach.yaml"), f"env.id={CARTPOLE}",
                             f"train.run_dir={tmp_path}", "train.name=isaac")
    assert_one_line_error(proc, NOT_INSTALLED)
    assert not (tmp_path / "isaac").exists()


def test_actions_are_scaled_where_unbounded_and_mapped_onto_bounds():
    inf = float("inf")
    low, high = torch.tensor([-inf, -inf, 0.0]), torch.tensor([inf, inf, 4.0])
    raw = to_task_action(torch.tensor([[0.5, -3.0, -1.0], [1.0, 0.2, 0.5]]), low, high, scale=2.0)
    assert torch.equal(raw, torch.tensor([[1.0, -2.0, 0.0], [2.0, 0.4, 3.0]]))


def test_time_outs_truncate_unless_the_horizon_is_finite():
    term, outs = torch.tensor([True, False, False]), torch.tensor([False, True, False])
    terminated, truncated = split_dones(term, outs, finite_horizon=False)
    assert terminated.tolist() == [True, False, False] and truncated.tolist() == [False, True, False]
    terminated, truncated = split_dones(term, outs, finite_horizon=True)
    assert terminated.tolist() == [True, True, False] and not truncated.any()


def test_policy_group_becomes_the_state():
    flat = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    assert torch.equal(policy_state({"policy": flat, "critic": torch.zeros(2, 9)}), flat.float())
    terms = {"joint_pos": torch.zeros(2, 2), "joint_vel": torch.ones(2, 3)}
    assert policy_state({"policy": terms}).tolist() == [[0, 0, 1, 1, 1]] * 2
    with pytest.raises(sim.SimError, match="no 'policy' observation group"):
        policy_state({"critic": flat})
    with pytest.raises(sim.SimError, match="image terms"):
        policy_state({"policy": {"rgb": torch.zeros(2, 8, 8, 3)}})
