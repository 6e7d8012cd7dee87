"""The robot side against the MuJoCo digital twin in its own process: rate and jitter of the control
loop, the watchdog (server killed or hung), the e-stop, chunk execution, and the robot-side shield."""
import os
import signal
import threading
import time

import numpy as np
import pytest
from deploy_helpers import exported_artifact, running_twin

from roborl.deploy.client import PolicyClient
from roborl.deploy.server import start_server
from roborl.robot import ControlLoop, TemporalEnsembler
from roborl.robot.control_loop import client_policy
from roborl.robot.twin import TwinRobot

pytestmark = pytest.mark.realtime  # timing is asserted: scripts/test.sh runs these alone

SPHERE, RADIUS = np.array([0.5, 0.0, 0.2]), 0.07
TCP = slice(15, 18)


def test_temporal_ensembling_is_the_weighted_mean_of_overlapping_chunks():
    ens = TemporalEnsembler(weight=0.5)
    chunks = [np.full((3, 2), float(i)) + np.arange(3)[:, None] * 10 for i in range(3)]
    for step, chunk in enumerate(chunks):
        ens.add(step, chunk)
    w = np.exp(-0.5 * np.arange(3))  # oldest prediction first
    expected = (w[0] * chunks[0][2] + w[1] * chunks[1][1] + w[2] * chunks[2][0]) / w.sum()
    np.testing.assert_allclose(ens.action(2), expected)
    np.testing.assert_allclose(ens.action(4), chunks[2][2])  # only the newest chunk still covers step 4
    assert ens.action(5) is None


@pytest.fixture(scope="module")
def twin():
    yield from running_twin("mujoco/ReachAvoid")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return exported_artifact(tmp_path_factory, "reach_avoid")


def connected(uri: str, seed: int, clocked: bool = True) -> TwinRobot:
    robot = TwinRobot(uri, clocked=clocked)
    robot.connect()
    robot.reset(seed=seed)
    return robot


def interrupt(loop: ControlLoop, robot: TwinRobot, after: int, trigger) -> tuple[float, dict]:
    """Runs the loop in a thread, calls `trigger()` once it has run `after` steps, waits for the loop to
    end; (when the trigger was pulled, the twin's status once its stop took effect)."""
    thread = threading.Thread(target=loop.run, args=(1000,))
    thread.start()
    deadline = time.monotonic() + 20
    while loop.report.steps < after and time.monotonic() < deadline:
        time.sleep(0.01)
    assert loop.report.steps >= after
    pulled = time.monotonic()
    trigger()
    thread.join(10)
    return pulled, stopped_status(robot)


def stopped_status(robot: TwinRobot) -> dict:
    """The twin's status once its stop has taken effect (at its next physics tick)."""
    for _ in range(100):
        status = robot.status()
        if status["stop_effective_at"] is not None:
            return status
        time.sleep(0.01)
    raise AssertionError(f"the twin did not stop: {status}")


def test_killing_the_server_stops_the_twin_within_two_periods_and_the_rate_holds(twin, artifact):
    server, uri = start_server(artifact)
    client = PolicyClient(uri)
    robot = connected(twin, seed=1)
    loop = ControlLoop(robot, client_policy(client), client.metadata)
    killed_at, status = interrupt(loop, robot, 40, server.kill)
    summary = loop.report.summary()
    print(f"\nstop {1000 * (status['stop_effective_at'] - killed_at):.1f} ms after the kill "
          f"(period {1000 * status['control_dt']:.0f} ms); loop {summary}")
    assert loop.report.reason == "policy_unavailable" and status["stopped"]
    assert status["stop_effective_at"] - killed_at <= 2 * status["control_dt"]
    with pytest.raises(RuntimeError, match="stopped"):
        robot.act(np.zeros(4, np.float32))
    assert abs(summary["rate_hz"] - 20) < 0.4 and summary["overruns"] == 0
    assert summary["jitter_ms_p50"] < 10 and summary["late"] <= 2
    robot.close()


def test_a_hung_server_trips_the_watchdog(twin, artifact):
    server, uri = start_server(artifact)
    client = PolicyClient(uri, timeout=5.0)
    robot = connected(twin, seed=2)
    loop = ControlLoop(robot, client_policy(client), client.metadata)
    try:
        hung_at, status = interrupt(loop, robot, 20, lambda: os.kill(server.pid, signal.SIGSTOP))
        assert loop.report.reason == "policy_late" and status["stopped"]
        dt = status["control_dt"]
        assert status["stop_effective_at"] - hung_at <= loop.stop_after + 2 * dt
        assert loop.report.held >= 1
    finally:
        server.kill()
        robot.close()


