"""A reward classifier whose claimed successes an operator judges, and which learns from the verdicts
(HIL-SERL's answer to reward hacking: relabel the classifier's mistakes on the policy's own frames).

An RL learner rewarded by a classifier finds the frames the classifier wrongly calls a success: on the Push
twin, six robot minutes were enough for a policy the classifier called successful in 0.60 of its episodes
while the simulator said 0.00 (docs/guides/sim-to-real.md). Here each frame the classifier calls a success
goes to a judge (`robot.judge`) before it ends the episode:

- confirmed: the step is rewarded and the episode ends, and the frame is kept as a labelled success;
- vetoed: no reward, the episode goes on, and the frame is kept as a labelled failure.

Between episodes the verdicts are saved, and once `robot.refit_every` of them are new the classifier is refit
(`robot.refit_steps` Adam steps) on its own training frames and the judged ones, each half of every batch, so
the false positives the policy found are the ones it unlearns.
The judge is asked only about claimed successes, a handful per episode: that is the labelling a person
watching the robot can do, and the count is logged (rollout/vetoes, and the judged frames in the report).

The judged frames and the refit classifier are kept in `robot.corrections` (the run's `reward_corrections/`
by default), the frames written whole after every episode with a verdict and the classifier after each refit;
an actor that restarts picks them up from there (and refits on what it had not yet learned from), and the
classifier the run started from is never overwritten.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from roborl.errors import UserError
from roborl.files import atomic_write
from roborl.reward_classifier import FILE, RewardClassifier, accuracy, fit, labelled_frames, save, split_episodes, stacked

Judge = Callable[[dict[str, np.ndarray]], bool]
FRAMES = "judged_frames.npz"
CORRECTIONS = "reward_corrections"  # robot.corrections by default: this directory of the run


def claims_success(classifier: RewardClassifier, obs: dict[str, np.ndarray]) -> bool:
    """The classifier's verdict on the robot's camera frame."""
    if "rgb" not in obs:
        raise UserError("robot.reward is a reward classifier, but the robot sends no camera frame (obs 'rgb')")
    return bool(classifier.success_prob(obs["rgb"]) > 0.5)


class JudgedClassifier:
    """The robot's success function (`TransitionRecorder`'s) when `robot.judge` is set."""

    def __init__(self, classifier: RewardClassifier, judge: Judge, corrections: str | Path, refit_steps: int = 100,
                 seed: int = 0, refit_every: int = 1) -> None:
        self.classifier, self.judge, self.refit_steps, self.seed = classifier, judge, refit_steps, seed
        self.refit_every = refit_every
        self.meta = dict(classifier.metadata)
        self.dir = Path(corrections)
        demos = self.meta.get("demos")
        if not demos or not Path(demos).exists():
            raise UserError(f"robot.judge refits the reward classifier on its training frames and the judged ones, "
                            f"but its training frames ({demos or 'not recorded in the classifier'}) are not here: "
                            "retrain it with `roborl reward-classifier DEMOS` where DEMOS stays in place")
        train, held = split_episodes(labelled_frames(demos), self.meta.get("holdout", 0.25), self.meta.get("seed", 0))
        self.train, self.held = stacked(train), stacked(held)
        self.frames: list[np.ndarray] = []
        self.labels: list[bool] = []
        self.learned = 0  # judged frames the last refit learned from
        self.vetoes = 0  # of the current episode
        self.refits = 0
        if (self.dir / FRAMES).exists():  # a restarted actor: the verdicts so far, and the classifier refit on them
            with np.load(self.dir / FRAMES) as saved:
                self.frames, self.labels = list(saved["frames"]), [bool(v) for v in saved["labels"]]
            if (self.dir / FILE).exists():
                self.classifier = RewardClassifier.load(self.dir)
                self.refits = self.classifier.metadata.get("refits", 0)
                self.learned = self.classifier.metadata.get("judged_frames", 0)
        self.saved = len(self.labels)  # judged frames on disk

    def __call__(self, obs: dict[str, np.ndarray]) -> bool:
        if not claims_success(self.classifier, obs):
            return False
        verdict = bool(self.judge(obs))
        self.frames.append(np.array(obs["rgb"]))
        self.labels.append(verdict)
        self.vetoes += int(not verdict)
        return verdict

    @property
    def new(self) -> int:
        """Judged frames not yet learned from."""
        return len(self.labels) - self.learned

    def episode_stats(self) -> dict[str, float]:
        """This episode's vetoes (claimed successes the judge refused), for the episode's statistics."""
        vetoes, self.vetoes = self.vetoes, 0
        return {"vetoes": float(vetoes)}

    def refit(self) -> dict | None:
        """Between episodes: saves the verdicts, and once `refit_every` judged frames are new learns from them and
        saves the classifier. Returns the refit's statistics, or None when it did not refit."""
        if self.saved == len(self.labels) and self.new < self.refit_every:
            return None
        frames, labels = np.stack(self.frames), np.asarray(self.labels, bool)
        if self.saved < len(labels):
            with atomic_write(self.dir / FRAMES, suffix=".npz") as tmp:
                np.savez(tmp, frames=frames, labels=labels)
            self.saved = len(labels)
        if self.new < self.refit_every:
            return None
        self.refits += 1
        fit(self.classifier, [self.train, (frames, labels)], self.refit_steps, seed=self.seed + self.refits)
        self.learned = len(labels)
        stats = {"refits": self.refits, "judged_frames": len(labels), "vetoed_frames": int((~labels).sum()),
                 "heldout_accuracy": accuracy(self.classifier, *self.held)}
        self.meta.update(stats)
        self.classifier.metadata = self.meta
        save(self.classifier, self.dir, self.meta)
        with open(self.dir / "refits.jsonl", "a") as f:
            f.write(json.dumps(stats) + "\n")
        return stats
