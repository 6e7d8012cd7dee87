"""The fixed-rate control loop on the robot side: observe → policy → shield → act, every control period.

The policy runs in a worker thread, so a slow or vanished policy never blocks the loop. Each tick waits
for a fresh chunk until its deadline (a fraction of the period); without one it executes what earlier
chunks still hold for this step (open-loop chunks or temporal ensembling), else it holds the pose.
Watchdog: once the robot has had no action for `stop_after` seconds, or as soon as the policy server is
gone or refuses a request, the robot is stopped and the loop ends. `estop()` stops the robot at once,
from any thread. The shields of the artifact's metadata run on every executed action with the newest
state, stateful ones included (those the artifact could not contain).

An operator with a teleop device (`teleop`, roborl/robot/teleop.py) takes over whenever their device returns
an action: the loop executes it instead of the policy's, through the same shields, and marks the step as an
intervention in the records it hands to `on_step` (one per executed action: the observation, the executed
action, whether the operator commanded it), from which real-world RL builds its transitions.

A robot with `clocked = True` paces the loop (observe() returns at its next sample); otherwise the loop
keeps its own schedule of absolute deadlines, so periods do not drift. The report's periods are measured on
`robot.clock()`: a clocked robot's own clock, else the wall clock.
"""
from __future__ import annotations

import gc
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

import numpy as np
import torch

from roborl.deploy.client import PolicyRejected, PolicyUnavailable
from roborl.robot.ensemble import TemporalEnsembler
from roborl.robot.interface import RobotInterface
from roborl.robot.teleop import TeleopDevice
from roborl.shields.specs import build_shields

Policy = Callable[[dict[str, np.ndarray]], np.ndarray]  # one observation -> chunk K×A in [-1, 1]


@dataclass
class StepRecord:
    """One executed control period: what the robot observed, the action it executed (after the shields),
    whether the operator commanded it, and the observation as the policy saw it (history stacked)."""
    obs: dict[str, np.ndarray]
    action: np.ndarray
    intervened: bool
    policy_obs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class LoopReport:
    steps: int = 0
    reason: str = "done"  # done | estop | policy_unavailable | policy_late | policy_rejected | robot_error
    control_dt: float = 0.0
    periods: list[float] = field(default_factory=list)  # seconds between consecutive observations (robot.clock())
    policy_ms: list[float] = field(default_factory=list)  # submit → chunk available, per policy call
    late: int = 0  # ticks whose fresh chunk missed the deadline
    held: int = 0  # ticks without any action (the robot held its pose)
    overruns: int = 0  # ticks whose work took longer than the period
    shield_interventions: int = 0
    interventions: int = 0  # steps the operator's teleop device commanded
    stopped_at: float | None = None  # time.monotonic() of robot.stop()
    detail: str = ""

    def summary(self) -> dict:
        p = np.asarray(self.periods)
        jitter = np.abs(p - self.control_dt) * 1000 if len(p) else np.zeros(1)
        lat = np.asarray(self.policy_ms) if self.policy_ms else np.full(1, np.nan)
        return {"steps": self.steps, "reason": self.reason, "rate_hz": float(1 / p.mean()) if len(p) else float("nan"),
                "target_hz": 1 / self.control_dt, "jitter_ms_p50": float(np.percentile(jitter, 50)),
                "jitter_ms_p99": float(np.percentile(jitter, 99)), "jitter_ms_max": float(jitter.max()),
                "policy_ms_p50": float(np.percentile(lat, 50)), "policy_ms_p99": float(np.percentile(lat, 99)),
                "late": self.late, "held": self.held, "overruns": self.overruns,
                "shield_interventions": self.shield_interventions, "interventions": self.interventions}


