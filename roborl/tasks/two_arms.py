"""TwoArmReach: two 7-joint arms over one table, each reaching a goal on the other arm's side, so that their
paths cross. Batched like the single-arm tasks; two agents share the env (`VecEnv.agents`).

The scene is composed in code (MjSpec): the table of `assets/two_arms.xml` and two copies of the arm of
`assets/reach.xml`, prefixed `left_` and `right_`, standing at y = ±0.3 and facing +x. Each arm takes the
single-arm tasks' `ee_delta_pos` action (dx, dy, dz, gripper; damped least-squares IK, gripper pointing
down); the env's action is the left arm's four dims, then the right arm's.

`state`: each arm's proprioception as the single-arm tasks' (joints, scaled joint velocities, gripper, TCP;
left at 0–17, right at 18–35), the two goals, each TCP's offset to its goal, and the left TCP's offset to the
right one. Each agent observes its own proprioception, goal and offset, the other TCP and the offset between
the TCPs (`agents`); a centralized critic reads all of it.

Safety: the TCPs must stay MIN_GAP apart. A step closer costs 1 (`info["cost"]`, label `too_close`); the
shields of roborl/shields/two_arms.py keep the arms apart, one per arm or one for both.
"""
from __future__ import annotations

import mujoco
import torch

from roborl.sim.errors import SimError
from roborl.sim.kinematics import SerialChain
from roborl.sim.mujoco_env import MujocoVecEnv
from roborl.sim.registry import register
from roborl.sim.vec_env import AgentSpace
from roborl.tasks.arm import ASSETS, FINGER_OPEN, HOME, ik_step

ARMS = ("left", "right")
BASES = {"left": (0.0, 0.3, 0.0), "right": (0.0, -0.3, 0.0)}
GOAL_LOW = {"left": [0.45, -0.15, 0.1], "right": [0.45, 0.0, 0.1]}  # each arm's goals lie on the other's side
GOAL_HIGH = {"left": [0.65, 0.0, 0.3], "right": [0.65, 0.15, 0.3]}
TCP_LOW = torch.tensor([0.25, -0.5, 0.02], dtype=torch.float64)  # the box TCP targets are clamped to
TCP_HIGH = torch.tensor([0.8, 0.5, 0.5], dtype=torch.float64)
MIN_GAP = 0.1  # metres the TCPs keep between them
GOAL_GAP = 0.15  # the goals are at least this far apart
SUCCESS_DIST = 0.03
PROPRIO = 18  # joints 7, joint velocities 7, gripper 1, TCP 3 (as tasks.arm.ARM_OBS)


def two_arm_model() -> mujoco.MjModel:
    """The table with two arms, `left_…` and `right_…` (bodies, joints, actuators, the `*_tcp` sites)."""
    spec = mujoco.MjSpec.from_file(str(ASSETS / "two_arms.xml"))
    for arm in ARMS:
        one = mujoco.MjSpec.from_file(str(ASSETS / "reach.xml"))
        spec.worldbody.add_frame(pos=BASES[arm]).attach_body(one.body("link0"), f"{arm}_", "")
    return spec.compile()


class Arm:
    """Where one arm lives in the model: its kinematic chain to its TCP, its joints' qpos addresses and its
    actuators' columns of ctrl."""

    def __init__(self, model: mujoco.MjModel, name: str) -> None:
        self.name = name
        self.chain = SerialChain(model, f"{name}_tcp")
        self.q = self.chain.qpos_adr
        joint = lambda n: model.jnt_qposadr[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, f"{name}_{n}")]  # noqa: E731
        self.fingers = torch.tensor([joint("finger_left"), joint("finger_right")])
        actuator = lambda n: mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_ACTUATOR, f"{name}_{n}")  # noqa: E731
        self.ctrl = torch.tensor([actuator(f"act{i}") for i in range(1, 8)] + [actuator("grip_left"), actuator("grip_right")])
        self.down = self.chain.forward(HOME[None])[1][0]


