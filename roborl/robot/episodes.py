"""Whole episodes on a robot through the control loop: success at the end of each, with the loop's
rate, jitter and the policy round trips (what `bench/deploy.py` and `roborl twin` report)."""
from __future__ import annotations

import numpy as np

from roborl.deploy.client import PolicyClient
from roborl.errors import UserError
from roborl.robot.control_loop import ControlLoop


def run_episodes(robot, client: PolicyClient, episodes: int, seed: int = 0, steps: int | None = None) -> dict:
    """`robot` must offer `reset(seed)` (the twin does; a real cell resets by hand or by script).
    Success is the `success` flag of the observation after the episode's last period."""
    round_trips: list[float] = []

    def policy(obs):
        reply = client.infer(obs)
        round_trips.append(client.last_round_trip_ms)
        return reply["action"]

    loop = ControlLoop(robot, policy, client.metadata)
    steps = steps or client.metadata["env"]["episode_length"]
    successes, stops = [], []
    for episode in range(episodes):
        robot.reset(seed=seed + episode)
        loop.reset()
        report = loop.run(steps)
        if report.reason != "done":  # the watchdog or the robot stopped the episode: it counts as a failure
            stops.append(f"episode {episode}: {report.reason} {report.detail}".strip())
            successes.append(False)
        else:
            successes.append(bool(robot.observe()["success"]))
    if not round_trips:  # not one action came back: nothing to report but why
        raise UserError(f"the policy answered no request ({stops[0]}): does the robot send what it was trained on?")
    rt = np.asarray(round_trips)
    return {"success": float(np.mean(successes)), "episodes": episodes, "stopped_episodes": stops,
            "loop": loop.report.summary(), "round_trip_ms": {f"p{q}": float(np.percentile(rt, q)) for q in (50, 95, 99)}}
