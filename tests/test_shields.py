"""Shields: every shielded action satisfies its constraint on random batches, the CBF projection equals
its closed form (and the QP solver's answer), no-op when no constraint is active, and in the env the
TCP never enters a keep-out sphere that an unshielded controller drives into."""
import pytest
import torch
from helpers import ROOT

from roborl import (
    sim,
    tasks,  # noqa: F401
)
from roborl.builder import make_env
from roborl.config import config_from_dict
from roborl.errors import UserError
from roborl.shields import (
    ActionRateShield,
    JointLimitShield,
    KeepOutCBF,
    ShieldChain,
    SpeedShield,
    WorkspaceShield,
    project_halfspace,
)
from roborl.shields.cbf import solve_qps
from roborl.tasks.arm import ARM_OBS

ROOT_TASKS = ROOT / "tasks"

G = torch.Generator().manual_seed(0)
STEP = 0.04


def rand(*shape, low=-1.0, high=1.0):
    return low + (high - low) * torch.rand(*shape, generator=G)


def obs_at(tcp: torch.Tensor, q: torch.Tensor | None = None) -> dict:
    state = torch.zeros(tcp.shape[0], 18)
    state[:, ARM_OBS["tcp"]] = tcp
    if q is not None:
        state[:, ARM_OBS["q"]] = q
    return {"state": state}


def test_workspace_and_speed_shields_always_satisfy_their_limits():
    low, high = [0.3, -0.3, 0.05], [0.7, 0.3, 0.4]
    tcp = torch.stack([rand(2000, low=lo, high=hi) for lo, hi in zip(low, high)], -1)
    action = rand(2000, 4, low=-1.5, high=1.5)
    safe, intervened, _ = WorkspaceShield(low, high, ARM_OBS["tcp"], STEP)(obs_at(tcp), action)
    target = tcp + safe[:, :3] * STEP
    assert (target >= torch.tensor(low) - 1e-6).all() and (target <= torch.tensor(high) + 1e-6).all()
    assert torch.equal(safe[:, 3], action[:, 3])
    target = tcp + action[:, :3].clamp(-1, 1) * STEP
    inside = ((target >= torch.tensor(low)) & (target <= torch.tensor(high))).all(-1)
    assert intervened[~inside].all() and (action.abs() > 1).any()
    # from outside the box (an arm that overshot) the target goes back toward it by up to a step, never out
    beyond = torch.tensor([[0.72, 0.0, 0.2], [0.9, 0.0, 0.2], [0.5, 0.0, 0.03]])
    safe, _, _ = WorkspaceShield(low, high, ARM_OBS["tcp"], STEP)(obs_at(beyond), torch.tensor([[1.0, 0, 0, 0]] * 3))
    assert torch.allclose(safe[:, :3], torch.tensor([[-0.5, 0, 0], [-1.0, 0, 0], [1.0, 0, 0.5]]), atol=1e-5)
    speed = SpeedShield(max_speed=0.5, control_dt=0.05, max_step=STEP)
    safe, intervened, _ = speed(obs_at(tcp), action)
    assert (safe[:, :3].norm(dim=-1) * STEP / 0.05 <= 0.5 + 1e-5).all()
    slow = action[:, :3].norm(dim=-1) * STEP / 0.05 <= 0.5
    assert torch.equal(safe[slow], action[slow]) and not intervened[slow].any() and intervened[~slow].all()


def test_action_rate_and_joint_limit_shields():
    shield = ActionRateShield(0.2)
    previous = rand(500, 4)
    shield.observe({}, previous, {})
    shield.reset(torch.arange(500) < 100)  # the first 100 envs start a new episode: no limit for them
    action = rand(500, 4)
    safe, intervened, _ = shield({}, action)
    assert ((safe[100:] - previous[100:]).abs() <= 0.2 + 1e-6).all()
    assert torch.equal(safe[:100], action[:100])
    lower, upper = -torch.ones(7), torch.ones(7)
    q = rand(500, 7, low=-0.9, high=0.9)
    safe, _, _ = JointLimitShield(lower, upper, ARM_OBS["q"], 0.15, margin=0.05)(obs_at(torch.zeros(500, 3), q), rand(500, 8))
    target = q + safe[:, :7] * 0.15
    assert (target >= -0.95 - 1e-6).all() and (target <= 0.95 + 1e-6).all()


