"""The transitions of a run on a robot (HIL-SERL): the control loop's step records (`on_step`) become
(obs, action, reward, next_obs, terminated) rows, each marked with whether the operator commanded it. The
learner puts every row in its online buffer and the operator's in its demonstration buffer too
(roborl/algos/sac.py, `absorb`).

The reward is success, judged on the robot's observation after each step: the twin's success flag, or a
reward classifier on the camera frame of a real cell (its claimed successes checked by an operator with
`robot.judge`: roborl/robot/judged_reward.py). A success ends the episode (terminated: no
bootstrapping past it), as in HIL-SERL."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from roborl.robot.control_loop import StepRecord

SuccessFn = Callable[[dict[str, np.ndarray]], bool]


def _arrays(obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The numeric arrays of an observation (scalars and text left out)."""
    return {k: v for k, v in obs.items() if isinstance(v, np.ndarray) and v.dtype != object and v.ndim >= 1}


class TransitionRecorder:
    def __init__(self, success_fn: SuccessFn, episode_stats: Callable[[], dict[str, float]] | None = None) -> None:
        """`episode_stats()`: more statistics of the episode that just ended (a judged classifier's vetoes)."""
        self.success_fn, self.episode_stats = success_fn, episode_stats
        self.rows: list[tuple] = []
        self.episodes: list[dict] = []  # the statistics of the episodes that ended since the last `take`
        self._pending: StepRecord | None = None
        self._episode = {"return": 0.0, "length": 0, "interventions": 0}

    def record(self, step: StepRecord) -> bool:
        """The loop's `on_step`: completes the previous step's transition with this step's observation. True
        when that observation shows success: the episode is over (this step's own action is not kept)."""
        success = bool(self.success_fn(step.obs))
        if self._pending is not None:
            self._add(self._pending, step.policy_obs, success)
        self._pending = None if success else step
        if success:
            self._close_episode(True)
        return success

    def end_episode(self, final_obs: dict[str, np.ndarray], final_policy_obs: dict[str, np.ndarray]) -> None:
        """The last transition of an episode that ran out of time, with the observation after its last step."""
        if self._pending is None:
            return
        success = bool(self.success_fn(final_obs))
        self._add(self._pending, final_policy_obs, success)
        self._pending = None
        self._close_episode(success)

    def _add(self, step: StepRecord, next_obs: dict[str, np.ndarray], success: bool) -> None:
        self.rows.append((_arrays(step.policy_obs), np.asarray(step.action, np.float32), float(success),
                          _arrays(next_obs), success, step.intervened))
        self._episode["return"] += float(success)
        self._episode["length"] += 1
        self._episode["interventions"] += int(step.intervened)

    def _close_episode(self, success: bool) -> None:
        extra = self.episode_stats() if self.episode_stats else {}
        self.episodes.append({**self._episode, "success": float(success), **extra})
        self._episode = {"return": 0.0, "length": 0, "interventions": 0}

    def take(self) -> tuple[dict, list[dict]]:
        """The rows recorded since the last call as arrays (`intervened` marks the operator's), and the
        statistics of the episodes that ended meanwhile."""
        rows, episodes = self.rows, self.episodes
        self.rows, self.episodes = [], []
        if not rows:
            return {}, episodes
        obs, action, reward, next_obs, terminated, intervened = zip(*rows)
        stack = lambda dicts: {k: np.stack([d[k] for d in dicts]) for k in dicts[0]}  # noqa: E731
        return {"obs": stack(obs), "action": np.stack(action), "reward": np.asarray(reward, np.float32),
                "next_obs": stack(next_obs), "terminated": np.asarray(terminated, np.float32),
                "intervened": np.asarray(intervened, bool)}, episodes
