import mujoco
import numpy as np
import pytest
import torch
from contract import check_vecenv_contract
from helpers import same_picture

from roborl import (
    sim,
    tasks,  # noqa: F401
)


def test_contract(task_id):
    env = sim.make(task_id, 4, episode_length=12)
    check_vecenv_contract(env, 30)
    assert env.instruction and env.reset()["instruction"] == [env.instruction] * 4
    assert len(env.label_names) >= 1
    env.close()


def test_time_limit_truncates_and_resets():
    env = sim.make("mujoco/Reach", 3, episode_length=5)
    env.reset(seed=0)
    for t in range(1, 6):
        obs, r, term, trunc, info = env.step(torch.zeros(3, 4))
        assert bool(trunc.all()) == (t == 5)
    assert (info["episode"]["length"] == 5).all()
    assert (env.elapsed == 0).all()
    # final_obs carries the goal of the finished episode, the new obs a freshly sampled one
    assert not torch.allclose(info["final_obs"]["state"][:, -6:-3], obs["state"][:, -6:-3])


def rollout(env_id: str, seed: int, steps: int = 40) -> torch.Tensor:
    env = sim.make(env_id, 4, seed=seed)
    obs = env.reset()
    gen = torch.Generator().manual_seed(0)
    states = [obs["state"]]
    for _ in range(steps):
        obs, *_ = env.step(torch.rand(4, env.action_dim, generator=gen) * 2 - 1)
        states.append(obs["state"])
    env.close()
    return torch.stack(states)


def test_same_seed_same_trajectory(task_id):
    a, b = rollout(task_id, 7), rollout(task_id, 7)
    assert torch.equal(a, b)
    assert not torch.equal(a, rollout(task_id, 8))


def test_reset_seed_reproduces_initial_states():
    env = sim.make("mujoco/Push", 8)
    a = env.reset(seed=5)["state"]
    env.step(torch.ones(8, 4))
    assert torch.equal(a, env.reset(seed=5)["state"])
    assert not torch.equal(a, env.reset(seed=6)["state"])


def test_bad_action_shape_is_refused():
    env = sim.make("mujoco/Reach", 2)
    env.reset()
    with pytest.raises(sim.SimError, match="action must have shape"):
        env.step(torch.zeros(3, 4))


def test_unknown_env_lists_available():
    with pytest.raises(sim.SimError, match="did you mean mujoco/Push.*available: .*mujoco/Reach"):
        sim.make("mujoco/Psh")


def test_controllers_move_the_arm():
    for controller, dim in [("ee_delta_pos", 4), ("joint_delta_pos", 8), ("joint_pos", 8)]:
        env = sim.make("mujoco/Reach", 2, controller=controller)
        env.reset(seed=0)
        assert env.action_dim == dim
        q0 = env.arm_q.clone()
        for _ in range(5):
            env.step(torch.full((2, dim), 0.5))
        assert (env.arm_q - q0).abs().max() > 0.05, controller


def test_ee_delta_moves_tcp_along_action():
    env = sim.make("mujoco/Reach", 4)
    env.reset(seed=1)
    for axis in range(3):
        start = env.tcp.clone()
        action = torch.zeros(4, 4)
        action[:, axis] = 1.0 if axis < 2 else -1.0
        for _ in range(3):
            env.step(action)
        moved = env.tcp - start
        sign = 1.0 if axis < 2 else -1.0
        assert (sign * moved[:, axis] > 0.03).all(), (axis, moved)
        others = [i for i in range(3) if i != axis]
        assert (moved[:, others].abs() < 0.5 * sign * moved[:, axis:axis + 1]).all()


def test_rgb_observations():
    env = sim.make("mujoco/Push", 2, obs_mode="rgb", render_size=(48, 64))
    obs = env.reset(seed=0)
    rgb = obs["rgb"]
    assert rgb.shape == (2, 48, 64, 3) and rgb.dtype == torch.uint8
    assert env.observation_space["rgb"].contains(rgb[0].numpy())
    assert rgb.float().std() > 5  # a real image, not a blank buffer
    before = rgb.clone()
    for _ in range(5):
        obs, *_ = env.step(torch.tensor([[0.0, 0.0, 1.0, 1.0]] * 2))
    assert (obs["rgb"].float() - before.float()).abs().mean() > 0.1  # the arm moved in the picture
    env.close()


