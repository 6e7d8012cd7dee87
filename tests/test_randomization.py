"""Domain randomization on the batched MuJoCo backend, checked against the nominal env, against MuJoCo
stepped by hand, and against shifted action sequences."""
import copy
from pathlib import Path

import mujoco
import numpy as np
import pytest
import torch

from roborl import (
    sim,
    tasks,  # noqa: F401
)
from roborl.builder import make_env
from roborl.config import load_config
from roborl.errors import UserError
from roborl.sim.randomization import Randomization
from roborl.tasks.arm import ASSETS

FULL = mujoco.mjtState.mjSTATE_FULLPHYSICS
PHYSICS = dict(object_mass=[0.5, 2.0], friction=[0.3, 1.2], damping=[0.7, 1.3], actuator_gain=[0.7, 1.3])


def actions(steps: int, n: int, dim: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(steps, n, dim, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def states(env: sim.VecEnv, acts: torch.Tensor, seed: int = 0) -> torch.Tensor:
    out = [env.reset(seed=seed)["state"]]
    out += [env.step(a)[0]["state"] for a in acts]
    env.close()
    return torch.stack(out)


def test_params_differ_across_envs_and_are_resampled_only_for_envs_that_reset():
    env = sim.make("mujoco/Push", 4, seed=0, randomization=Randomization(**PHYSICS, latency_ms=[0, 30]))
    env.reset()
    params = env.randomizer.params
    before = {k: v.clone() for k, v in params.items()}
    assert all(len(v.unique()) == 4 for v in before.values())
    ending = torch.tensor([True, False, True, False])
    env.termination_hooks.append(lambda labels, terms: ending)
    _, _, terminated, _, _ = env.step(torch.zeros(4, 4))
    assert torch.equal(terminated, ending)
    for name, value in params.items():
        assert (value[ending] != before[name][ending]).all(), name
        assert torch.equal(value[~ending], before[name][~ending]), name
    cube = env.model.body("cube").id
    for i, m in enumerate(env.randomizer.models):
        assert m is not env.model
        assert m.body_mass[cube] == env.model.body_mass[cube] * params["object_mass"][i].item()
        assert np.array_equal(m.geom_friction[:, 0], env.model.geom_friction[:, 0] * params["friction"][i].item())
        assert np.array_equal(m.dof_damping, env.model.dof_damping * params["damping"][i].item())
        kp = m.actuator_gainprm[:, 0]
        assert np.array_equal(kp, env.model.actuator_gainprm[:, 0] * params["actuator_gain"][i].item())
        assert np.array_equal(m.actuator_biasprm[:, 1], -kp)  # still a position servo
    env.close()


def test_fixed_perturbation_lands_exactly_in_the_model_and_never_compounds():
    twin = Randomization(object_mass=[1.5, 1.5], friction=[0.5, 0.5], latency_ms=[20, 20])
    env = sim.make("mujoco/Push", 1, seed=0, randomization=twin, episode_length=3)
    nominal = mujoco.MjModel.from_xml_path(str(ASSETS / "push.xml"))
    cube = nominal.body("cube").id
    env.reset()
    for _ in range(10):
        env.reset()
    for _ in range(10):  # three more episodes through auto-reset
        env.step(torch.zeros(1, 4))
    (m,) = env.randomizer.models
    assert m.body_mass[cube] == nominal.body_mass[cube] * 1.5
    assert np.array_equal(m.body_inertia[cube], nominal.body_inertia[cube] * 1.5)
    assert np.array_equal(m.body_mass[:cube], nominal.body_mass[:cube])  # the arm keeps its masses
    assert np.array_equal(m.geom_friction[:, 0], nominal.geom_friction[:, 0] * 0.5)
    assert np.array_equal(m.geom_friction[:, 1:], nominal.geom_friction[:, 1:])
    assert np.array_equal(env.model.body_mass, nominal.body_mass)  # the shared model stays nominal
    assert np.array_equal(env.model.geom_friction, nominal.geom_friction)


def test_same_seed_same_samples():
    def samples(seed: int) -> dict:
        env = sim.make("mujoco/Push", 3, seed=seed, episode_length=2,
                       randomization=Randomization(**PHYSICS, action_delay=[0, 2], light=[0.5, 1.5]))
        env.reset()
        for _ in range(3):
            env.step(torch.zeros(3, 4))
        env.close()
        return env.randomizer.params

    a, b, c = samples(3), samples(3), samples(4)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["friction"], c["friction"])


def test_identity_perturbations_reproduce_the_nominal_trajectory_exactly():
    acts = actions(20, 3, 4)
    nominal = states(sim.make("mujoco/Push", 3, seed=1), acts)
    identity = Randomization(object_mass=[1, 1], friction=[1, 1], damping=[1, 1], actuator_gain=[1, 1],
                             latency_ms=[0, 0], action_delay=[0, 0])
    assert torch.equal(states(sim.make("mujoco/Push", 3, seed=1, randomization=identity), acts), nominal)
    late = states(sim.make("mujoco/Push", 3, seed=1, randomization=Randomization(latency_ms=[20, 20])), acts)
    assert torch.equal(late[0], nominal[0]) and not torch.allclose(late[1:], nominal[1:], atol=1e-4)
    off = sim.make("mujoco/Push", 3, seed=1, randomization=Randomization())
    assert off.randomizer is None and off.physics.models is None  # every world steps the env's own model


def test_latency_holds_the_previous_control_for_the_first_substeps_on_each_envs_own_model():
    spec = Randomization(**PHYSICS, latency_ms=[20, 20])  # 4 of the 10 substeps of 5 ms
    env = sim.make("mujoco/Push", 2, seed=2, controller="joint_pos", episode_length=4, randomization=spec)
    env.reset()
    models = env.randomizer.models
    datas = [mujoco.MjData(m) for m in models]
    for m, d, row in zip(models, datas, env.state):
        mujoco.mj_setState(m, d, row, FULL)
    prev = [None, None]  # an episode's first command has no predecessor: it holds from the start
    for a in actions(10, 2, 8, seed=1):
        ctrl = env._action_to_ctrl(a.double()).numpy()
        stepped = [copy.copy(m) for m in models]  # an env that resets gets new parameters inside step
        obs, *_, info = env.step(a)
        for i, (m, d) in enumerate(zip(stepped, datas)):
            held = ctrl[i] if prev[i] is None else prev[i]
            for sub in range(env.substeps):
                d.ctrl[:] = held if sub < 4 else ctrl[i]
                mujoco.mj_step(m, d)
            prev[i] = ctrl[i]
            if info["done"][i]:  # the episode's last arm joints, then the new episode from its reset state
                assert np.allclose(d.qpos[:7], info["final_obs"]["state"][i, :7].numpy(), atol=1e-6)
                mujoco.mj_setState(m, d, env.state[i], FULL)
                prev[i] = None
            else:
                assert np.allclose(d.qpos, env.qpos[i].numpy(), atol=1e-10)
    env.close()


def test_action_delay_shifts_each_envs_actions_and_restarts_with_each_episode():
    n, steps = 4, 13
    acts = actions(steps, n, 4, seed=3)
    delayed = sim.make("mujoco/Push", n, seed=5, episode_length=5, randomization=Randomization(action_delay=[0, 3]))
    plain = sim.make("mujoco/Push", n, seed=5, episode_length=5, randomization=Randomization(action_delay=[0, 0]))
    delayed.reset(), plain.reset()
    history: list[list[torch.Tensor]] = [[] for _ in range(n)]
    seen = set()
    for a in acts:
        delay = delayed.randomizer.params["action_delay"].clone()
        seen |= set(delay.tolist())
        shifted = torch.empty_like(a)
        for i in range(n):
            history[i].append(a[i])
            shifted[i] = history[i][max(len(history[i]) - 1 - int(delay[i]), 0)]
        obs, *_, info = delayed.step(a)
        obs_plain, *_ = plain.step(shifted)
        assert torch.equal(obs["state"], obs_plain["state"])
        for i in info["done"].nonzero().flatten().tolist():
            history[i] = []
    assert len(seen) > 1 and max(seen) > 0


def test_obs_noise_has_the_configured_std():
    acts = actions(3, 32, 4)
    clean = states(sim.make("mujoco/Push", 32, seed=0), acts)
    noisy = states(sim.make("mujoco/Push", 32, seed=0, randomization=Randomization(obs_noise=0.05)), acts)
    for t in range(len(acts) + 1):
        diff = noisy[t] - clean[t]
        assert abs(diff.std().item() - 0.05) < 0.005 and abs(diff.mean().item()) < 0.005
    assert not torch.equal(noisy[1] - clean[1], noisy[2] - clean[2])  # fresh noise every step


def test_camera_and_light_overrides_change_each_envs_frame():
    def env(spec=None):
        return sim.make("mujoco/Push", 2, seed=0, obs_mode="rgb", render_size=(32, 32), randomization=spec)

    base = env()
    frames = base.reset()["rgb"]
    dark = env(Randomization(light=[0.3, 0.3])).reset()["rgb"]
    assert (dark.float().mean((1, 2, 3)) < frames.float().mean((1, 2, 3)) - 5).all()
    assert torch.equal(env(Randomization(light=[1, 1])).reset()["rgb"], frames)
    moved = env(Randomization(camera_pos=0.1))
    moved_frames = moved.reset()["rgb"]
    nominal_cam = base.model.cam_pos.copy()
    for i in range(2):
        assert not torch.equal(moved_frames[i], frames[i])
        base.model.cam_pos[:] = nominal_cam + moved.randomizer.params["camera_pos"][i].numpy()
        assert torch.equal(base.render([i])[0], moved_frames[i])  # env i's own camera offset
    assert np.array_equal(moved.model.cam_pos, nominal_cam)  # restored after rendering
    base.close()
    moved.close()


@pytest.mark.parametrize("field,value", [
    ("object_mass", [2.0, 1.0]), ("friction", [0.0, 1.0]), ("damping", [1.0]), ("actuator_gain", [1, 2, 3]),
    ("action_delay", [-1, 2]), ("latency_ms", [0, 50]), ("obs_noise", -0.1), ("light", [-1.0, 1.0]),
])
def test_bad_ranges_name_the_field(field, value):
    with pytest.raises(sim.SimError, match=f"randomization {field}"):
        sim.make("mujoco/Push", 1, randomization=Randomization(**{field: value}))


def test_config_section_is_checked_and_builds_the_randomized_env():
    with pytest.raises(UserError, match=r"unknown config key 'env.randomize.bogus'"):
        load_config(None, ["env.randomize.bogus=1"])
    with pytest.raises(UserError, match=r"'env.randomize.friction' must be a list of float"):
        load_config(None, ["env.randomize.friction=0.5"])
    cfg = load_config(Path(__file__).parents[1] / "configs/ppo_push_dr.yaml", ["env.num_envs=2"])
    assert cfg.env.randomize.object_mass == [0.5, 2.0] and cfg.train.name == "ppo_push_dr"
    env = make_env(cfg.env, 2, 0, torch.device("cpu"))
    assert env.unwrapped.randomizer.spec == cfg.env.randomize and env.unwrapped.randomizer.models is not None
    env.close()
    gym_cfg = load_config(None, ["env.id=gym/Pusher-v5", "env.randomize.friction=[0.5,1.0]"])
    with pytest.raises(UserError, match="env.randomize works on the embedded mujoco/ tasks, not gym/Pusher-v5"):
        make_env(gym_cfg.env, 1, 0, torch.device("cpu"))