def test_cbf_projection_equals_the_closed_form_and_the_qp():
    """One affine constraint Lf h + Lg h·u + α h ≥ 0: u* = u + max(0, −(Lf h + Lg h·u + α h))·Lg hᵀ/‖Lg h‖²."""
    u = rand(300, 3, low=-0.5, high=0.5).double()
    lg = rand(300, 3).double()
    lf, h, alpha = rand(300).double(), rand(300, low=0.0, high=0.3).double(), 0.5
    expected = u + ((-(lf + (lg * u).sum(-1) + alpha * h)).clamp(min=0) / lg.square().sum(-1))[:, None] * lg
    ours = project_halfspace(u, lg, -(lf + alpha * h))
    torch.testing.assert_close(ours, expected)
    inside = (expected.abs() <= 1).all(-1)  # where the box does not bind, the QP must agree
    qp, solved = solve_qps(u[inside], lg[inside, None], -(lf + alpha * h)[inside, None])
    assert solved.all()
    torch.testing.assert_close(qp, expected[inside], atol=1e-6, rtol=0)


def test_keep_out_cbf_satisfies_every_constraint_and_is_identity_when_inactive():
    spheres = [[0.5, 0.0, 0.2, 0.05], [0.5, 0.13, 0.2, 0.05], [0.6, 0.05, 0.25, 0.04]]
    shield = KeepOutCBF(spheres, ARM_OBS["tcp"], STEP, alpha=0.5, margin=0.0)
    tcp = torch.stack([rand(3000, low=0.35, high=0.75), rand(3000, low=-0.15, high=0.3), rand(3000, low=0.05, high=0.4)], -1)
    centers, radii = torch.tensor(spheres)[:, :3], torch.tensor(spheres)[:, 3]
    outside = ((tcp[:, None] - centers).norm(dim=-1) > radii).all(-1)
    tcp = tcp[outside]
    action = rand(tcp.shape[0], 4)
    safe, intervened, info = shield(obs_at(tcp), action)
    normals, bounds = shield.constraints(tcp.double())
    slack = (normals * safe[:, None, :3].double()).sum(-1) - bounds
    feasible = ~info["infeasible"]
    assert feasible.float().mean() > 0.99
    assert (slack[feasible] >= -1e-5).all()  # every constraint of every feasible row holds
    assert (safe[:, :3].abs() <= 1 + 1e-6).all()
    nxt = tcp + safe[:, :3] * STEP  # α-CBF: the next target keeps at least (1 − α) of its distance
    h = (tcp[:, None] - centers).norm(dim=-1) - radii
    h_next = (nxt[:, None] - centers).norm(dim=-1) - radii
    assert (h_next[feasible] >= 0.5 * h[feasible] - 1e-5).all()
    # identity where no constraint binds
    free = ((normals * action[:, None, :3].double()).sum(-1) >= bounds).all(-1)
    assert free.any() and torch.equal(safe[free], action[free]) and not intervened[free].any()
    assert intervened[~free].all()


def test_chain_composes_and_reports_correction():
    chain = ShieldChain([SpeedShield(0.4, 0.05, STEP), WorkspaceShield([0.3, -0.3, 0.05], [0.7, 0.3, 0.4], ARM_OBS["tcp"], STEP)])
    tcp = torch.tensor([[0.69, 0.0, 0.2], [0.5, 0.0, 0.2]])
    action = torch.tensor([[1.0, 0, 0, 0], [0.1, 0, 0, 0]])
    safe, intervened, info = chain(obs_at(tcp), action)
    assert intervened.tolist() == [True, False]
    torch.testing.assert_close(info["correction"], (safe - action).norm(dim=-1))
    assert safe[0, 0] == pytest.approx(0.25, abs=1e-5)  # the workspace bound, inside the speed limit