def test_several_cameras_are_views_side_by_side():
    views = {}
    for camera in ("front", "workspace", "front+workspace"):
        env = sim.make("mujoco/PickPlace", 2, obs_mode="rgb", render_size=(48, 64), camera=camera)
        views[camera] = env.reset(seed=3)["rgb"]
        assert env.observation_space["rgb"].contains(views[camera][0].numpy())
        env.close()
    both = views["front+workspace"]
    assert both.shape == (2, 48, 128, 3)
    assert same_picture(both[:, :, :64], views["front"]) and same_picture(both[:, :, 64:], views["workspace"])
    assert torch.equal(both[0, :, :64], views["front"][0])  # drawn at the framebuffer's origin in both
    assert not same_picture(views["front"], views["workspace"])
    with pytest.raises(sim.SimError, match="unknown camera 'wrist'.*joined by \\+"):
        sim.make("mujoco/PickPlace", 1, obs_mode="rgb", camera="front+wrist")


def test_batched_physics_matches_single_env_physics():
    """N worlds stepped together equal each world stepped alone (no cross-talk in the batch)."""
    batch = sim.make("mujoco/PickPlace", 3, seed=11)
    batch.reset()
    singles = []
    for i in range(3):
        e = sim.make("mujoco/PickPlace", 1, seed=0)
        e.reset()
        e.state[:] = batch.state[i]
        e.state_version += 1
        singles.append(e)
    gen = torch.Generator().manual_seed(1)
    for _ in range(10):
        a = torch.rand(3, 4, generator=gen) * 2 - 1
        batch.step(a)
        for i, e in enumerate(singles):
            e.step(a[i:i + 1])
    for i, e in enumerate(singles):
        np.testing.assert_allclose(e.state[0], batch.state[i], atol=1e-9)


def test_diverged_physics_ends_the_episode_without_nans():
    env = sim.make("mujoco/Push", 3, seed=0)
    env.reset()
    env.qvel[1, 9:12] = float("nan")  # the cube of env 1 blows up
    env.state_version += 1
    obs, reward, term, trunc, info = env.step(torch.zeros(3, 4))
    assert term.tolist() == [False, True, False]
    assert torch.isfinite(obs["state"]).all() and torch.isfinite(reward).all()
    assert reward[1] == 0 and not info["success"][1]
    assert env.elapsed[1] == 0 and env.elapsed[0] == 1


def test_each_world_steps_exactly_as_one_mjdata_under_mj_step():
    """Control step after control step, through an episode's end and the reset after it, every world's state
    is bit-identical to its own MjData stepped by mj_step: the solver's warm start carries over from step
    to step (starting it cold at every control step moves a pushed cube by centimetres within an episode),
    and a reset starts it cold, as a new MjData does."""
    from roborl.tasks.push import PushExpert

    env = sim.make("mujoco/Push", 3, seed=0, episode_length=50)
    expert = PushExpert(env)
    env.reset()
    full = mujoco.mjtState.mjSTATE_FULLPHYSICS

    def fresh(row: np.ndarray) -> mujoco.MjData:
        data = mujoco.MjData(env.model)
        mujoco.mj_setState(env.model, data, row, full)
        return data

    datas = [fresh(row) for row in env.state]
    for _ in range(60):
        action = expert.act().double().clamp(-1, 1)
        ctrl = env._action_to_ctrl(action).numpy()  # what step() applies: IK from this state
        obs, reward, terminated, truncated, info = env.step(action)
        expert.reset(info["done"])
        for i, data in enumerate(datas):
            data.ctrl[:] = ctrl[i]
            mujoco.mj_step(env.model, data, nstep=env.substeps)
            if info["done"][i]:
                assert torch.equal(info["final_obs"]["state"][i, :7], torch.from_numpy(data.qpos[:7]).float())
                datas[i] = fresh(env.state[i])
            else:
                assert np.array_equal(env.qpos[i].numpy(), data.qpos) and np.array_equal(env.qvel[i].numpy(), data.qvel)
    assert env.elapsed.tolist() == [10, 10, 10]  # one reset on the way
    env.close()
