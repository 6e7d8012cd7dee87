"""A MuJoCo digital twin of an embedded task, in its own process, at real-time rate: the peer the robot
side (`roborl.robot`) is tested against.

The twin owns the clock. Every control period it publishes an observation (`state`, `tick`), waits up
to `window` of the period for the command answering that tick, then integrates one period of physics
with it (or, without one, holding the pose) and sleeps until the next tick. Dynamics perturbations and
actuation latency are `sim.randomization.Randomization` values held fixed (`perturb`), e.g. a cube 1.5×
heavier, half the friction and 20 ms before a new command takes effect.

Like a real robot driver it protects itself: `stop` (from any client, on its own connection) makes it
hold and ignore commands until `reset`; and when commands stop arriving for `command_timeout` seconds
mid-episode, it stops by itself. `status` reports when a stop was requested and from which tick it held.

Run `python -m roborl.robot.twin --env mujoco/Push --perturb object_mass=1.5 friction=0.5 latency_ms=20`;
it prints `roborl twin: listening on ws://HOST:PORT` once it is ready.
"""
from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from roborl.robot.interface import RobotInterface
from roborl.wire import WireError, pack, unpack

RESET_WAIT_S = 5.0  # the twin answers a reset once its physics has reset, or after two such waits at most
ANSWER_TIMEOUT_S = 5.0  # a client waits this long for an answer, beyond the waits the twin may take before it


@dataclass
class TwinSettings:
    env_id: str = "mujoco/Push"
    controller: str = "ee_delta_pos"
    control_freq: int = 20
    perturb: dict[str, float] = field(default_factory=dict)  # Randomization field -> fixed value
    seed: int = 0
    window: float = 0.8  # fraction of the period the twin waits for the command of a tick
    command_timeout: float | None = None  # seconds without commands mid-episode before it stops itself (None: 4 periods)
    camera: str | None = None  # publish this camera's frame as `rgb` with every observation (None: no frames)
    render_size: tuple[int, int] = (64, 64)  # [height, width] of the frames
    # `state` is the arm's proprioception alone (env.proprio_only); the task's full state then comes as
    # `task_state`, for scripted operators and judges standing in for a person who watches the cell
    proprio_only: bool = False

    def randomization(self):
        """The perturbation as a `Randomization` with every range held at its value (SimError if invalid)."""
        from roborl.sim.errors import SimError
        from roborl.sim.randomization import Randomization

        try:  # obs_noise and camera_pos are single numbers already
            spec = Randomization(**{k: v if k in ("obs_noise", "camera_pos") else [v, v] for k, v in self.perturb.items()})
        except TypeError as exc:
            raise SimError(f"unknown twin perturbation ({exc}); use fields of sim.randomization.Randomization") from exc
        spec.validate(1.0 / self.control_freq)
        return spec


def parse_perturb(items: list[str]) -> dict[str, float]:
    """`["object_mass=1.5", "latency_ms=20"]` -> {"object_mass": 1.5, "latency_ms": 20.0}; ValueError names a bad item."""
    perturb = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            perturb[key] = float(value)
        except ValueError:
            sep = ""
        if not sep or not key:
            raise ValueError(f"--perturb '{item}' must look like field=number (e.g. object_mass=1.5 latency_ms=20)")
    return perturb