class ControlLoop:
    def __init__(self, robot: RobotInterface, policy: Policy, metadata: dict, *, shield: bool = True,
                 ensemble_weight: float | None = None, query_every: int | None = None, deadline: float = 0.6,
                 stop_after: float | None = None, teleop: TeleopDevice | None = None,
                 on_step: Callable[[StepRecord], None] | None = None) -> None:
        """`ensemble_weight`: temporal ensembling with that m, querying every step; None: execute each chunk
        open loop (as in training) and query every `query_every` (default: the chunk length) steps.
        `deadline`: fraction of the period a tick waits for a fresh chunk. `stop_after`: seconds without
        any action before the watchdog stops the robot (default: two periods). `teleop`: an operator's device
        that takes over when it returns an action. `on_step`: called with each executed step's record."""
        self.robot, self.policy, self.metadata = robot, policy, metadata
        self.dt = float(metadata["env"]["control_dt"])
        chunk = int(metadata["action"]["chunk"])
        self.query_every = 1 if ensemble_weight is not None else (query_every or chunk)
        self.ensembler = TemporalEnsembler(ensemble_weight if ensemble_weight is not None else 0.0)
        self.history_len = int(metadata.get("obs_history", 1))
        self.deadline, self.stop_after = deadline * self.dt, stop_after if stop_after is not None else 2 * self.dt
        specs = metadata["shields"]["specs"] if shield else []
        self.shield = build_shields(specs) if specs else None
        self.history: deque[np.ndarray] = deque(maxlen=self.history_len)
        self.teleop, self.on_step = teleop, on_step
        self.stopped = threading.Event()
        self.episode_over = threading.Event()
        self.report = LoopReport(control_dt=self.dt)
        self._stop_lock = threading.Lock()

    # ---- safety ---------------------------------------------------------------------------------
    def estop(self, reason: str = "estop") -> None:
        """Stop the robot now and end the loop; callable from any thread (a button, a signal handler)."""
        with self._stop_lock:
            if self.report.stopped_at is None:
                self.robot.stop()
                self.report.stopped_at = time.monotonic()
                if self.report.reason == "done":
                    self.report.reason = reason
            self.stopped.set()

    def end_episode(self) -> None:
        """End `run` before its next period without stopping the robot (the episode is over, e.g. a success);
        callable from `on_step`."""
        self.episode_over.set()

    # ---- the loop -------------------------------------------------------------------------------
    def reset(self) -> None:
        """Start a new episode (after the robot was reset, e.g. by its operator following a stop): clear
        the stop, the observation history, the chunks and the stateful shields."""
        self.stopped.clear()
        self.episode_over.clear()
        self.report.stopped_at, self.report.reason, self.report.detail = None, "done", ""
        self.history.clear()
        self.ensembler.reset()
        if self.shield is not None:
            self.shield.reset()

    def policy_obs(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The policy's input for the robot's newest observation: `state` with the history of this episode."""
        frame = np.asarray(obs["state"], dtype=np.float32)
        if not self.history:
            self.history.extend([frame] * self.history_len)
        self.history.append(frame)
        out = {"state": np.concatenate(list(self.history))}
        if "rgb" in self.metadata["observation"]:
            out["rgb"] = obs["rgb"]
        return out

    def _shielded(self, obs: dict[str, np.ndarray], action: np.ndarray) -> np.ndarray:
        if self.shield is None:
            return action
        state = {"state": torch.tensor(np.asarray(obs["state"], np.float32))[None]}
        proposed = torch.as_tensor(action, dtype=torch.float32)[None]
        with torch.no_grad():
            safe, intervened, _ = self.shield(state, proposed)
        self.shield.observe(state, safe, {})
        self.report.shield_interventions += int(intervened.any())
        return safe[0].numpy()

    def run(self, steps: int) -> LoopReport:
        """Runs `steps` control periods (or until stopped) and returns the report (accumulated over runs)."""
        gc.freeze()  # while it runs, what exists now is not scanned: a full collection of a big heap would stall ticks
        report, pool = self.report, ThreadPoolExecutor(1, thread_name_prefix="policy")
        pending: tuple[Future, int, float] | None = None
        starved_since: float | None = None
        next_tick = time.monotonic()
        last_sample: float | None = None
        try:
            for step in range(steps):
                if self.stopped.is_set() or self.episode_over.is_set():
                    break
                if not self.robot.clocked:
                    time.sleep(max(0.0, next_tick - time.monotonic()))
                obs = self.robot.observe()
                tick, sample = time.monotonic(), self.robot.clock()
                if last_sample is not None:
                    report.periods.append(sample - last_sample)
                last_sample = sample
                policy_obs = self.policy_obs(obs)
                if pending is None and (step % self.query_every == 0 or self.ensembler.action(step) is None):
                    pending = (pool.submit(self.policy, policy_obs), step, tick)
                if pending is not None:
                    future, asked_at, submitted = pending
                    try:
                        chunk = future.result(timeout=max(0.0, tick + self.deadline - time.monotonic()))
                    except FutureTimeout:
                        report.late += 1
                    except PolicyUnavailable as exc:
                        report.reason, report.detail = "policy_unavailable", str(exc)
                        self.estop("policy_unavailable")
                        break
                    except PolicyRejected as exc:
                        report.reason, report.detail = "policy_rejected", str(exc)
                        self.estop("policy_rejected")
                        break
                    else:
                        report.policy_ms.append(1000 * (time.monotonic() - submitted))
                        self.ensembler.add(asked_at, np.asarray(chunk).reshape(-1, chunk.shape[-1]))
                        pending = None
                action = self.ensembler.action(step)
                operator = self.teleop.poll(obs) if self.teleop is not None else None
                if operator is not None:
                    action = operator
                if action is None:
                    report.held += 1
                    starved_since = starved_since or tick
                    if time.monotonic() - starved_since >= self.stop_after - 1e-3:
                        report.reason = "policy_late"
                        self.estop("policy_late")
                        break
                    self.robot.hold()
                else:
                    starved_since = None
                    executed = self._shielded(obs, action.astype(np.float32))
                    self.robot.act(executed)
                    report.interventions += operator is not None
                    if self.on_step is not None:
                        self.on_step(StepRecord(obs, executed, operator is not None, policy_obs))
                report.steps += 1
                if time.monotonic() - tick > self.dt:
                    report.overruns += 1
                next_tick = max(next_tick + self.dt, time.monotonic() - self.dt)
        except KeyboardInterrupt:
            self.estop("estop")
        except Exception as exc:  # the robot connection failed or the robot refused: stop, report, do not crash
            if not self.stopped.is_set():  # (after an e-stop the robot refusing actions is expected)
                report.reason, report.detail = "robot_error", f"{type(exc).__name__}: {exc}"
                try:
                    self.estop("robot_error")
                except Exception:
                    report.detail += " (and stopping the robot failed)"
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            gc.unfreeze()  # what the loop froze is collectable again once it ends
        return report


def client_policy(client) -> Policy:
    """A `PolicyClient` as the loop's policy: one observation in, the chunk of actions out."""
    return lambda obs: client.infer(obs)["action"]
