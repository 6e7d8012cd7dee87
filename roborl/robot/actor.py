"""The actor of real-world RL (`resources.actor: robot`): a process beside the robot that runs episodes with
the learner's newest policy through the control loop (shields, watchdog, e-stop, the operator's teleop device),
and streams the transitions to the learner (roborl/robot/link.py), which streams weights back.

It learns the run's config from the learner, so all it needs is the learner's address:

    roborl actor 127.0.0.1:7100

The learner starts it itself unless `robot.spawn_actor` is false (an actor on the robot's PC, a learner on a GPU
box). An actor keeps running episodes with the weights it has while its learner is away, and resends what the
learner lacks once it is back; it stops the robot and exits once the run is over, or once the learner has been
gone for `robot.reconnect_s`. Its last line is a JSON report: transitions and episodes sent and acknowledged.
"""
from __future__ import annotations

import json
import signal
import sys
import threading
import uuid
from collections.abc import Callable

import numpy as np
import torch

from roborl.config import Config, RobotConfig, config_from_dict
from roborl.errors import UserError
from roborl.robot.control_loop import ControlLoop
from roborl.robot.hil import SuccessFn, TransitionRecorder
from roborl.robot.interface import RobotInterface
from roborl.robot.judged_reward import CORRECTIONS, JudgedClassifier, claims_success
from roborl.robot.link import ActorLink, parse_address
from roborl.robot.teleop import ScriptedOperator, TeleopDevice


def camera_view(cfg: Config, classifier_view: dict | None) -> dict:
    """The camera frames the robot must send: the policy's (env.obs_mode rgb) and the reward classifier's,
    which must then be the same view."""
    policy_view = {"camera": "front", "render_size": tuple(cfg.env.render_size)} if cfg.env.obs_mode == "rgb" else None
    if policy_view and classifier_view and policy_view != classifier_view:
        raise UserError(f"the policy sees {policy_view} and the reward classifier was trained on {classifier_view}: "
                        "set env.render_size to the classifier's size, or train the classifier on the policy's view")
    return policy_view or classifier_view or {}


def make_robot(cfg: Config, metadata: dict, view: dict) -> tuple[RobotInterface, Callable[[], None]]:
    """The run's robot, connected, and how to let go of what was started for it. `metadata`: the policy's
    (roborl.deploy.export.policy_io); `view`: the camera frames it must send."""
    r = cfg.robot
    if r.kind == "twin":
        from roborl.robot.twin import TwinRobot, TwinSettings, start_twin

        proc, uri = None, r.address
        if uri is None:
            proc, uri = start_twin(TwinSettings(cfg.env.id, cfg.env.controller, cfg.env.control_freq, dict(r.perturb),
                                                r.seed, **view, proprio_only=cfg.env.proprio_only))
        robot = TwinRobot(uri)
        try:
            robot.connect()
        except BaseException:
            if proc is not None:
                proc.kill()
            raise
        return robot, (lambda: (robot.close(), proc and proc.kill()))
    if r.address is None or r.task is None:
        raise UserError("robot.kind franka needs robot.address (the arm's IP, or franky-sim's host) and robot.task "
                        "(e.g. roborl.robot.cell_tasks:Reach)")
    from roborl.robot.cell_tasks import TaskRobot
    from roborl.robot.franka import FrankaRobot

    task = make_task(r.task)
    robot = TaskRobot(FrankaRobot(r.address, metadata, task_state=task.state), task)
    robot.connect()
    return robot, robot.close


def make_task(spec: str):
    """`robot.task` (module:factory): what a Franka cell does, e.g. roborl.robot.cell_tasks:Reach."""
    from roborl.imports import import_factory

    return import_factory(spec, "robot.task")()


def check_loadable(robot: RobotConfig) -> None:
    """Builds what an actor on this machine builds from the robot's settings, but the robot and a teleop device
    (hardware): the reward (classifier, judge), a scripted operator and a Franka cell's task. A learner that starts
    its own actor calls it before the run begins, so a typo is a one-line error with nothing written, not the
    actor's exit after the run opened."""
    make_success_fn(robot.reward, robot)
    if ":" in robot.operator:
        make_operator(robot.operator)
    if robot.kind == "franka" and robot.task is not None:
        make_task(robot.task)


def make_operator(spec: str) -> TeleopDevice | None:
    """`robot.operator`: none, a device kind, or module:factory (a scripted operator: the factory returns its
    rule, obs -> action or None)."""
    if spec == "none":
        return None
    if ":" in spec:
        from roborl.imports import import_factory

        return ScriptedOperator(import_factory(spec, "robot.operator")())
    from roborl.robot.teleop_devices import make_teleop

    return make_teleop(spec)