class Twin:
    """The simulation side: physics thread + a request handler shared by all client connections."""

    def __init__(self, settings: TwinSettings) -> None:
        from roborl import (
            sim,
            tasks,  # noqa: F401  (registers the embedded tasks)
        )
        self.settings = settings
        randomization = settings.randomization()
        view = {} if settings.camera is None else {"obs_mode": "rgb", "camera": settings.camera,
                                                    "render_size": tuple(settings.render_size)}
        self.env = sim.make(settings.env_id, 1, controller=settings.controller, control_freq=settings.control_freq,
                            episode_length=10**9, seed=settings.seed, proprio_only=settings.proprio_only,
                            randomization=randomization if randomization.enabled else None, **view)
        self.dt = self.env.control_dt
        self.timeout = settings.command_timeout if settings.command_timeout is not None else 4 * self.dt
        self.action_dim = self.env.action_dim
        self.cond = threading.Condition()
        self.tick = -1
        self.obs = self.env.reset(seed=settings.seed)
        self.published: dict = {}
        self.command: tuple[int, np.ndarray] | None = None
        self.last_action = np.zeros(self.action_dim, np.float32)
        self.reset_request: int | None = None
        self.resets_done = 0
        self.status = {"stopped": False, "stop_reason": None, "stop_requested_at": None, "stop_effective_at": None,
                       "ticks": 0, "missed": 0, "overruns": 0, "commands": 0, "episode_step": 0, "success": False,
                       "terminated": False, "last_command_at": None}
        self.running = True

    # ---- physics thread ---------------------------------------------------------------------------
    def hold_action(self) -> np.ndarray:
        """Zero motion for delta controllers, the gripper as last commanded; position targets held."""
        if self.settings.controller == "joint_pos":
            return self.last_action.copy()
        hold = np.zeros(self.action_dim, np.float32)
        hold[-1] = self.last_action[-1]
        return hold

    def _publish(self, tick: int, t: float) -> None:
        s = self.status
        self.published = {"type": "obs", "state": self.obs["state"][0].numpy(), "tick": tick, "time": t,
                          "episode_step": s["episode_step"], "success": s["success"], "terminated": s["terminated"],
                          "stopped": s["stopped"]}
        if "rgb" in self.obs:
            self.published["rgb"] = self.obs["rgb"][0].numpy()
        if self.settings.proprio_only:
            self.published["task_state"] = self.env.unwrapped.task_state()[0].numpy()

    def run(self) -> None:
        import torch

        start = time.monotonic()
        k = 0
        while self.running:
            t_k = start + k * self.dt
            with self.cond:
                if self.reset_request is not None:
                    self.obs = self.env.reset(seed=self.reset_request)
                    self.reset_request = None
                    self.command = None
                    self.last_action[:] = 0
                    self.status.update(stopped=False, stop_reason=None, stop_requested_at=None, stop_effective_at=None,
                                       episode_step=0, success=False, terminated=False, last_command_at=None)
                    self.resets_done += 1
                self.tick = k
                self._publish(k, t_k)
                self.cond.notify_all()
                window_end = t_k + self.settings.window * self.dt
                self.cond.wait_for(lambda: self.status["stopped"] or self.reset_request is not None
                                   or (self.command is not None and self.command[0] == k),
                                   timeout=max(0.0, window_end - time.monotonic()))
                s = self.status
                last = s["last_command_at"]
                if not s["stopped"] and last is not None and time.monotonic() - last > self.timeout:
                    self._stop("command_timeout")
                if s["stopped"] or s["terminated"]:
                    if s["stopped"] and s["stop_effective_at"] is None:
                        s["stop_effective_at"] = max(t_k, s["stop_requested_at"])
                    action = self.hold_action()
                elif self.command is not None and self.command[0] == k:
                    action = self.command[1]
                    self.last_action = action.copy()
                else:
                    action = self.hold_action()
                    s["missed"] += 1
            if self.reset_request is None:
                obs, _, term, _, info = self.env.step(torch.from_numpy(action)[None])
                with self.cond:
                    self.obs = obs
                    s = self.status
                    s["ticks"] += 1
                    s["episode_step"] += 1
                    s["success"] = bool(info["success"][0]) and not s["terminated"]
                    s["terminated"] = s["terminated"] or bool(term[0])
            elapsed = time.monotonic() - t_k
            if elapsed > self.dt:
                self.status["overruns"] += 1
            k = max(k + 1, int((time.monotonic() - start) / self.dt))  # after an overrun, skip to the current tick
            time.sleep(max(0.0, start + k * self.dt - time.monotonic()))

    def _stop(self, reason: str) -> None:
        s = self.status
        if not s["stopped"]:
            s.update(stopped=True, stop_reason=reason, stop_requested_at=time.monotonic())

    # ---- requests ---------------------------------------------------------------------------------
    def handle(self, request: dict) -> dict:
        kind = request.get("type")
        with self.cond:
            if kind == "observe":
                after = request.get("after", -1)
                self.cond.wait_for(lambda: self.tick > after, timeout=2.0)
                return dict(self.published)
            if kind == "act":
                action = request.get("action")
                if not isinstance(action, np.ndarray) or action.shape != (self.action_dim,) or \
                        action.dtype != np.float32 or not np.isfinite(action).all():
                    return {"type": "error", "error": f"'action' must be a finite float32 array of shape [{self.action_dim}]"}
                if self.status["stopped"]:
                    return {"type": "error", "error": "the twin is stopped; reset it first"}
                self.command = (int(request.get("tick", self.tick)), np.clip(action, -1, 1))
                self.status["commands"] += 1
                self.status["last_command_at"] = time.monotonic()
                self.cond.notify_all()
                return {"type": "ok"}
            if kind == "hold":
                self.status["last_command_at"] = time.monotonic()
                return {"type": "ok"}
            if kind == "stop":
                self._stop(str(request.get("reason", "stop")))
                self.cond.notify_all()
                return {"type": "ok"}
            if kind == "reset":
                target = self.resets_done + 1
                self.reset_request = int(request.get("seed", 0))
                self.cond.notify_all()
                self.cond.wait_for(lambda: self.resets_done >= target and self.tick >= 0, timeout=RESET_WAIT_S)
                self.cond.wait_for(lambda: self.published.get("episode_step", 1) == 0, timeout=RESET_WAIT_S)
                return dict(self.published)
            if kind == "status":
                return {"type": "status", **self.status, "control_dt": self.dt, "tick": self.tick}
        return {"type": "error", "error": f"unknown request type {kind!r}"}


