"""LangTabletop: the VecEnv contract with images and instructions, instruction sampling, group resets,
the scripted experts and demonstrations that keep their instructions."""
import h5py
import pytest
import torch
from contract import check_vecenv_contract

from roborl import sim, tasks
from roborl.demos import load_demos, record_demos
from roborl.tasks.language import TASK_NAMES, all_instructions
from roborl.tasks.multitask_experts import LangTabletopExpert

ARM_STATE = 18  # joints, joint velocities, gripper, TCP (tasks/arm.py ARM_OBS)


def test_contract_with_images_and_instructions():
    env = sim.make("mujoco/LangTabletop", 4, episode_length=12)
    check_vecenv_contract(env, 30)
    obs = env.reset(seed=0)
    assert obs["rgb"].shape == (4, 64, 64, 3) and obs["rgb"].dtype == torch.uint8
    assert obs["rgb"].float().std() > 5
    assert obs["state"].shape == (4, ARM_STATE)  # proprioception only: the objects are in the image
    assert len(obs["instruction"]) == 4 and all(isinstance(s, str) and s for s in obs["instruction"])
    assert obs["task_id"].dtype == torch.long and obs["task_id"].shape == (4,)
    env.close()


def test_privileged_state_is_an_option():
    assert sim.make("mujoco/LangTabletop", 2, obs_mode="state").observation_space["state"].shape[0] > ARM_STATE
    env = sim.make("mujoco/LangTabletop", 2, privileged_state=True)
    assert env.reset(seed=0)["state"].shape[1] > ARM_STATE and "rgb" in env.observation_space.spaces


def test_critic_state_is_the_privileged_state_kept_out_of_the_policy_state():
    plain = sim.make("mujoco/LangTabletop", 3, privileged_state=True, episode_length=2)
    env = sim.make("mujoco/LangTabletop", 3, critic_state=True, episode_length=2)
    assert env.observation_space["critic_state"].shape == (plain.observation_space["state"].shape[0] - ARM_STATE,)
    obs, ref = env.reset(seed=4), plain.reset(seed=4)
    assert obs["state"].shape == (3, ARM_STATE) and torch.equal(obs["critic_state"], ref["state"][:, ARM_STATE:])
    action = torch.zeros(3, env.action_dim)
    env.step(action)
    _, _, _, truncated, info = env.step(action)
    assert truncated.all() and torch.equal(info["final_obs"]["critic_state"][:, -4:].sum(-1), torch.ones(3))
    with pytest.raises(sim.SimError, match="ReachEnv has no privileged critic state; set env.critic_state false"):
        sim.make("mujoco/Reach", 1, critic_state=True)


def test_instructions_vary_and_name_the_episode():
    env = sim.make("mujoco/LangTabletop", 64, obs_mode="state")
    obs = env.reset(seed=1)
    assert set(obs["task_id"].tolist()) == set(range(len(TASK_NAMES)))
    assert len(set(obs["instruction"])) > 20
    for text, task in zip(obs["instruction"], obs["task_id"].tolist()):
        assert text in all_instructions(TASK_NAMES[task])
    reach = (obs["task_id"] == TASK_NAMES.index("reach")).nonzero().flatten().tolist()
    for i in reach:  # the instruction names the ball that is the goal
        color = ("green", "yellow", "purple")[int(env.target[i])]
        assert color in obs["instruction"][i]
    assert obs["instruction"] != env.reset(seed=2)["instruction"]


def test_tasks_option_restricts_the_tasks():
    env = sim.make("mujoco/LangTabletop", 16, obs_mode="state", tasks=("push", "lift"))
    ids = env.reset(seed=0)["task_id"]
    assert set(ids.tolist()) == {TASK_NAMES.index("push"), TASK_NAMES.index("lift")}
    only = sim.make("mujoco/LangTabletop-Push", 8, obs_mode="state").reset(seed=0)
    assert all(s in all_instructions("push") for s in only["instruction"])
    with pytest.raises(sim.SimError, match="unknown LangTabletop tasks.*available: reach"):
        sim.make("mujoco/LangTabletop", 2, tasks=("fly",))


def test_task_weights_set_how_often_each_task_is_sampled():
    env = sim.make("mujoco/LangTabletopFixed-ReachPushLift", 600, obs_mode="state")
    reach, push, lift = (TASK_NAMES.index(t) for t in ("reach", "push", "lift"))
    env.set_task_weights({"push": 2})
    counts = torch.bincount(env.reset(seed=0)["task_id"], minlength=len(TASK_NAMES)).double() / 600
    assert abs(counts[push] - 0.5) < 0.06 and abs(counts[reach] - 0.25) < 0.06 and abs(counts[lift] - 0.25) < 0.06
    env.set_task_weights({"reach": 0, "lift": 3})
    counts = torch.bincount(env.reset(seed=0)["task_id"], minlength=len(TASK_NAMES)).double() / 600
    assert counts[reach] == 0 and abs(counts[lift] - 0.75) < 0.06
    obs = env.reset(seed=1, options={"group_size": 10})  # weighted draws keep each group on one start
    assert torch.equal(obs["state"].view(60, 10, -1), obs["state"][::10, None].expand(60, 10, -1))
    env.set_task_weights({})
    uniform = env.reset(seed=0)["task_id"]
    assert torch.equal(uniform, sim.make("mujoco/LangTabletopFixed-ReachPushLift", 600, obs_mode="state")
                       .reset(seed=0)["task_id"])  # no weights: the draws of an env that never had any
    with pytest.raises(sim.SimError, match=r"task weights name \['stack'\].*its tasks: reach, push, lift"):
        env.set_task_weights({"stack": 1})
    with pytest.raises(sim.SimError, match="must be finite, ≥ 0 and not all 0"):
        env.set_task_weights({"reach": 0, "push": 0, "lift": 0})


