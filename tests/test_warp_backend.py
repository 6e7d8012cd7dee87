"""The MuJoCo Warp backend (env.backend=warp) against the CPU backend on the same tasks and actions.

Tolerances, measured on warp's CPU device (Push, seeds 0-3, 4 envs, 30 control steps):
- free motion (Reach; Push before the fingers come within 6 cm of the cube): warp computes in float32,
  the CPU in float64; qpos and obs differed by at most 4e-6, qvel by 2e-5. Asserted: 1e-4 / 1e-3.
- pushing: arm joints differed by at most 4.3e-3 rad and cube positions by 3.5e-3 m. Asserted: 2e-2 rad,
  1e-2 m. The cube's orientation and angular velocity are not compared: the pushed cube rocks on its
  edges, and CPU MuJoCo with 1e-6 noise added to its state each step drifts from itself by as much
  (quaternion 0.1, 2.7 rad/s) as warp does, so that part of the trajectory is chaotic in either backend.
The first use of a model compiles warp's kernels: 50-100 s on a busy 2-core CPU, cached in ~/.cache/warp
(later loads take ~1 s).
"""
import sys

import pytest
import torch

from roborl import sim, tasks
from roborl.builder import make_env
from roborl.config import EnvConfig
from roborl.errors import UserError
from roborl.sim.randomization import Randomization
from roborl.tasks.arm import ARM_OBS

N = 4
FREE_POS, FREE_VEL = 1e-4, 1e-3
ARM_JOINTS, CUBE_POS = 2e-2, 1e-2
QUAT = slice(ARM_OBS["tcp"].stop + 3, ARM_OBS["tcp"].stop + 7)  # Push's obs: arm, cube position, cube quaternion


def trajectory(task: str, backend: str, seed: int, steps: int, actions: list | None = None) -> dict:
    """qpos, qvel, obs (steps+1 × N × ·) and the actions: the scripted expert's, or `actions` replayed."""
    env = sim.make(task, N, seed=seed, backend=backend)
    obs = env.reset(seed=seed)
    expert = tasks.EXPERTS[task](env)
    out = {"qpos": [env.qpos.clone()], "qvel": [env.qvel.clone()], "obs": [obs["state"]], "actions": []}
    if task == "mujoco/Push":
        out["gap"] = [(env.cube.pos - env.tcp).norm(dim=-1)]
    for t in range(steps):
        action = expert.act(obs) if actions is None else actions[t]
        obs, _, _, _, info = env.step(action)
        assert not info["done"].any()  # no auto-reset inside the compared window
        out["actions"].append(action)
        out["qpos"].append(env.qpos.clone())
        out["qvel"].append(env.qvel.clone())
        out["obs"].append(obs["state"])
        if "gap" in out:
            out["gap"].append((env.cube.pos - env.tcp).norm(dim=-1))
    env.close()
    return {k: (v if k == "actions" else torch.stack(v)) for k, v in out.items()}


def both(task: str, seed: int, steps: int) -> tuple[dict, dict]:
    """The CPU backend driven by the expert, and the warp backend replaying its actions."""
    cpu = trajectory(task, "mujoco", seed, steps)
    return cpu, trajectory(task, "warp", seed, steps, cpu["actions"])


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


@pytest.fixture(scope="module")
def push() -> tuple[dict, dict]:
    return both("mujoco/Push", seed=1, steps=30)


def test_push_free_motion_matches_to_float32_precision(push):
    cpu, warp = push
    free = int((cpu["gap"] < 0.06).any(-1).float().argmax())  # first step with a finger near a cube
    assert free >= 5
    assert max_err(cpu["qpos"][:free], warp["qpos"][:free]) < FREE_POS
    assert max_err(cpu["qvel"][:free], warp["qvel"][:free]) < FREE_VEL
    assert max_err(cpu["obs"][:free], warp["obs"][:free]) < FREE_POS


