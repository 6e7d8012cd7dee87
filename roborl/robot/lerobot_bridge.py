"""Any LeRobot robot (`lerobot.robots.Robot`: SO-100/101, Koch, LeKiwi, a plugin's) as a roborl `RobotInterface`,
so a roborl policy, exported or served, drives it through `ControlLoop` with the loop's watchdog and shields.

LeRobot robots speak in named features: `get_observation()` gives `{"shoulder_pan.pos": float, ...,
"front": H×W×3 image}` and `send_action` takes `{"shoulder_pan.pos": float, ...}` in the robot's own units.
The bridge builds the policy's `state` from the observation (by default the float features in the robot's
order) and names each commanded value (by default the robot's float action features in order), after the
artifact's scaling has turned the policy's [-1, 1] action into the controller's units. `state_fn` and
`action_keys` map anything else (joint orders, a task part of the state, unit changes).

LeRobot has no stop command, and `disconnect()` on many arms disables torque (an arm then falls), so `stop`
commands the positions just observed (the arm holds where it is) and refuses further actions until `reset()`.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from roborl.robot.interface import RobotInterface

StateFn = Callable[[dict], np.ndarray]


class LeRobotBridgeError(RuntimeError):
    """The robot's features do not fit the policy, or the robot refused; the message says how to fix it."""


def float_features(features: dict) -> list[str]:
    """The names of a LeRobot feature dict's scalar features, in the robot's order."""
    return [name for name, kind in features.items() if kind is float]


class LeRobotRobot(RobotInterface):
    def __init__(self, robot, metadata: dict, *, state_fn: StateFn | None = None, action_keys: list[str] | None = None,
                 camera: str | None = None) -> None:
        """`robot`: a LeRobot `Robot` (not yet connected), e.g. `make_robot_from_config(SO101FollowerConfig(...))`.
        `metadata`: the artifact's (its control period, action scaling and observation). `state_fn`: observation
        dict -> the policy's `state` (default: the float features in order). `action_keys`: the robot's action
        features that receive the command's dimensions, in order (default: its float action features).
        `camera`: the observation key passed as `rgb` when the policy sees images."""
        self.robot, self.metadata = robot, metadata
        self.control_dt = float(metadata["env"]["control_dt"])
        action = metadata["action"]
        self.scale, self.offset = np.asarray(action["scale"], float), np.asarray(action["offset"], float)
        self.action_keys = list(action_keys) if action_keys is not None else float_features(robot.action_features)
        unknown = list(dict.fromkeys(key for key in self.action_keys if key not in robot.action_features))
        if unknown:
            raise LeRobotBridgeError(f"{type(robot).__name__} has no action features {unknown}; its features: "
                                     f"{list(robot.action_features)}")
        if len(self.action_keys) != len(self.scale):
            raise LeRobotBridgeError(
                f"the policy commands {len(self.scale)} values ({', '.join(action.get('units', []))}) but "
                f"{type(robot).__name__} takes {len(self.action_keys)} ({', '.join(self.action_keys)}); pass "
                "action_keys=[...] naming the robot feature for each commanded value")
        self.state_fn = state_fn or (lambda obs: np.array([obs[k] for k in float_features(robot.observation_features)]))
        self.wants_rgb = "rgb" in metadata.get("observation", {})
        if self.wants_rgb and camera not in robot.observation_features:
            raise LeRobotBridgeError(f"the policy sees images: pass camera= one of {type(robot).__name__}'s image "
                                     f"features {[k for k, v in robot.observation_features.items() if v is not float]}")
        self.camera = camera
        self.stopped = False
        self.last_obs: dict = {}

    def connect(self) -> None:
        try:
            self.robot.connect()
        except Exception as exc:
            raise LeRobotBridgeError(f"cannot connect {type(self.robot).__name__} ({type(exc).__name__}: {exc}); "
                                     "check its port / address and that it is powered") from exc

    def observe(self) -> dict[str, np.ndarray]:
        self.last_obs = self.robot.get_observation()
        out = {"state": np.asarray(self.state_fn(self.last_obs), np.float32)}
        if self.wants_rgb:
            out["rgb"] = np.asarray(self.last_obs[self.camera])
        return out

    def command(self, action: np.ndarray) -> dict[str, float]:
        """The robot's action dict for a policy action in [-1, 1]: the artifact's scaling, then the feature names."""
        values = self.scale * np.clip(np.asarray(action, float), -1, 1) + self.offset
        return {key: float(value) for key, value in zip(self.action_keys, values)}

    def act(self, action: np.ndarray) -> None:
        if self.stopped:
            raise LeRobotBridgeError("the robot was stopped; call reset() before sending actions")
        self.robot.send_action(self.command(action))

    def _hold_action(self) -> dict[str, float]:
        """Each action feature at its value just observed (the pose the arm is in), where the robot reports it."""
        return {key: float(self.last_obs[key]) for key in self.action_keys if key in self.last_obs}

    def hold(self) -> None:
        if hold := self._hold_action():
            self.robot.send_action(hold)

    def stop(self) -> None:
        self.stopped = True
        if self.last_obs and (hold := self._hold_action()):
            self.robot.send_action(hold)

    def reset(self) -> dict[str, np.ndarray]:
        """Clear the stop (after the operator has reset the cell) and observe."""
        self.stopped = False
        return self.observe()

    def close(self) -> None:
        if self.robot.is_connected:
            self.robot.disconnect()