class TwoArmReachEnv(MujocoVecEnv):
    instruction = "each arm: reach the goal on the other arm's side without coming close to the other arm"
    label_names = ("left_at_goal", "right_at_goal", "too_close")
    episode_length = 80
    max_ee_step = 0.04  # metres per control step at |action| = 1, as the single-arm tasks
    action_dim_ = 8
    controller = "ee_delta_pos"
    obs_layout = {"left_tcp": slice(15, 18), "right_tcp": slice(33, 36)}  # where each TCP sits in `state` (shields)

    def __init__(self, num_envs: int = 1, *, controller: str = "ee_delta_pos", control_freq: int = 20,
                 episode_length: int | None = None, **kwargs) -> None:
        if controller != "ee_delta_pos":
            raise SimError(f"mujoco/TwoArmReach drives both arms with ee_delta_pos, not '{controller}'")
        substeps = max(1, round(1.0 / (control_freq * 0.005)))
        super().__init__(two_arm_model(), num_envs, substeps=substeps,
                         episode_length=episode_length or self.episode_length, **kwargs)

    def _setup(self) -> None:
        self.arms = {name: Arm(self.model, name) for name in ARMS}
        self.goals = {name: torch.zeros(self.num_envs, 3, dtype=torch.float64) for name in ARMS}
        self._kin: tuple[int, dict] | None = None
        own = {"left": list(range(0, PROPRIO)) + list(range(36, 39)) + list(range(42, 45)),
               "right": list(range(PROPRIO, 2 * PROPRIO)) + list(range(39, 42)) + list(range(45, 48))}
        other_tcp = {"left": list(range(33, 36)), "right": list(range(15, 18))}
        self.agents = {name: AgentSpace(tuple(own[name] + other_tcp[name] + list(range(48, 51))), (4 * i, 4 * i + 4))
                       for i, name in enumerate(ARMS)}

    def kinematics(self) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Each arm's TCP position, rotation and Jacobian, once per physics state."""
        if self._kin is None or self._kin[0] != self.state_version:
            self._kin = (self.state_version, {n: a.chain.jacobian(self.qpos[:, a.q]) for n, a in self.arms.items()})
        return self._kin[1]

    def tcp(self, arm: str) -> torch.Tensor:
        return self.kinematics()[arm][0]

    def gap(self) -> torch.Tensor:
        """Distance between the two TCPs (N)."""
        return (self.tcp("left") - self.tcp("right")).norm(dim=-1)

    def _reset_idx(self, ids: torch.Tensor) -> None:
        for arm in self.arms.values():
            self.qpos[ids[:, None], arm.q] = HOME + self.uniform(len(ids), [-0.05] * 7, [0.05] * 7)
            self.qpos[ids[:, None], arm.fingers] = FINGER_OPEN
        self.qvel[ids] = 0.0
        left = self.uniform(len(ids), GOAL_LOW["left"], GOAL_HIGH["left"])
        right = self.uniform(len(ids), GOAL_LOW["right"], GOAL_HIGH["right"])
        for _ in range(50):  # resample the right goals that came too close to the left ones
            close = (left - right).norm(dim=-1) < GOAL_GAP
            if not close.any():
                break
            right[close] = self.uniform(int(close.sum()), GOAL_LOW["right"], GOAL_HIGH["right"])
        self.goals["left"][ids], self.goals["right"][ids] = left, right

    def _action_to_ctrl(self, action: torch.Tensor) -> torch.Tensor:
        ctrl = torch.zeros(self.num_envs, self.model.nu, dtype=torch.float64)
        kin = self.kinematics()
        for i, (name, arm) in enumerate(self.arms.items()):
            a = action[:, 4 * i : 4 * i + 4]
            q = self.qpos[:, arm.q]
            p, R, J = kin[name]
            target = (p + a[:, :3] * self.max_ee_step).clamp(TCP_LOW, TCP_HIGH)
            q_target = (q + ik_step(q, target, p, R, J, arm.down)).clamp(arm.chain.lower, arm.chain.upper)
            finger = (a[:, 3:] + 1) / 2 * FINGER_OPEN
            ctrl[:, arm.ctrl] = torch.cat([q_target, finger, finger], -1)
        return ctrl

    def action_scaling(self) -> dict[str, list]:
        one = {"scale": [self.max_ee_step] * 3 + [FINGER_OPEN / 2], "offset": [0.0] * 3 + [FINGER_OPEN / 2],
               "units": ["m tcp delta"] * 3 + ["m finger opening"]}
        return {k: v + v for k, v in one.items()}

    def _state_obs(self) -> torch.Tensor:
        parts = []
        for name, arm in self.arms.items():
            gap = self.qpos[:, arm.fingers].sum(-1, keepdim=True)
            parts.append(torch.cat([self.qpos[:, arm.q], 0.1 * self.qvel[:, arm.q], gap * 10, self.tcp(name)], -1))
        offsets = [self.goals[n] - self.tcp(n) for n in ARMS]
        return torch.cat([*parts, self.goals["left"], self.goals["right"], *offsets,
                          self.tcp("left") - self.tcp("right")], -1)

    def _evaluate(self) -> dict[str, torch.Tensor]:
        dist = {n: (self.goals[n] - self.tcp(n)).norm(dim=-1) for n in ARMS}
        at = {n: dist[n] < SUCCESS_DIST for n in ARMS}
        success = at["left"] & at["right"]
        reward = sum((1 - torch.tanh(5 * dist[n]) + at[n].double()) / 4 for n in ARMS)
        too_close = self.gap() < MIN_GAP
        return {"reward": reward, "success": success, "cost": too_close.double(),
                "labels": torch.stack([at["left"], at["right"], too_close], -1)}

    def _markers(self):
        return [(self.goals["left"], (0.9, 0.2, 0.2, 0.6), 0.02), (self.goals["right"], (0.2, 0.4, 0.9, 0.6), 0.02)]


class TwoArmReachExpert:
    """Each arm heads straight for its goal (paths crossing: the shields are what keep the arms apart)."""

    def __init__(self, env: TwoArmReachEnv, gain: float = 2.0) -> None:
        self.env, self.gain = env, gain

    def reset(self, mask: torch.Tensor | None = None) -> None:
        """Stateless."""

    def act(self, obs: dict | None = None) -> torch.Tensor:
        env = self.env
        parts = []
        for name in ARMS:
            delta = (env.goals[name] - env.tcp(name)) / env.max_ee_step * self.gain
            parts += [delta.clamp(-1, 1), torch.ones(env.num_envs, 1, dtype=delta.dtype)]
        return torch.cat(parts, -1).float().to(env.device)


@register("mujoco/TwoArmReach")
def make_two_arm_reach(num_envs: int = 1, **kwargs) -> TwoArmReachEnv:
    return TwoArmReachEnv(num_envs, **kwargs)