def test_push_moves_the_cube_alike_on_both_backends(push):
    cpu, warp = push
    assert max_err(cpu["qpos"][..., :9], warp["qpos"][..., :9]) < ARM_JOINTS
    assert max_err(cpu["qpos"][..., 9:12], warp["qpos"][..., 9:12]) < CUBE_POS
    keep = torch.ones(cpu["obs"].shape[-1], dtype=torch.bool)
    keep[QUAT] = False
    assert max_err(cpu["obs"][..., keep], warp["obs"][..., keep]) < ARM_JOINTS
    for run in (cpu, warp):  # the comparison covers real pushing, not a resting scene
        assert (run["qpos"][-1, :, :7] - run["qpos"][0, :, :7]).abs().max() > 0.1
        assert ((run["qpos"][-1, :, 9:11] - run["qpos"][0, :, 9:11]).norm(dim=-1) > 0.01).all()
    assert not torch.equal(cpu["qpos"], warp["qpos"])  # warp stepped: float32 never reproduces float64 exactly


def test_reach_matches_to_float32_precision():
    cpu, warp = both("mujoco/Reach", seed=0, steps=10)
    assert (cpu["qpos"][-1, :, :7] - cpu["qpos"][0, :, :7]).abs().max() > 0.1
    assert max_err(cpu["qpos"], warp["qpos"]) < FREE_POS
    assert max_err(cpu["qvel"], warp["qvel"]) < FREE_VEL
    assert max_err(cpu["obs"], warp["obs"]) < FREE_POS


def test_latency_and_obs_noise_randomization_work_on_warp():
    spec = {"latency_ms": [0, 30], "obs_noise": 0.01, "action_delay": [0, 1]}
    envs = [sim.make("mujoco/Reach", 2, seed=0, backend=backend, randomization=Randomization(**spec))
            for backend in ("mujoco", "warp")]
    actions = torch.rand(5, 2, 4, generator=torch.Generator().manual_seed(0)) * 2 - 1
    states = []
    for env in envs:
        states.append(torch.stack([env.reset(seed=0)["state"]] + [env.step(a)[0]["state"] for a in actions]))
        env.close()
    assert max_err(*states) < FREE_POS
    assert max_err(states[0][0], states[0][-1]) > 0.01


def test_diverged_world_ends_its_episode_on_warp():
    env = sim.make("mujoco/Push", 3, seed=0, backend="warp")
    env.reset()
    env.qvel[1, 9:12] = float("nan")  # the cube of env 1 blows up
    env.state_version += 1
    obs, reward, term, *_ = env.step(torch.zeros(3, 4))
    assert term.tolist() == [False, True, False]
    assert torch.isfinite(obs["state"]).all() and torch.isfinite(reward).all()
    assert env.elapsed.tolist() == [1, 0, 1]
    obs, reward, term, *_ = env.step(torch.zeros(3, 4))  # the world's NaNs did not stay in warp's buffers
    assert not term.any() and torch.isfinite(obs["state"]).all()
    env.close()


def test_env_backend_in_the_config_reaches_the_env():
    env = make_env(EnvConfig(id="mujoco/Reach", backend="warp"), 1, 0, torch.device("cpu"))
    assert env.unwrapped.backend == "warp"
    env.close()


def test_unknown_backend_names_the_options():
    with pytest.raises(sim.SimError, match="unknown physics backend 'mjx'; available: mujoco, warp"):
        sim.make("mujoco/Reach", 1, backend="mjx")


def test_physical_randomization_is_refused_on_warp():
    with pytest.raises(sim.SimError, match="not supported yet with backend 'warp'"):
        sim.make("mujoco/Push", 2, backend="warp", randomization=Randomization(friction=[0.5, 1.5]))


def test_missing_mujoco_warp_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mujoco_warp", None)  # what `import mujoco_warp` sees when not installed
    with pytest.raises(sim.SimError, match="pip install mujoco-warp"):
        sim.make("mujoco/Reach", 1, backend="warp")


def test_backend_of_a_non_mujoco_env_is_a_user_error():
    with pytest.raises(UserError, match="env.backend 'warp'"):
        make_env(EnvConfig(id="gym/Pusher-v5", backend="warp"), 1, 0, torch.device("cpu"))
