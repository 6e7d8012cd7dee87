"""LIBERO through its process boundary (sim/libero_env.py). Runs for real: without .venv-libero these
tests fail with the message that says how to make it (bash scripts/setup_libero.sh)."""
import os
import signal
import time

import numpy as np
import pytest
import torch

from roborl import sim
from roborl.sim.libero_env import LiberoVecEnv


@pytest.fixture(scope="module")
def rgb_env():
    env = sim.make("libero/libero_spatial", 1, task_ids=[3], episode_start=2, num_steps_wait=0, image_size=64)
    yield env
    env.close()


@pytest.fixture(scope="module")
def state_env():
    env = sim.make("libero/libero_spatial", 2, task_ids=[0], obs_mode="state", workers=2)
    yield env
    env.close()


def test_missing_libero_python_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("ROBORL_LIBERO_PYTHON", "/nonexistent/python")
    with pytest.raises(sim.SimError, match="bash scripts/setup_libero.sh"):
        sim.make("libero/libero_spatial", 1)


def test_task_builds_and_its_fixed_initial_state_loads(rgb_env):
    assert isinstance(rgb_env, LiberoVecEnv) and rgb_env.max_episode_steps == 220
    obs = rgb_env.reset()
    assert obs["state"].shape == (1, 8) and obs["state"].dtype == torch.float32
    for key in ("rgb", "wrist_rgb"):
        assert obs[key].shape == (1, 64, 64, 3) and obs[key].dtype == torch.uint8
        assert obs[key].float().std() > 5  # a rendered scene, not a blank frame
    assert obs["instruction"] == rgb_env.instructions and "black bowl" in obs["instruction"][0]
    assert rgb_env.init_state.tolist() == [2]  # episode_start=2: this episode is the benchmark's init state 2
    benchmark_states = rgb_env.benchmark_init_states(0)
    assert benchmark_states.shape[0] == 50
    np.testing.assert_array_equal(rgb_env.sim_states()[0], benchmark_states[2])
    obs, reward, term, trunc, info = rgb_env.step(torch.zeros(1, 7))
    assert reward.tolist() == [0.0] and not (term | trunc).any() and info["labels"].shape == (1, 0)
    assert obs["rgb"].shape == (1, 64, 64, 3)


def test_full_episode_to_the_suite_step_limit(state_env):
    """Random actions through the pipe until LIBERO-spatial's 220-step limit (or, by luck, success)."""
    env = state_env
    obs = env.reset(seed=3)
    assert env.init_state.tolist() == [0, 1]  # two envs on one task share its init states 0, 1, 2, ...
    first = obs["state"].clone()
    g = torch.Generator().manual_seed(0)
    for t in range(1, env.max_episode_steps + 1):  # noqa: B007 (t is read after the loop)
        obs, reward, term, trunc, info = env.step(torch.rand(2, 7, generator=g) * 2 - 1)
        assert torch.isfinite(obs["state"]).all() and info["success"].dtype == torch.bool
        done = term | trunc
        if done.all():
            break
        assert not done.any(), "the two envs ended at different steps"
    assert done.all()
    assert (term == info["success"]).all() and (trunc == ~term).all()
    if trunc.any():
        assert t == 220
    assert info["episode"]["length"].tolist() == [t, t]
    assert info["episode"]["init_state"].tolist() == [0, 1] and env.init_state.tolist() == [2, 3]
    final = info["final_obs"]["state"]
    assert final.shape == (2, 8) and not torch.allclose(final, obs["state"])
    assert not torch.allclose(final, first)  # the arm moved during the episode


def test_malformed_requests_get_errors_and_the_server_survives(rgb_env):
    server = rgb_env.servers[0]
    server.send_frame(b"\xc1 not msgpack")
    with pytest.raises(sim.SimError, match="not a msgpack message"):
        server.receive()
    with pytest.raises(sim.SimError, match="unknown command 'fly'"):
        server.request({"cmd": "fly"})
    with pytest.raises(sim.SimError, match=r"'action' must be a float array of shape \(1, 7\)"):
        server.request({"cmd": "step", "action": np.zeros((1, 3), np.float32)})
    with pytest.raises(sim.SimError, match=r"action must have shape \(1, 7\)"):
        rgb_env.step(torch.zeros(2, 7))
    obs, *_ = rgb_env.step(torch.zeros(1, 7))  # still serving
    assert obs["state"].shape == (1, 8)


def test_killed_server_is_a_clear_error_not_a_hang(rgb_env):
    server = rgb_env.servers[0]
    os.kill(server.pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(sim.SimError, match=rf"LIBERO server \(pid {server.pid}\) exited \(code -9\)"):
        rgb_env.step(torch.zeros(1, 7))
    assert time.monotonic() - start < 10
    server.log_path.unlink()  # kept after an unclean exit, for the user to read; here it was expected
