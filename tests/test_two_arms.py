"""Two arms over one table (mujoco/TwoArmReach): the per-agent spaces, the shields that keep the TCPs apart
(one per arm composed by assume-guarantee contracts, or one on both arms' actions) on random proposals and in
the simulator, and MAPPO's per-agent actors. The VecEnv contract and the expert run in test_vecenv.py and
test_experts.py with the other tasks."""
import pytest
import torch

from roborl import sim, tasks
from roborl.builder import make_env, make_policy
from roborl.config import config_from_dict
from roborl.errors import UserError
from roborl.shields.base import ShieldChain
from roborl.shields.two_arms import ArmGapShield, JointGapShield, project_ball_halfspace

STEP, GAP = 0.04, 0.1
LEFT, RIGHT = slice(0, 3), slice(3, 6)


def shields() -> dict:
    return {"composed": ShieldChain([ArmGapShield(LEFT, RIGHT, 0, STEP, GAP), ArmGapShield(RIGHT, LEFT, 4, STEP, GAP)]),
            "central": JointGapShield((LEFT, RIGHT), (0, 4), STEP, GAP)}


@pytest.mark.parametrize("kind", ["composed", "central"])
def test_the_shields_never_let_the_targets_closer_than_the_gap_on_random_proposals(kind):
    """Two TCPs that follow their shielded targets exactly, from random starts at least GAP apart, under random
    proposals of which half drive the arms straight at each other, for 100 steps."""
    shield, g, n = shields()[kind], torch.Generator().manual_seed(0), 2048
    left = torch.randn(n, 3, generator=g, dtype=torch.float64) * 0.05
    offset = torch.nn.functional.normalize(torch.randn(n, 3, generator=g, dtype=torch.float64), dim=-1)
    right = left + offset * (GAP + 0.2 * torch.rand(n, 1, generator=g, dtype=torch.float64))
    closest, changed_any = float("inf"), 0
    for _ in range(100):
        proposal = torch.rand(n, 8, generator=g, dtype=torch.float64) * 2 - 1
        toward = torch.nn.functional.normalize(right - left, dim=-1)
        proposal[: n // 2, 0:3], proposal[: n // 2, 4:7] = toward[: n // 2], -toward[: n // 2]
        safe, changed, info = shield({"state": torch.cat([left, right], -1)}, proposal)
        assert not info["infeasible"].any()
        assert (safe[:, [3, 7]] == proposal[:, [3, 7]]).all()  # the grippers are not the shields' business
        changed_any += int(changed.sum())
        left, right = left + STEP * safe[:, 0:3], right + STEP * safe[:, 4:7]
        closest = min(closest, (left - right).norm(dim=-1).min().item())
    assert closest >= GAP - 1e-9 and changed_any > 0


@pytest.mark.parametrize("kind", ["composed", "central"])
def test_the_shields_are_the_identity_where_nothing_binds(kind):
    left, right = torch.zeros(256, 3, dtype=torch.float64), torch.tensor([[0.0, 0.5, 0.0]], dtype=torch.float64).expand(256, 3)
    g = torch.Generator().manual_seed(2)
    proposal = torch.rand(256, 8, generator=g, dtype=torch.float64) * 2 - 1
    for xyz in (slice(0, 3), slice(4, 7)):  # inside each arm's speed bound (‖u‖ < 1)
        proposal[:, xyz] = torch.nn.functional.normalize(proposal[:, xyz], dim=-1) * torch.rand(256, 1, generator=g)
    safe, changed, _ = shields()[kind]({"state": torch.cat([left, right], -1)}, proposal)
    assert torch.equal(safe, proposal) and not changed.any()


def test_the_closed_form_projection_is_the_nearest_point_of_the_ball_and_half_space():
    """Against a brute-force search over a fine grid of the unit ball."""
    g = torch.Generator().manual_seed(1)
    grid = torch.stack(torch.meshgrid(*[torch.linspace(-1, 1, 41, dtype=torch.float64)] * 3, indexing="ij"), -1).reshape(-1, 3)
    grid = grid[grid.norm(dim=-1) <= 1]
    u = torch.randn(20, 3, generator=g, dtype=torch.float64) * 1.5
    n = torch.nn.functional.normalize(torch.randn(20, 3, generator=g, dtype=torch.float64), dim=-1)
    b = torch.rand(20, generator=g, dtype=torch.float64) * 1.6 - 0.6
    v, infeasible = project_ball_halfspace(u, n, b)
    assert not infeasible.any()
    for i in range(20):
        ok = grid[(grid @ n[i]) >= b[i]]
        best = (ok - u[i]).norm(dim=-1).min()
        assert (v[i] - u[i]).norm() <= best + 1e-9 and v[i].norm() <= 1 + 1e-9 and v[i] @ n[i] >= b[i] - 1e-9


def run_expert(shield: dict | None, n: int = 32) -> tuple[float, float, float]:
    """The straight-line expert on TwoArmReach: (violation steps, success, closest TCP gap)."""
    cfg = config_from_dict({"env": {"id": "mujoco/TwoArmReach", "num_envs": n, **({"shield": shield} if shield else {})}})
    env = make_env(cfg.env, n, 0, torch.device("cpu"))
    expert = tasks.EXPERTS["mujoco/TwoArmReach"](env.unwrapped)
    obs, violations, closest = env.reset(seed=0), 0.0, float("inf")
    for _ in range(env.max_episode_steps):
        obs, _, _, _, info = env.step(expert.act(obs))
        violations += info["cost"].sum().item()
        closest = min(closest, env.unwrapped.gap().min().item())
    env.close()
    return violations, info["episode"]["success_at_end"].float().mean().item(), closest


def test_in_the_simulator_the_shields_keep_the_arms_apart_and_the_expert_still_succeeds():
    free = run_expert(None)
    assert free[0] > 0 and free[2] < 0.05  # the straight paths cross: what the shields must prevent
    for kind in ("composed", "central"):
        violations, success, closest = run_expert({"arm_gap": 0.1, "arm_gap_shield": kind})
        assert violations == 0 and closest >= 0.1 and success >= 0.8, (kind, violations, success, closest)


def test_each_agent_observes_its_own_arm_and_the_other_tcp_and_mappo_actors_read_only_that():
    env = sim.make("mujoco/TwoArmReach", 4, seed=0)
    left, right = env.agents["left"], env.agents["right"]
    assert left.action == (0, 4) and right.action == (4, 8)
    assert set(range(0, 18)) <= set(left.state) and not set(range(18, 33)) & set(left.state)  # not the right's joints
    assert set(range(33, 36)) <= set(left.state)  # the right TCP
    cfg = config_from_dict({"env": {"id": "mujoco/TwoArmReach", "num_envs": 4}, "policy": {"actors": "per_agent",
                                                                                           "normalize_obs": False}})
    policy = make_policy(cfg.policy, env)
    state = env.reset(seed=0)["state"]
    moved = state.clone()
    moved[:, 18:33] += 1.0  # the right arm's joints, velocities and gripper
    before, after = (policy.act({"state": s}, deterministic=True).action for s in (state, moved))
    assert torch.equal(before[:, :4], after[:, :4]) and not torch.equal(before[:, 4:], after[:, 4:])
    assert policy.value({"state": state}).shape == (4,)  # one critic on the whole state


def test_the_pettingzoo_view_passes_pettingzoo_s_own_api_test_and_the_expert_succeeds_through_it():
    import numpy as np
    from pettingzoo.test import parallel_api_test

    from roborl.sim.pettingzoo_adapter import PettingZooEnv

    parallel_api_test(PettingZooEnv(sim.make("mujoco/TwoArmReach", 1, seed=0)), num_cycles=250)  # ends episodes
    vec = sim.make("mujoco/TwoArmReach", 1, seed=3)
    env, expert = PettingZooEnv(vec), tasks.EXPERTS["mujoco/TwoArmReach"](vec)
    obs, _ = env.reset(seed=3)
    state = vec.reset(seed=3)["state"][0].numpy()
    assert env.agents == ["left", "right"]
    for name, agent in vec.agents.items():
        np.testing.assert_array_equal(obs[name], state[list(agent.state)])
        assert env.action_space(name).shape == (agent.action_dim,)
    steps = 0
    while env.agents:
        joint = expert.act().numpy()[0]
        obs, rewards, terms, truncs, infos = env.step({n: joint[slice(*a.action)] for n, a in vec.agents.items()})
        steps += 1
        assert rewards["left"] == rewards["right"]  # a cooperative task: one shared reward
    assert steps == vec.max_episode_steps and infos["left"]["success"] and truncs["left"]
    with pytest.raises(sim.SimError, match="has one agent"):
        PettingZooEnv(sim.make("mujoco/Reach", 1))


def test_two_arm_config_errors():
    base = {"id": "mujoco/TwoArmReach", "num_envs": 2}
    with pytest.raises(UserError, match="env.shield.workspace shields one arm; mujoco/TwoArmReach has two"):
        make_env(config_from_dict({"env": {**base, "shield": {"workspace": [0, 0, 0, 1, 1, 1]}}}).env, 2, 0, "cpu")
    with pytest.raises(UserError, match="arm_gap keeps two arms apart: it works on mujoco/TwoArmReach, not mujoco/Reach"):
        make_env(config_from_dict({"env": {"id": "mujoco/Reach", "shield": {"arm_gap": 0.1}}}).env, 2, 0, "cpu")
    cfg = config_from_dict({"env": {"id": "mujoco/Reach"}, "policy": {"actors": "per_agent"}})
    with pytest.raises(UserError, match="needs an env of several agents"):
        make_policy(cfg.policy, sim.make("mujoco/Reach", 2))
    with pytest.raises(sim.SimError, match="drives both arms with ee_delta_pos"):
        sim.make("mujoco/TwoArmReach", 2, controller="joint_pos")


def test_mappo_with_composed_shields_trains_saves_and_evaluates_through_the_cli(tmp_path):
    """A short run of the recipe: the per-agent actors and the per-arm shields go through training, the
    checkpoint, and the evaluation CLI, which rebuilds both from the checkpoint's config."""
    import json

    from helpers import ROOT, roborl_in_process

    proc = roborl_in_process("train", str(ROOT / "configs" / "mappo_two_arms.yaml"), f"train.run_dir={tmp_path}", "train.name=m",
                             "train.total_steps=3200", "train.eval_every=1", "train.eval_episodes=4", "train.progress=false",
                             "train.video=false")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert summary["env_steps"] == 3200 and "train_violation_steps" in summary
    ev = roborl_in_process("eval", str(tmp_path / "m" / "checkpoints" / "last.safetensors"), "--episodes", "4", "--json")
    assert ev.returncode == 0, ev.stderr
    result = json.loads(ev.stdout.strip().splitlines()[-1])
    assert result["violating_episodes"] == 0  # the shields run in evaluation too
