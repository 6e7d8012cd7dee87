import numpy as np
import pytest
import torch
from contract import check_vecenv_contract
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode

from roborl import (
    sim,
    tasks,  # noqa: F401
)
from roborl.sim.gym_adapters import GymnasiumEnv, GymnasiumVectorEnv


@pytest.mark.parametrize("env_id", ["mujoco/Reach", "mujoco/PickPlace"])
def test_single_env_adapter_passes_gymnasium_env_checker(env_id):
    env = GymnasiumEnv(sim.make(env_id, 1))
    check_env(env, skip_render_check=True)


def test_vector_adapter_follows_gymnasium_vector_api():
    venv = GymnasiumVectorEnv(sim.make("mujoco/Push", 3, episode_length=4))
    assert venv.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    obs, info = venv.reset(seed=1)
    assert venv.observation_space.contains(obs.astype(np.float32))
    for _t in range(4):
        obs, reward, term, trunc, info = venv.step(venv.action_space.sample())
        assert obs.shape == venv.observation_space.shape and reward.shape == (3,)
        assert term.dtype == bool and trunc.dtype == bool
    assert trunc.all() and info["_final_obs"].all()
    assert all(f.shape == venv.single_observation_space.shape for f in info["final_obs"])
    assert not np.allclose(info["final_obs"][0], obs[0])
    # reset(seed) reproduces: the vector checks Gymnasium applies to its own vector envs
    a, _ = venv.reset(seed=9)
    b, _ = venv.reset(seed=9)
    np.testing.assert_array_equal(a, b)
    venv.close()


def test_gymnasium_env_as_vecenv():
    env = sim.make("gym/Pusher-v5", 3, episode_length=10)
    check_vecenv_contract(env, 25)
    assert env.max_episode_steps == 10
    env.close()


def test_gymnasium_action_rescaling():
    import gymnasium as gym

    env = sim.make("gym/Pendulum-v1", 1)
    env.reset(seed=0)
    obs, *_ = env.step(torch.ones(1, 1))  # +1 is the env's max torque, 2.0
    plain = gym.make("Pendulum-v1")
    plain.reset(seed=0)
    expect, *_ = plain.step(np.array([2.0], dtype=np.float32))
    np.testing.assert_allclose(obs["state"][0].numpy(), expect, rtol=1e-6)


def test_unknown_gymnasium_id():
    with pytest.raises(sim.SimError, match="Gymnasium could not make 'NoSuchEnv-v0'"):
        sim.make("gym/NoSuchEnv-v0", 1)
