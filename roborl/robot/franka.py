"""A Franka arm (FR3 or Panda) as a `RobotInterface`, through franky (libfranka + Ruckig, no ROS).

The embedded tasks' arm has the Panda's kinematics, its base at the origin and its TCP where franky puts the
end effector by default (the hand's TCP, 10.34 cm past the flange), so a policy trained on them reads the
same proprioception here: joint positions, 0.1 × joint velocities, 10 × the gripper width and the TCP position
(`roborl.tasks.arm.ARM_OBS`). The task's own part of `state` (a goal, a cube pose from perception) comes from
`task_state`, a function of that proprioception.

Each `act` converts the action to the controller's units with the artifact's scaling and hands franky a new
asynchronous motion, which takes over from the one still running (Ruckig keeps it smooth and within the
arm's limits, scaled by `dynamics`): `ee_delta_pos` moves the TCP by the commanded step from where it was
measured, pointing down as in training, clamped to the training workspace; `joint_delta_pos` / `joint_pos`
move to joint targets clamped inside the FR3's limits. The gripper gets a new command only when the
commanded width changes: closing grasps (so it keeps its force on a cube), opening moves.

The driver is clocked on the arm's own clock (libfranka's `RobotState.time`, one millisecond per control
cycle): `observe` returns once the arm's clock reaches the next control period, so each period is
`control_dt` of the arm's motion. On a real arm that is the wall clock. franky-sim, on a loaded machine, falls
behind the wall clock; a loop kept on the wall clock would then hand franky a new motion every fraction of a
period of the arm's time, and the arm, taken over before it brakes, would overshoot its targets by several
times what it does on the real arm.

`stop` is franky's `Robot.stop` (the arm brakes under its own controller), callable from any thread; after it
the robot refuses actions until `reset`. A reflex or error reported by the arm, or a lost connection, raises
`FrankaError` with what happened and what to do, which the control loop turns into a safe stop.

Runs against a real arm (FCI enabled in Desk, `realtime=True` on a realtime kernel) or against `franky-sim`,
which serves the same libfranka protocol on a loopback address (`franky-sim -s mujoco`).
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

import numpy as np

from roborl.robot.interface import RobotInterface

HOME = np.array([0.0, np.pi / 8, 0.0, -5 * np.pi / 8, 0.0, 3 * np.pi / 4, np.pi / 4])  # the tasks' home posture
TCP_LOW, TCP_HIGH = np.array([0.25, -0.4, 0.01]), np.array([0.8, 0.4, 0.45])  # the tasks' TCP workspace
# joint limits of the FR3 (Franka's datasheet) intersected with the Panda's, less a margin for tracking
JOINT_LOWER = np.array([-2.7437, -1.7628, -2.8973, -3.0421, -2.8065, 0.5445, -2.8973]) + 0.02
JOINT_UPPER = np.array([2.7437, 1.7628, 2.8973, -0.1518, 2.8065, 3.7525, 2.8973]) - 0.02
HOME_TCP = np.array([0.61501, 0.0, 0.16978])  # the TCP at HOME (the tasks' forward kinematics)
DOWN = np.array([1.0, 0.0, 0.0, 0.0])  # quaternion (x, y, z, w): the gripper pointing down, as the tasks' IK holds it
CONTROLLERS = ("ee_delta_pos", "joint_delta_pos", "joint_pos")
GRASP_FORCE = 20.0  # N
GRIPPER_SPEED = 0.1  # m/s
HOME_RESTARTS = 3  # times a reset starts the home motion again where it ended short of home (a planner failure)
ARM_CLOCK_TIMEOUT = 1.0  # s of wall time the arm's clock may stand still before observe() gives up
TaskState = Callable[[dict[str, np.ndarray]], np.ndarray]


class FrankaError(RuntimeError):
    """The arm reported an error or reflex, or the connection to it failed; the message says what to do."""


def active_errors(errors) -> list[str]:
    """The names of the flags set in a libfranka `Errors` (e.g. ['cartesian_reflex'])."""
    return [name for name in dir(errors) if not name.startswith("_") and getattr(errors, name) is True]


def _franky():
    try:
        import franky
    except ImportError as exc:
        raise FrankaError("roborl.robot.franka needs franky: pip install 'roborl[franka]' "
                          "(and franky-sim to try it without an arm)") from exc
    return franky


def franky_errors() -> tuple[type[BaseException], ...]:
    """Every exception class franky raises (they do not share one base)."""
    franky = _franky()
    return tuple(getattr(franky, name) for name in dir(franky) if name.endswith(("Exception", "Error")))


class FrankaRobot(RobotInterface):
    clocked = True  # the arm's clock paces the control loop (see the module's docstring)

    def __init__(self, host: str, metadata: dict, *, task_state: TaskState | None = None, dynamics: float = 0.2,
                 realtime: bool = False) -> None:
        """`metadata`: the artifact's (`PolicyClient.metadata` or the exported sidecar): its controller, control
        period and action scaling. `dynamics`: franky's relative dynamics factor (the fraction of the arm's
        velocity, acceleration and jerk limits motions may use). `realtime`: require a realtime kernel, as
        libfranka does on a real arm; False lets it run on an ordinary one (franky-sim)."""
        env, action = metadata["env"], metadata["action"]
        if env.get("controller") not in CONTROLLERS:
            raise FrankaError(f"the policy was trained with controller '{env.get('controller')}'; a Franka runs "
                              f"{', '.join(CONTROLLERS)}")
        if not 0 < dynamics <= 1:
            raise FrankaError(f"dynamics={dynamics} must be in (0, 1]: the fraction of the arm's limits motions use")
        self.host, self.controller, self.control_dt = host, env["controller"], float(env["control_dt"])
        self.scale, self.offset = np.asarray(action["scale"], float), np.asarray(action["offset"], float)
        self.task_state, self.dynamics, self.realtime = task_state, dynamics, realtime
        self.proprio: dict[str, np.ndarray] = {}
        self._lock, self._stopped = threading.Lock(), threading.Event()
        self._gripper_target: float | None = None
        self._gripper_future = None  # franky's future of the gripper command in flight
        self._robot = self._gripper = None
        self._arm_time: float | None = None  # the arm's clock at the newest observation (s)
        self._next_period: float | None = None  # the arm's time at which the next observation is due (s)

    # ---- connection ---------------------------------------------------------------------------
    def connect(self) -> None:
        franky = _franky()
        config = franky.RealtimeConfig.Enforce if self.realtime else franky.RealtimeConfig.Ignore
        try:
            self._robot = franky.Robot(self.host, realtime_config=config)
            self._robot.relative_dynamics_factor = self.dynamics
            self._robot.recover_from_errors()
            self._gripper = franky.Gripper(self.host)
        except (*franky_errors(), RuntimeError) as exc:
            raise FrankaError(f"cannot reach the Franka at {self.host} ({exc}); check the address, that the arm is "
                              "unlocked with FCI active in Desk (or that franky-sim serves it)") from exc

    def close(self) -> None:
        self._robot = self._gripper = None

    def _call(self, what: str, fn, *args):
        """One franky call; its failures become a `FrankaError` that says what the arm reported."""
        try:
            return fn(*args)
        except (*franky_errors(), RuntimeError) as exc:  # RuntimeError: franky's motion planner (Ruckig)
            if isinstance(exc, _franky().NetworkException) or str(exc) == "Net Exception":  # (franky's state
                # getter raises libfranka's network error as a plain RuntimeError with this text)
                raise FrankaError(f"franka {what} failed: the connection to {self.host} is lost ({exc}). A Franka "
                                  "stops by itself when its commands stop; reconnect and reset the cell") from exc
            errors = self._errors()
            cause = f"the arm reports {errors}" if errors else f"{type(exc).__name__}: {str(exc).rstrip('.')}"
            raise FrankaError(f"franka {what} failed: {cause}. The arm is stopped: clear the error "
                              "(recover in Desk or FrankaRobot.reset()) and reset the cell before the next episode") from exc

    def _errors(self) -> str:
        try:
            state = self._robot.state
        except Exception:
            return ""
        return ", ".join(active_errors(state.current_errors) or active_errors(state.last_motion_errors))

    # ---- the five calls -----------------------------------------------------------------------
    def clock(self) -> float:
        return self._arm_time if self._arm_time is not None else time.monotonic()

    def _read_state(self):
        with self._lock:
            return self._call("reading the state", lambda: self._robot.state)

    def _await_period(self):
        """The arm's state once its clock reaches the next control period (at once for the first observation
        after a reset). A clock that stands still for `ARM_CLOCK_TIMEOUT` is a stalled connection."""
        state = self._read_state()
        last, stalled_at = state.time.to_sec(), time.monotonic() + ARM_CLOCK_TIMEOUT
        while self._next_period is not None and (behind := self._next_period - state.time.to_sec()) > 5e-4:
            if state.time.to_sec() != last:
                last, stalled_at = state.time.to_sec(), time.monotonic() + ARM_CLOCK_TIMEOUT
            elif time.monotonic() > stalled_at:
                raise FrankaError(f"the Franka's clock stood still for {ARM_CLOCK_TIMEOUT:.0f} s (the arm at "
                                  f"{self.host} stopped sending its state); check the connection and reset the cell")
            time.sleep(max(2.5e-4, behind))  # the arm's clock runs at most as fast as the wall clock: no oversleep
            state = self._read_state()
        now = state.time.to_sec()
        self._arm_time = now
        self._next_period = now + self.control_dt if self._next_period is None else max(
            self._next_period + self.control_dt, now)  # after an overrun, one period at once, then on schedule
        return state

    def observe(self) -> dict[str, np.ndarray]:
        state = self._await_period()
        with self._lock:
            width = float(self._call("reading the gripper", lambda: self._gripper.width))
        if errors := active_errors(state.current_errors):
            raise FrankaError(f"the arm reports {', '.join(errors)} (a reflex or a limit); it stopped. Clear "
                              "it (Desk or FrankaRobot.reset()) and reset the cell before the next episode")
        q, dq = np.asarray(state.q, float), np.asarray(state.dq, float)
        tcp = np.asarray(state.O_T_EE.translation, float)
        self.proprio = {"q": q, "dq": dq, "gripper": np.array([width]), "tcp": tcp}
        parts = [q, 0.1 * dq, [10 * width], tcp]
        if self.task_state is not None:
            parts.append(self.task_state(self.proprio))
        return {"state": np.concatenate(parts).astype(np.float32), "tcp": tcp.astype(np.float32)}

    def act(self, action: np.ndarray) -> None:
        if self._stopped.is_set():
            raise FrankaError("the Franka was stopped; reset it (FrankaRobot.reset()) before sending actions")
        franky = _franky()
        command = self.scale * np.clip(np.asarray(action, float), -1, 1) + self.offset
        if self.controller == "ee_delta_pos":
            target = np.clip(self.proprio["tcp"] + command[:3], TCP_LOW, TCP_HIGH)
            motion = franky.CartesianMotion(franky.Affine(target, DOWN), franky.ReferenceType.Absolute)
        else:
            q = command[:7] + (self.proprio["q"] if self.controller == "joint_delta_pos" else 0.0)
            motion = franky.JointMotion(franky.JointState(np.clip(q, JOINT_LOWER, JOINT_UPPER)))
        with self._lock:
            self._call("moving", lambda: self._robot.move(motion, asynchronous=True))
            self._command_gripper(2 * float(command[-1]))  # the action commands each finger's opening

    def _command_gripper(self, width: float) -> None:
        """Sends the newest commanded width once the gripper is free and the width changed by a centimetre. The
        gripper runs one command at a time, and franky's future of a running one must be kept (dropping it
        waits for the command to end), so a command while one runs waits for a later period."""
        if self._gripper_future is not None and not self._gripper_future.wait(0):
            return
        if self._gripper_target is not None and abs(width - self._gripper_target) < 0.01:
            return
        closing = self._gripper_target is not None and width < self._gripper_target
        self._gripper_target = width
        if closing:  # grasp with any width in [0, width + 8 cm] counting as held, so the force stays on
            self._gripper_future = self._call(
                "grasping", lambda: self._gripper.grasp_async(0.0, GRIPPER_SPEED, GRASP_FORCE, 0.0, 0.08))
        else:
            self._gripper_future = self._call("opening the gripper", lambda: self._gripper.move_async(width, GRIPPER_SPEED))

    def _stop_motion(self):
        """A motion that brings the current one to rest within the dynamics limits, of the controller's type."""
        franky = _franky()
        return franky.CartesianStopMotion() if self.controller == "ee_delta_pos" else franky.JointStopMotion()

    def hold(self) -> None:
        with self._lock:
            self._call("holding", lambda: self._robot.move(self._stop_motion(), asynchronous=True))

    def stop(self) -> None:
        """Brake now; from any thread, more than once. Not under the lock: a stuck call must not delay it."""
        self._stopped.set()
        if self._robot is not None:
            self._call("stopping", self._robot.stop)

    def _start(self, motion) -> None:
        try:
            self._robot.move(motion, asynchronous=True)
        except _franky().ControlException:  # the motion an earlier stop preempted reports it here, once
            self._robot.move(motion, asynchronous=True)

    def _in_motion(self) -> bool:
        """Whether a motion still runs; one that ended in an error (a planner failure) has not."""
        try:
            return self._robot.poll_motion()
        except (*franky_errors(), RuntimeError):
            return False

    def reset(self, tolerance: float = 0.005, timeout: float = 20.0) -> dict[str, np.ndarray]:
        """The scripted reset: clear the stop and any error, move to the tasks' home (the TCP to `HOME_TCP`
        pointing down for `ee_delta_pos`, the joints to `HOME` otherwise) to within `tolerance` (m or rad), open
        the gripper. The home motion is of the policy's type, because franky cannot switch a running motion's
        type; it is watched on the measured pose rather than joined, because a planner that waits for the
        last tenth of a millimetre (franky-sim's, now and then) must not hang a reset; a home motion that ends
        short of home (franky's planner gave up) is started again, up to `HOME_RESTARTS` times."""
        franky = _franky()
        if self.controller == "ee_delta_pos":  # a motion object runs once: each start gets a new one
            home = lambda: franky.CartesianMotion(franky.Affine(HOME_TCP, DOWN), franky.ReferenceType.Absolute)  # noqa: E731
            error = lambda state: np.abs(np.asarray(state.O_T_EE.translation) - HOME_TCP).max()  # noqa: E731
        else:
            home = lambda: franky.JointMotion(franky.JointState(HOME))  # noqa: E731
            error = lambda state: np.abs(np.asarray(state.q) - HOME).max()  # noqa: E731
        with self._lock:
            with contextlib.suppress(*franky_errors(), RuntimeError):  # collect what the last motion raised (a
                self._robot.join_motion(0.5)                       # planner failure, a stop's preemption)
            self._call("recovering", self._robot.recover_from_errors)
            self._call("moving home", lambda: self._start(home()))
            deadline, started, restarts = time.monotonic() + timeout, time.monotonic(), 0
            while (off := error(self._call("reading the state", lambda: self._robot.state))) > tolerance:
                if time.monotonic() - started > 1.0 and restarts < HOME_RESTARTS and not self._in_motion():
                    restarts, started = restarts + 1, time.monotonic()  # the home motion ended short of home
                    self._call("moving home", lambda: self._start(home()))
                if time.monotonic() > deadline:
                    self._robot.stop()
                    raise FrankaError(f"the Franka did not reach its home pose within {timeout:.0f} s (still {off:.3f} "
                                      "away); check for an obstacle or a reflex in Desk and reset again")
                time.sleep(0.01)
            self._call("stopping the gripper", self._gripper.stop)  # a grasp holds its force until stopped
            if self._gripper_future is not None:
                self._gripper_future.wait(2.0)  # ended by the stop; only then may it be dropped
                self._gripper_future = None
            self._call("opening the gripper", lambda: self._gripper.move(2 * self.offset[-1] + 2 * self.scale[-1],
                                                                          GRIPPER_SPEED))
        self._gripper_target = None
        self._stopped.clear()
        self._next_period = None  # the control periods start again from here
        return self.observe()