def test_group_reset_gives_identical_starts_within_groups():
    env = sim.make("mujoco/LangTabletop", 8, episode_length=20)
    obs = env.reset(seed=4, options={"group_size": 4})
    for key in ("state", "rgb", "task_id"):
        v = obs[key]
        assert torch.equal(v[0], v[1]) and torch.equal(v[0], v[3]) and torch.equal(v[4], v[7]), key
    assert torch.equal(torch.from_numpy(env.state[1]), torch.from_numpy(env.state[2]))  # the whole physics state
    assert obs["instruction"][:4] == [obs["instruction"][0]] * 4
    assert not torch.equal(torch.from_numpy(env.state[0]), torch.from_numpy(env.state[4]))
    assert not torch.equal(obs["rgb"][0], obs["rgb"][4])
    plain = env.reset(seed=4)  # without the option every env draws its own start
    assert not torch.equal(plain["rgb"][0], plain["rgb"][1])
    with pytest.raises(sim.SimError, match="group_size must be a positive divisor of num_envs"):
        env.reset(options={"group_size": 3})
    with pytest.raises(sim.SimError, match="unknown reset options"):
        env.reset(options={"groups": 2})


def test_group_reset_works_for_every_embedded_task(task_id):
    env = sim.make(task_id, 4, group_size=2)
    env.reset(seed=0)
    s = torch.from_numpy(env.state)
    assert torch.equal(s[0], s[1]) and torch.equal(s[2], s[3]) and not torch.equal(s[0], s[2])


@pytest.mark.parametrize("task", ["reach", "push", "lift", "stack"])
def test_expert_solves_each_task(task):
    env = sim.make(f"mujoco/LangTabletop-{task.capitalize()}", 8, obs_mode="state", episode_length=100, seed=0)
    assert tasks.EXPERTS[f"mujoco/LangTabletop-{task.capitalize()}"] is LangTabletopExpert
    expert = LangTabletopExpert(env)
    obs = env.reset(seed=0)
    expert.reset()
    for _ in range(100):
        obs, _, _, _, info = env.step(expert.act(obs))
    assert info["episode"]["success_once"].float().mean() >= 0.75, task


def test_demos_keep_instructions_and_images(tmp_path):
    result = record_demos("mujoco/LangTabletop", 4, tmp_path, num_envs=4, seed=3, rgb=True, progress=False)
    assert result["episodes"] == 4
    first = sim.make("mujoco/LangTabletop", 4, seed=3, obs_mode="rgb", render_size=(64, 64)).reset(seed=3)
    assert len(set(first["instruction"])) == 4
    with h5py.File(tmp_path / "demos.hdf5") as f:
        for i in range(4):  # the first four episodes to end are each env's first (in the order they ended)
            demo = f[f"data/demo_{i}"]
            j = first["instruction"].index(demo.attrs["instruction"])
            assert demo.attrs["task_id"] == int(first["task_id"][j])
            assert torch.equal(torch.from_numpy(demo["obs/rgb"][0]), first["rgb"][j])
            T = demo.attrs["num_samples"]
            assert demo["obs/rgb"].shape == (T, 64, 64, 3) and demo["obs/state"].shape == (T, ARM_STATE)
        lengths = [int(f[f"data/demo_{i}"].attrs["num_samples"]) for i in range(4)]
        names = [f[f"data/demo_{i}"].attrs["instruction"] for i in range(4)]
    w = load_demos(tmp_path, success_only=False, images=True)
    assert len(w.instructions) == len(w.obs) == w.rgb.shape[0] == sum(lengths)
    assert w.instructions[0] == names[0] and w.instructions[-1] == names[-1]


def test_fixed_layout_keeps_each_object_near_its_place_and_the_expert_solves_it():
    from roborl.tasks.multitask_tabletop import FIXED_JITTER, LAYOUT_BALLS, LAYOUT_CUBES

    env = sim.make("mujoco/LangTabletopFixed-ReachPushLift", 32, obs_mode="state", episode_length=60, seed=1)
    obs = env.reset(seed=1)
    raw = env.unwrapped
    assert set(raw.task_id.tolist()) == {0, 1, 2}  # reach, push, lift; never stack
    for cube, place in zip(raw.cubes, LAYOUT_CUBES):
        offset = cube.pos[:, :2] - torch.tensor(place, dtype=torch.float64)
        assert offset.abs().max() <= FIXED_JITTER + 1e-3 and offset.std() > FIXED_JITTER / 4
    reach = raw.task_id == 0
    offset = raw.balls[reach] - torch.tensor(LAYOUT_BALLS, dtype=torch.float64)
    assert offset.abs().max() <= FIXED_JITTER + 1e-9
    free = sim.make("mujoco/LangTabletop-ReachPushLift", 32, obs_mode="state", seed=1)
    free.reset(seed=1)
    spread = (free.unwrapped.cubes[0].pos[:, :2] - torch.tensor(LAYOUT_CUBES[0], dtype=torch.float64)).abs().max()
    assert spread > 3 * FIXED_JITTER  # the default layout is not the fixed one
    expert = LangTabletopExpert(env)
    expert.reset()
    for _ in range(60):
        obs, _, _, _, info = env.step(expert.act(obs))
    assert info["episode"]["success_at_end"].float().mean() >= 0.9