def drive_into_sphere(shielded: bool, steps: int = 60) -> tuple[float, float]:
    """A controller that heads straight for a sphere in the middle of Reach's workspace: returns the
    smallest TCP distance to the sphere's surface and the intervention rate."""
    sphere = [0.55, 0.0, 0.2, 0.06]
    cfg = config_from_dict({"env": {"id": "mujoco/Reach", "shield": {"keep_out": [sphere]} if shielded else {}}})
    env = make_env(cfg.env, 16, 0, torch.device("cpu"))
    raw = env.unwrapped
    obs = env.reset(seed=0)
    center = torch.tensor(sphere[:3])
    closest, interventions = float("inf"), []
    for _ in range(steps):
        tcp = obs["state"][:, ARM_OBS["tcp"]]
        action = torch.cat([((center - tcp) / STEP).clamp(-1, 1), torch.ones(16, 1)], -1)
        obs, _, _, _, info = env.step(action)
        closest = min(closest, float(((raw.tcp.float() - center).norm(dim=-1) - sphere[3]).min()))
        if "shield" in info:
            interventions.append(float(info["shield"]["intervened"].float().mean()))
    env.close()
    return closest, (sum(interventions) / len(interventions) if interventions else 0.0)


def test_keep_out_shield_keeps_the_real_arm_out():
    unshielded, _ = drive_into_sphere(False)
    shielded, rate = drive_into_sphere(True)
    assert unshielded < -0.03  # the controller does drive into the sphere: the task is not trivially safe
    assert shielded > 0.0 and rate > 0.1, (shielded, rate)


def test_shield_config_errors():
    for shield, message in (({"workspace": [0, 0, 0, 1, 1]}, "6 numbers"), ({"keep_out": [[0.5, 0, 0.2, -1]]}, "radius"),
                            ({"cbf_alpha": 2.0, "keep_out": [[0.5, 0, 0.2, 0.1]]}, "alpha")):
        with pytest.raises(UserError, match=message):  # from the config (cbf_alpha's range) or the env
            make_env(config_from_dict({"env": {"id": "mujoco/Reach", "shield": shield}}).env, 2, 0, torch.device("cpu"))
    cfg = config_from_dict({"env": {"id": "mujoco/Reach", "controller": "joint_pos", "shield": {"max_speed": 0.5}}})
    with pytest.raises(UserError, match="ee_delta_pos"):
        make_env(cfg.env, 2, 0, torch.device("cpu"))
    with pytest.raises(UserError, match="arm tasks"):
        make_env(config_from_dict({"env": {"id": "gym/Pusher-v5", "shield": {"max_speed": 0.5}}}).env, 2, 0, torch.device("cpu"))
    assert sim  # imported for the registry


def run_pick_place_with_drops(shielded: bool, steps: int = 80) -> tuple[torch.Tensor, torch.Tensor]:
    """The PickPlace expert, made to open its gripper at random moments (20% of steps). Returns, per env,
    whether the safety automaton of tasks/pick_place_gripper.rm reached its unsafe state (tracked on the
    executed actions by an independent reference), and whether the shield ever intervened."""
    from roborl.rm import RewardMachine
    from roborl.tasks.pick_place import GRIPPER_SAFETY_LABELS, gripper_safety_labels

    shield_cfg = {"automaton": "roborl.shields.presets:pick_place_gripper"} if shielded else {}
    cfg = config_from_dict({"env": {"id": "mujoco/PickPlace", "shield": shield_cfg}})
    env = make_env(cfg.env, 32, 0, torch.device("cpu"))
    raw = env.unwrapped
    expert = tasks.EXPERTS["mujoco/PickPlace"](raw)
    machine = RewardMachine.from_file(ROOT_TASKS / "pick_place_gripper.rm")
    reference = [machine.initial] * 32
    g = torch.Generator().manual_seed(1)
    obs = env.reset(seed=0)
    intervened = torch.zeros(32, dtype=torch.bool)
    for _ in range(steps):
        action = expert.act(obs)
        action[torch.rand(32, generator=g) < 0.2, -1] = 1.0
        prev_obs = obs
        obs, _, term, trunc, info = env.step(action)
        executed = info.get("executed_action", action)
        labels = gripper_safety_labels(prev_obs, executed)
        for i in range(32):
            true = {n for n, on in zip(GRIPPER_SAFETY_LABELS, labels[i].tolist()) if on}
            reference[i] = machine.step(reference[i], true)[0]
        if "shield" in info:
            intervened |= info["shield"]["intervened"]
        expert.reset(term | trunc)
    env.close()
    return torch.tensor([u in machine.failing for u in reference]), intervened