def make_success_fn(spec: str, robot: RobotConfig | None = None) -> tuple[SuccessFn, dict | None]:
    """`robot.reward`: the robot's success flag, or a reward classifier on its camera frame (whose claimed
    successes `robot.judge` judges, if set); with the camera view the classifier was trained on (None for the flag)."""
    if spec == "success":
        return (lambda obs: bool(obs["success"])), None
    from roborl.reward_classifier import RewardClassifier
    from roborl.sim.render import camera_views

    classifier = RewardClassifier.load(spec)
    meta = classifier.metadata
    if robot is not None and robot.judge != "none":
        from roborl.imports import import_factory

        success = JudgedClassifier(classifier, import_factory(robot.judge, "robot.judge")(),
                                   robot.corrections or CORRECTIONS, robot.refit_steps, robot.seed,
                                   robot.refit_every)
    else:
        def success(obs: dict) -> bool:
            return claims_success(classifier, obs)
    camera, (height, width) = meta.get("camera", "front"), meta["size"]
    return success, {"camera": camera, "render_size": (height, width // len(camera_views(camera)))}  # per view


class PolicyCopy:
    """The actor's copy of the learner's policy: stochastic actions for exploration; new weights between
    episodes (never while the control loop's policy thread may be using them)."""

    def __init__(self, cfg: Config) -> None:
        from roborl.builder import make_env, make_run_policy
        from roborl.deploy.export import policy_io

        env = make_env(cfg.env, 1, cfg.train.seed, torch.device("cpu"))
        try:
            self.policy = make_run_policy(cfg, env).eval()
            self.metadata = policy_io(cfg, env)
        finally:
            env.close()
        self.version = -1

    def load(self, version: int, weights: dict[str, np.ndarray]) -> None:
        if version > self.version:
            self.policy.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in weights.items()})
            self.version = version

    @torch.no_grad()
    def __call__(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        batch = {k: torch.from_numpy(np.array(v))[None] for k, v in obs.items()}  # a copy: the message's are read-only
        return self.policy.act(batch).action.reshape(1, -1).numpy()


def run_actor(learner: str, episodes: int | None = None, exit_with_stdin: bool = False, out=sys.stdout) -> dict:
    """Runs episodes until the learner says the run is over (or `episodes` are done); returns the report.
    `exit_with_stdin`: stop the robot and end once stdin closes (the learner that started this actor died)."""
    try:
        parse_address(learner)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    link = ActorLink(learner, uuid.uuid4().hex, reconnect_s=30.0)  # until the first welcome
    while not link.welcomed.wait(0.5):
        if link.lost.is_set():
            raise UserError(f"no learner answered at {learner} (is `roborl train` with resources.actor robot running?)")
    cfg = config_from_dict(link.config)
    link.reconnect_s = cfg.robot.reconnect_s
    policy = PolicyCopy(cfg)
    success_fn, classifier_view = make_success_fn(cfg.robot.reward, cfg.robot)
    judged = success_fn if isinstance(success_fn, JudgedClassifier) else None  # refit between episodes
    operator = make_operator(cfg.robot.operator)  # before the robot: a bad operator starts no robot
    robot, release = make_robot(cfg, policy.metadata, camera_view(cfg, classifier_view))
    try:  # from here on, whatever ends the actor stops the robot
        recorder = TransitionRecorder(success_fn, judged.episode_stats if judged else None)
        loop: ControlLoop | None = None

        def on_step(step) -> None:
            if recorder.record(step):
                loop.end_episode()
            if len(recorder.rows) >= 10:  # a batch every half second at 20 Hz: the learner sees data soon
                link.send(*recorder.take())

        loop = ControlLoop(robot, policy, policy.metadata, teleop=operator, on_step=on_step)
        steps = cfg.robot.episode_steps or policy.metadata["env"]["episode_length"]
        report = {"episodes": 0, "transitions": 0, "batches": 0, "interventions": 0, "stops": []}
        stop = threading.Event()

        def halt(*_) -> None:
            stop.set()
            loop.estop("actor_stopped")
        signal.signal(signal.SIGTERM, halt)
        if exit_with_stdin:
            threading.Thread(target=lambda: (sys.stdin.read(), halt()), daemon=True, name="stdin-watch").start()
        while not (link.done.is_set() or link.lost.is_set() or stop.is_set()):
            if episodes is not None and report["episodes"] >= episodes:
                break
            if link.weights is not None:
                policy.load(*link.weights)
            if cfg.robot.reset == "operator":
                input(f"episode {report['episodes']}: reset the cell, then press Enter ")
            robot.reset(seed=cfg.robot.seed + report["episodes"])
            loop.reset()
            result = loop.run(steps)
            if result.reason != "done":
                report["stops"].append(f"episode {report['episodes']}: {result.reason} {result.detail}".strip())
            final = robot.observe()
            recorder.end_episode(final, loop.policy_obs(final))
            rows, ended = recorder.take()
            if rows or ended:
                link.send(rows, ended)
            report["episodes"] += 1
            if judged:
                report["refit"] = judged.refit() or report.get("refit")
    finally:
        robot.stop()
        release()
        link.close()
        if operator is not None:
            operator.close()
    report.update(session=link.session, transitions=link.sent_rows, acknowledged_transitions=link.acknowledged_rows,
                  batches=link.next_seq, unacknowledged_batches=link.unacknowledged(),
                  interventions=loop.report.interventions, learner_lost=link.lost.is_set())
    print(json.dumps(report), file=out, flush=True)
    return report
