"""The 7-joint Panda-kinematics arm shared by all embedded tasks: controllers, proprioception, grasp test."""
from __future__ import annotations

import math
from pathlib import Path

import torch

from roborl.sim.errors import SimError
from roborl.sim.kinematics import SerialChain, orientation_hold_step
from roborl.sim.mujoco_env import MujocoVecEnv

ASSETS = Path(__file__).parent / "assets"
HOME = torch.tensor([0.0, math.pi / 8, 0.0, -5 * math.pi / 8, 0.0, 3 * math.pi / 4, math.pi / 4], dtype=torch.float64)
CONTROLLERS = ("ee_delta_pos", "joint_delta_pos", "joint_pos")
FINGER_OPEN = 0.04  # metres each finger travels from the centre line
CUBE_HALF = 0.02
TCP_LOW = torch.tensor([0.25, -0.4, 0.01], dtype=torch.float64)  # workspace box for end-effector targets
TCP_HIGH = torch.tensor([0.8, 0.4, 0.45], dtype=torch.float64)
# where the proprioception sits at the front of every arm task's `state` (see ArmEnv._arm_obs)
ARM_OBS = {"q": slice(0, 7), "qvel": slice(7, 14), "gripper": slice(14, 15), "tcp": slice(15, 18)}


def ik_step(q: torch.Tensor, target: torch.Tensor, p: torch.Tensor, R: torch.Tensor, J: torch.Tensor,
            down: torch.Tensor, damping: float = 0.05) -> torch.Tensor:
    """Damped least-squares joint step toward `target` with the gripper held at the orientation `down`, from
    the TCP pose (p, R) and Jacobian J at q; the null space pulls toward the home posture."""
    return orientation_hold_step(q, target, p, R, J, down, HOME, 0.1, damping)


class ArmEnv(MujocoVecEnv):
    """Arm on a table. Actions: `ee_delta_pos` (dx, dy, dz, gripper), solved by batched damped
    least-squares IK with the gripper held pointing down, or `joint_delta_pos` / `joint_pos`
    (7 joint targets, gripper). Gripper -1 closes, +1 opens."""

    scene = "reach.xml"
    episode_length = 100  # control steps; tasks set their own
    max_ee_step = 0.04  # metres per control step at |action| = 1
    max_joint_step = 0.15  # radians per control step at |action| = 1
    obs_layout = ARM_OBS  # where joints, joint velocities, gripper and TCP sit in `state` (shields read them)

    def __init__(self, num_envs: int = 1, *, controller: str = "ee_delta_pos", control_freq: int = 20,
                 episode_length: int | None = None, **kwargs) -> None:
        if controller not in CONTROLLERS:
            raise SimError(f"unknown controller '{controller}'; available: {', '.join(CONTROLLERS)}")
        self.controller = controller
        self.action_dim_ = 4 if controller == "ee_delta_pos" else 8
        timestep = 0.005
        substeps = max(1, round(1.0 / (control_freq * timestep)))
        super().__init__(ASSETS / self.scene, num_envs, substeps=substeps,
                         episode_length=episode_length or self.episode_length, **kwargs)

    def _setup(self) -> None:
        self.chain = SerialChain(self.model, "tcp")
        self.down = self.chain.forward(HOME[None])[1][0]  # gripper orientation held by the IK
        self._kin_cache: tuple[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None

    # ---- kinematics -------------------------------------------------------------------------
    @property
    def arm_q(self) -> torch.Tensor:
        return self.qpos[:, :7]

    @property
    def gripper_gap(self) -> torch.Tensor:
        """Distance between the finger pads (m)."""
        return self.qpos[:, 7:9].sum(-1)

    def kinematics(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """TCP position, rotation and Jacobian, computed once per physics state (obs, reward and IK share it)."""
        if self._kin_cache is None or self._kin_cache[0] != self.state_version:
            self._kin_cache = (self.state_version, self.chain.jacobian(self.arm_q))
        return self._kin_cache[1]

    @property
    def tcp(self) -> torch.Tensor:
        """Tool-centre-point position N×3."""
        return self.kinematics()[0]

    def is_grasping(self, obj_pos: torch.Tensor) -> torch.Tensor:
        """Cube held between the pads: close to the TCP and the gap about one cube wide."""
        near = (obj_pos - self.tcp).norm(dim=-1) < 0.02
        gap = self.gripper_gap
        return near & (gap < 2 * CUBE_HALF + 0.004) & (gap > 2 * CUBE_HALF - 0.01)

    # ---- control ----------------------------------------------------------------------------
    def _reset_arm(self, ids: torch.Tensor) -> None:
        noise = self.uniform(len(ids), [-0.05] * 7, [0.05] * 7)
        self.qpos[ids, :7] = HOME + noise
        self.qpos[ids, 7:9] = FINGER_OPEN
        self.qvel[ids, :9] = 0.0

    def _action_to_ctrl(self, action: torch.Tensor) -> torch.Tensor:
        q = self.arm_q
        if self.controller == "ee_delta_pos":
            target = (self.tcp + action[:, :3] * self.max_ee_step).clamp(TCP_LOW, TCP_HIGH)
            q_target = q + self.ik_step(q, target, *self.kinematics())
        elif self.controller == "joint_delta_pos":
            q_target = q + action[:, :7] * self.max_joint_step
        else:
            q_target = self.chain.lower + (action[:, :7] + 1) / 2 * (self.chain.upper - self.chain.lower)
        finger = (action[:, -1:] + 1) * (FINGER_OPEN / 2)
        return torch.cat([q_target.clamp(self.chain.lower, self.chain.upper), finger, finger], -1)

    def action_scaling(self) -> dict[str, list]:
        finger = {"scale": [FINGER_OPEN / 2], "offset": [FINGER_OPEN / 2], "units": ["m finger opening"]}
        if self.controller == "ee_delta_pos":
            arm = {"scale": [self.max_ee_step] * 3, "offset": [0.0] * 3, "units": ["m tcp delta"] * 3}
        elif self.controller == "joint_delta_pos":
            arm = {"scale": [self.max_joint_step] * 7, "offset": [0.0] * 7, "units": ["rad joint delta"] * 7}
        else:
            lo, hi = self.chain.lower, self.chain.upper
            arm = {"scale": ((hi - lo) / 2).tolist(), "offset": ((hi + lo) / 2).tolist(), "units": ["rad joint"] * 7}
        return {k: arm[k] + finger[k] for k in arm}

    def ik_step(self, q: torch.Tensor, target: torch.Tensor, p: torch.Tensor, R: torch.Tensor, J: torch.Tensor,
                damping: float = 0.05) -> torch.Tensor:
        return ik_step(q, target, p, R, J, self.down, damping)

    def _arm_obs(self) -> torch.Tensor:
        return torch.cat([self.arm_q, 0.1 * self.qvel[:, :7], self.gripper_gap[:, None] * 10, self.tcp], -1)

    def _proprio_obs(self) -> torch.Tensor:
        return self._arm_obs()