def test_automaton_shield_never_lets_the_automaton_reach_its_unsafe_state():
    unsafe_without, _ = run_pick_place_with_drops(False)
    unsafe_with, intervened = run_pick_place_with_drops(True)
    assert unsafe_without.sum() >= 5  # random openings do drop lifted cubes: the property is not trivial
    assert not unsafe_with.any() and intervened.sum() >= 5


def test_pid_lagrangian_update():
    from roborl.algos.lagrangian import PIDLagrangian

    lag = PIDLagrangian(limit=1.0, ki=0.1)
    values = [lag.update(c) for c in (3.0, 3.0, 0.0, 0.0, 0.0)]
    assert values == pytest.approx([0.2, 0.4, 0.3, 0.2, 0.1])  # gradient ascent on λ, never below 0
    assert PIDLagrangian(1.0, ki=0.1).update(0.0) == 0.0
    pid = PIDLagrangian(limit=1.0, ki=0.0, kp=0.5, kd=1.0)
    assert pid.update(2.0) == pytest.approx(0.5)  # P term only on the first update
    assert pid.update(3.0) == pytest.approx(1.0 + 1.0)  # P (0.5·2) + D (1.0·rise of 1)


def train_reach_avoid(tmp_path, name, config, steps=64000, overrides=()):
    import json

    from helpers import roborl_in_process

    proc = roborl_in_process("train", str(ROOT / "configs" / f"{config}.yaml"), f"train.run_dir={tmp_path}", f"train.name={name}",
                             f"train.total_steps={steps}", "train.eval_every=100", "train.progress=false", "train.video=false",
                             *overrides)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((tmp_path / name / "summary.json").read_text())


@pytest.mark.learning
def test_shielded_training_never_violates_while_unshielded_does(tmp_path):
    plain = train_reach_avoid(tmp_path, "plain", "ppo_reachavoid")
    shielded = train_reach_avoid(tmp_path, "shielded", "ppo_shielded_reachavoid")
    assert plain["train_violation_steps"] > 100, plain
    assert shielded["train_violation_steps"] == 0, shielded


@pytest.mark.learning
def test_ppo_lagrangian_raises_the_multiplier_and_fits_a_cost_critic(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train_reach_avoid(tmp_path, "lag", "ppo_lagrangian_reachavoid", steps=32000)
    acc = EventAccumulator(str(tmp_path / "lag" / "tb"))
    acc.Reload()
    lam = [e.value for e in acc.Scalars("train/lagrange_multiplier")]
    assert lam[0] >= 0 and lam[-1] > lam[0]  # episodes cost more than the limit early on: λ grows
    assert acc.Scalars("train/cost_value_loss") and acc.Scalars("rollout/cost")


def test_lagrangian_config_errors(tmp_path):
    from roborl.runner import Runner

    cfg = config_from_dict({"env": {"id": "mujoco/Reach", "num_envs": 2}, "algo": {"cost_limit": 1.0},
                            "train": {"total_steps": 100, "rollout_steps": 5, "run_dir": str(tmp_path), "progress": False}})
    with pytest.raises(UserError, match="publishes info\\['cost'\\]"):
        Runner(cfg).train()
    with pytest.raises(UserError, match="policy.kind gaussian"):
        from roborl.builder import build
        build(config_from_dict({"env": {"id": "mujoco/ReachAvoid"}, "policy": {"kind": "flow"}, "algo": {"cost_limit": 1.0}}),
              torch.device("cpu"))