def serve_twin(settings: TwinSettings, host: str = "127.0.0.1", port: int = 0) -> None:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.server import serve

    built = threading.Event()
    made: dict = {}

    def physics() -> None:
        """Builds the twin here, in the thread that steps it: a camera's GL context belongs to one thread."""
        try:
            made["twin"] = Twin(settings)
        except BaseException as exc:
            made["error"] = exc
        finally:
            built.set()
        if "twin" in made:
            made["twin"].run()

    thread = threading.Thread(target=physics, daemon=True, name="physics")
    thread.start()
    built.wait()
    if "error" in made:
        raise made["error"]
    twin = made["twin"]

    def handler(connection) -> None:
        try:
            for payload in connection:
                try:
                    request = unpack(payload)
                    reply = twin.handle(request) if isinstance(request, dict) else {"type": "error", "error": "not a map"}
                except WireError as exc:
                    reply = {"type": "error", "error": str(exc)}
                connection.send(pack(reply))
        except ConnectionClosed:  # a client that died mid-session: its connection ends, the twin goes on
            pass

    with serve(handler, host, port, compression=None, ping_interval=None) as server:
        bound = server.socket.getsockname()
        print(f"roborl twin: listening on ws://{bound[0]}:{bound[1]}", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            twin.running = False


def start_twin(settings: TwinSettings, timeout: float = 60.0) -> tuple[subprocess.Popen, str]:
    """Launch a twin process; returns it and its websocket URI once it listens."""
    settings.randomization()  # a bad perturbation fails here, in one line, not in the child
    args = [sys.executable, "-m", "roborl.robot.twin", "--env", settings.env_id, "--controller", settings.controller,
            "--control-freq", str(settings.control_freq), "--seed", str(settings.seed), "--window", str(settings.window)]
    if settings.command_timeout is not None:
        args += ["--command-timeout", str(settings.command_timeout)]
    if settings.perturb:
        args += ["--perturb", *[f"{k}={v}" for k, v in settings.perturb.items()]]
    if settings.camera is not None:
        args += ["--camera", settings.camera, "--render-size", *map(str, settings.render_size)]
    if settings.proprio_only:
        args.append("--proprio-only")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("roborl twin: listening on "):
            return proc, line.split()[-1]
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"the twin process did not start (exit code {proc.poll()})")