def test_estop_from_another_thread_and_the_loops_own_clock(twin):
    robot = connected(twin, seed=3, clocked=False)
    metadata = {"env": {"control_dt": 0.05}, "action": {"chunk": 1}, "observation": {"state": {}},
                "shields": {"specs": []}}
    loop = ControlLoop(robot, lambda obs: np.zeros((1, 4), np.float32), metadata)
    pressed, status = interrupt(loop, robot, 30, loop.estop)
    assert loop.report.reason == "estop" and status["stopped"]
    assert status["stop_effective_at"] - pressed <= status["control_dt"]
    summary = loop.report.summary()
    assert abs(summary["rate_hz"] - 20) < 0.4 and summary["jitter_ms_p50"] < 10, summary
    robot.close()


def test_chunks_run_open_loop_or_ensembled_with_the_observation_history(twin):
    robot = connected(twin, seed=4)
    metadata = {"env": {"control_dt": 0.05}, "action": {"chunk": 4}, "observation": {"state": {}},
                "obs_history": 2, "shields": {"specs": []}}
    seen = []

    def policy(obs):
        seen.append(obs["state"])
        return np.tile(np.array([1, 0, 0, 0], np.float32), (4, 1))  # the arm moves every period

    ControlLoop(robot, policy, metadata).run(12)
    assert len(seen) == 3  # one query per chunk of 4
    first, frame = seen[0], len(seen[0]) // 2
    np.testing.assert_array_equal(first[:frame], first[frame:])  # history padded with the first state
    assert not np.allclose(seen[1][:frame], seen[1][frame:])  # then the period before and this one
    seen.clear()
    robot.reset(seed=4)
    ControlLoop(robot, policy, metadata, ensemble_weight=0.01).run(12)
    assert len(seen) == 12  # ensembling queries every step
    robot.close()


def drive_into_the_sphere(uri: str, specs: list) -> float:
    """A scripted policy heads straight for the keep-out sphere; the closest the TCP came to its centre."""
    robot = connected(uri, seed=5)
    distances = []

    def policy(obs):
        tcp = obs["state"][TCP]
        distances.append(np.linalg.norm(tcp - SPHERE))
        direction = (SPHERE - tcp) / max(np.linalg.norm(SPHERE - tcp), 1e-6)
        return np.concatenate([direction, [0.0]]).astype(np.float32)[None]

    metadata = {"env": {"control_dt": 0.05}, "action": {"chunk": 1}, "observation": {"state": {}},
                "shields": {"specs": specs}}
    ControlLoop(robot, policy, metadata).run(50)
    robot.close()
    return min(distances)


def test_the_robot_side_shield_keeps_the_twin_out_of_the_sphere(twin, artifact):
    import json

    specs = json.loads(artifact.with_name(artifact.name + ".json").read_text())["shields"]["specs"]
    assert [s["type"] for s in specs] == ["keep_out"]  # a QP shield: it runs on the robot side only
    assert drive_into_the_sphere(twin, []) < RADIUS - 0.02
    assert drive_into_the_sphere(twin, specs) > RADIUS


def test_the_twin_stops_itself_when_commands_stop(twin):
    robot = connected(twin, seed=6)
    robot.observe()
    robot.act(np.zeros(4, np.float32))
    silent_from = time.monotonic()
    time.sleep(1.0)
    status = stopped_status(robot)
    assert status["stopped"] and status["stop_reason"] == "command_timeout"
    assert status["stop_effective_at"] - silent_from <= 0.5 + 2 * status["control_dt"]
    robot.close()


def test_roborl_twin_runs_served_episodes_and_rejects_bad_perturbations(artifact):
    import json

    from helpers import roborl

    server, uri = start_server(artifact)
    try:
        proc = roborl("twin", uri, "--episodes", "2", "--perturb", "object_mass=1.5", "latency_ms=20")
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        assert result["episodes"] == 2 and result["stopped_episodes"] == []
        assert result["loop"]["steps"] == 2 * 60 and result["loop"]["reason"] == "done"
        assert 0 < result["round_trip_ms"]["p50"] <= result["round_trip_ms"]["p99"]  # measured (bench/deploy.py times it)
        proc = roborl("twin", uri, "--perturb", "latency_ms=80")
        assert proc.returncode == 2 and "below the control period" in proc.stderr
    finally:
        server.kill()