class TwinRobot(RobotInterface):
    """`RobotInterface` of a running twin. Clocked (default): the twin's clock paces the control loop
    (`observe` returns at the twin's next tick); otherwise `observe` returns the newest sample at once and
    the loop keeps its own schedule. `stop` goes over a connection of its own, so it works while
    `observe` waits."""

    def __init__(self, uri: str, control_dt: float = 0.05, clocked: bool = True) -> None:
        self.uri, self.control_dt, self.clocked = uri, control_dt, clocked
        self.tick = -1
        self.last_obs: dict = {}
        self._lock = threading.Lock()

    def connect(self) -> None:
        from websockets.sync.client import connect

        self._conn = connect(self.uri, compression=None, proxy=None, ping_interval=None, legacy=True)
        self._estop = connect(self.uri, compression=None, proxy=None, ping_interval=None, legacy=True)
        self.control_dt = self.status()["control_dt"]

    def _request(self, message: dict, conn=None, waits: float = 0.0) -> dict:
        """The twin's answer to `message`; `waits`: how long the twin itself may wait before it answers, so a
        slow answer (a reset under load) is not taken for a hung twin."""
        conn = conn or self._conn
        timeout = waits + ANSWER_TIMEOUT_S
        with self._lock if conn is self._conn else contextlib.nullcontext():
            conn.send(pack(message))
            try:
                reply = unpack(conn.recv(timeout=timeout))
            except TimeoutError:
                raise TimeoutError(f"the twin at {self.uri} did not answer {message['type']!r} in {timeout:g} s; "
                                   "check that it still runs (roborl twin)") from None
        if reply.get("type") == "error":
            raise RuntimeError(f"twin: {reply['error']}")
        return reply

    def observe(self) -> dict[str, np.ndarray]:
        self.last_obs = self._request({"type": "observe", "after": self.tick if self.clocked else -1})
        self.tick = self.last_obs["tick"]
        return self.last_obs

    def act(self, action: np.ndarray) -> None:
        self._request({"type": "act", "action": np.asarray(action, np.float32), "tick": self.tick})

    def hold(self) -> None:
        self._request({"type": "hold"})

    def stop(self) -> None:
        self._request({"type": "stop", "reason": "client"}, conn=self._estop)

    def reset(self, seed: int = 0) -> dict:
        self.last_obs = self._request({"type": "reset", "seed": seed}, waits=2 * RESET_WAIT_S)
        self.tick = self.last_obs["tick"] - 1
        return self.last_obs

    def status(self) -> dict:
        return self._request({"type": "status"}, conn=self._estop)

    def close(self) -> None:
        for conn in (getattr(self, "_conn", None), getattr(self, "_estop", None)):
            if conn is not None:
                conn.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m roborl.robot.twin", description="MuJoCo digital twin process")
    p.add_argument("--env", default="mujoco/Push")
    p.add_argument("--controller", default="ee_delta_pos")
    p.add_argument("--control-freq", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window", type=float, default=0.8)
    p.add_argument("--command-timeout", type=float)
    p.add_argument("--perturb", nargs="*", default=[], help="e.g. object_mass=1.5 friction=0.5 latency_ms=20")
    p.add_argument("--camera", help="publish this camera's frames as `rgb` (e.g. front)")
    p.add_argument("--render-size", type=int, nargs=2, default=[64, 64], metavar=("H", "W"))
    p.add_argument("--proprio-only", action="store_true", help="`state`: the arm's proprioception alone (the task's "
                   "full state as `task_state`)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    try:
        perturb = parse_perturb(args.perturb)
    except ValueError as exc:
        p.error(str(exc))
    settings = TwinSettings(args.env, args.controller, args.control_freq, perturb, args.seed, args.window,
                            args.command_timeout, args.camera, tuple(args.render_size), args.proprio_only)
    serve_twin(settings, args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
