"""A reward classifier whose claimed successes a judge checks (`robot.judge`, HIL-SERL's relabelling): a
vetoed claim pays nothing and keeps the episode going, and the classifier refit on the verdicts unlearns the
false positives it was shown, on frames of episodes the judge never saw; the verdicts and the refit classifier
survive a restart, and the classifier the run started from is left as it was.

The classifier under test is made to claim success on nearly every frame (its head's bias shifted): the worst
case of a reward an RL learner could exploit."""
import hashlib
import json

import numpy as np
import pytest
import torch
import yaml
from helpers import ROOT, roborl, roborl_in_process

from roborl.errors import UserError
from roborl.reward_classifier import (
    FILE,
    RewardClassifier,
    labelled_frames,
    save,
    split_episodes,
    stacked,
    train_reward_classifier,
)
from roborl.robot.hil import TransitionRecorder
from roborl.robot.judged_reward import JudgedClassifier
from roborl.robot.operators import success_flag_judge


@pytest.fixture(scope="module")
def claims_everything(tmp_path_factory):
    """A Push classifier (48 px, noisy-expert episodes) whose head calls every frame a success, and its demos."""
    root = tmp_path_factory.mktemp("judged")
    proc = roborl_in_process("demos", "Push", "--episodes", "24", "--rgb", "--size", "48", "--noise", "0.3",
                             "--out", str(root / "demos"), "--seed", "3", "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    train_reward_classifier(root / "demos", root / "classifier", epochs=3, progress=False)
    model = RewardClassifier.load(root / "classifier")
    frames, labels = frames_of(root, "train")
    with torch.no_grad():  # shifted to claim success on 95% of the failing frames it trained on
        model.head.bias -= float(torch.quantile(model(torch.as_tensor(frames[~labels])), 0.05)) - 0.5
    save(model, root / "classifier", model.metadata)
    return root


def frames_of(root, which: str) -> tuple[np.ndarray, np.ndarray]:
    meta = RewardClassifier.load(root / "classifier").metadata
    train, held = split_episodes(labelled_frames(root / "demos"), meta["holdout"], meta["seed"])
    return stacked(held if which == "held" else train)


def false_positive_rate(model: RewardClassifier, frames: np.ndarray, labels: np.ndarray) -> float:
    called = (model.success_prob(frames) > 0.5).numpy()
    return float(called[~labels].mean())


def test_vetoes_pay_nothing_and_the_refit_unlearns_the_false_positives(claims_everything, tmp_path):
    root = claims_everything
    original = hashlib.sha256((root / "classifier" / FILE).read_bytes()).hexdigest()
    judged = JudgedClassifier(RewardClassifier.load(root / "classifier"), success_flag_judge(), tmp_path / "corr",
                              refit_steps=100)
    frames, labels = frames_of(root, "train")
    held_frames, held_labels = frames_of(root, "held")
    assert false_positive_rate(judged.classifier, held_frames, held_labels) > 0.9  # it claims nearly everything
    recorder = TransitionRecorder(judged, judged.episode_stats)
    shown = np.arange(0, len(frames), 3)  # a third of the training frames reach the judge, as claimed successes
    verdicts = [judged({"rgb": frames[i], "success": np.bool_(labels[i])}) for i in shown]
    assert verdicts == list(labels[shown])  # the judge's word is the reward: vetoes pay nothing
    assert judged.vetoes == int((~labels[shown]).sum()) > 0 and judged.new == len(shown)
    recorder._close_episode(False)
    assert recorder.episodes[-1]["vetoes"] == float((~labels[shown]).sum()) and judged.vetoes == 0

    stats = judged.refit()
    assert stats["judged_frames"] == len(shown) and stats["vetoed_frames"] == int((~labels[shown]).sum())
    fp = false_positive_rate(judged.classifier, held_frames, held_labels)
    called_success = float((judged.classifier.success_prob(held_frames[held_labels]) > 0.5).numpy().mean())
    print(f"\nheld-out false positives -> {fp:.3f}; held-out successes still called {called_success:.3f}; "
          f"held-out accuracy {stats['heldout_accuracy']:.3f}")
    assert fp < 0.3 and called_success > 0.5 and stats["heldout_accuracy"] > 0.75
    assert judged.refit() is None  # nothing new judged

    again = JudgedClassifier(RewardClassifier.load(root / "classifier"), success_flag_judge(), tmp_path / "corr")
    assert len(again.labels) == len(shown) and again.refits == 1  # a restarted actor keeps the verdicts
    assert torch.equal(again.classifier.success_prob(held_frames[:64]), judged.classifier.success_prob(held_frames[:64]))
    assert hashlib.sha256((root / "classifier" / FILE).read_bytes()).hexdigest() == original  # never overwritten


def test_verdicts_are_saved_every_episode_and_learned_from_every_refit_every_frames(claims_everything, tmp_path):
    """robot.refit_every: fewer refits (each holds the robot between episodes), and no verdict lost meanwhile."""
    root, corr = claims_everything, tmp_path / "corr"
    frames, labels = frames_of(root, "train")

    def judged_classifier() -> JudgedClassifier:
        return JudgedClassifier(RewardClassifier.load(root / "classifier"), success_flag_judge(), corr, refit_steps=5,
                                refit_every=4)
    judged = judged_classifier()
    claimed = np.flatnonzero((judged.classifier.success_prob(frames[:200]) > 0.5).numpy())[:4]
    assert len(claimed) == 4
    for i in claimed[:3]:
        judged({"rgb": frames[i], "success": np.bool_(labels[i])})
    assert judged.refit() is None and not (corr / FILE).exists()  # 3 new verdicts: no refit yet
    with np.load(corr / "judged_frames.npz") as saved:
        assert saved["labels"].tolist() == labels[claimed[:3]].tolist()  # but the verdicts are on disk

    again = judged_classifier()  # an actor restarted before the refit keeps the verdicts still to learn from
    assert again.new == 3 and again.refits == 0
    again({"rgb": frames[claimed[3]], "success": np.bool_(labels[claimed[3]])})
    stats = again.refit()
    assert stats["refits"] == 1 and stats["judged_frames"] == 4 and (corr / FILE).exists()
    after = judged_classifier()  # restarted after the refit: nothing left to learn from
    assert after.new == 0 and after.refits == 1 and after.refit() is None


def test_a_judge_without_its_classifiers_training_frames_or_the_success_flag_is_one_line(claims_everything, tmp_path):
    model = RewardClassifier.load(claims_everything / "classifier")
    model.metadata = {**model.metadata, "demos": str(tmp_path / "gone.hdf5")}
    with pytest.raises(UserError, match="its training frames .* are not here: retrain it"):
        JudgedClassifier(model, success_flag_judge(), tmp_path / "corr")
    with pytest.raises(UserError, match="only the twin sends"):
        success_flag_judge()({"rgb": np.zeros((48, 48, 3), np.uint8)})


def test_a_judge_of_the_success_flag_is_a_one_line_config_error(tmp_path):
    proc = roborl_in_process("train", str(ROOT / "configs" / "hil_sac_push.yaml"),
                             "robot.judge=roborl.robot.operators:success_flag_judge", f"train.run_dir={tmp_path}")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(
        "roborl: error: robot.judge checks the successes a reward classifier claims"), proc.stderr[-2000:]
    assert not list(tmp_path.iterdir())


def test_a_learner_whose_judge_cannot_refit_says_so_before_the_run(claims_everything, tmp_path):
    """The judge's classifier was moved away from its training frames: the learner that starts its own actor
    says so in one line before the run opens (not the actor, once a twin runs and the run dir is written)."""
    model = RewardClassifier.load(claims_everything / "classifier")
    save(model, tmp_path / "classifier", {**model.metadata, "demos": str(tmp_path / "gone.hdf5")})
    runs = tmp_path / "runs"
    proc = roborl_in_process("train", str(ROOT / "configs" / "hil_sac_push.yaml"),
                             f"robot.reward={tmp_path / 'classifier'}",
                             "robot.judge=roborl.robot.operators:success_flag_judge", f"train.run_dir={runs}")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"roborl: error: robot.judge refits the reward classifier on its training frames and the judged ones, but "
        f"its training frames ({tmp_path / 'gone.hdf5'}) are not here: retrain it with `roborl reward-classifier "
        f"DEMOS` where DEMOS stays in place"], proc.stderr[-2000:]
    assert not runs.exists() or not list(runs.iterdir())


def test_a_judged_run_logs_vetoes_and_keeps_its_refits_in_the_run(claims_everything, tmp_path):
    """`roborl train` with a robot actor (its own real-time Push twin) rewarded by the classifier that claims
    nearly every frame, judged by the twin's flag: the episodes' vetoes reach TensorBoard, the refits and the
    judged frames land in the run's reward_corrections/, and the refit classifier no longer claims most of the
    frames it was told were failures."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = tmp_path / "judged.yaml"
    config.write_text(yaml.safe_dump({
        "env": {"id": "mujoco/Push", "num_envs": 1},
        "policy": {"kind": "gaussian", "hidden": [32, 32]},
        "train": {"algorithm": "sac", "total_steps": 160, "rollout_steps": 20, "eval_every": 1000, "eval_episodes": 2,
                  "eval_envs": 2, "video": False, "progress": False, "run_dir": str(tmp_path), "name": "run",
                  "threads": 1},
        "sac": {"seed_steps": 40, "batch_size": 32, "utd_ratio": 0.5},
        "resources": {"actor": "robot"},
        "robot": {"episode_steps": 20, "reward": str(claims_everything / "classifier"), "refit_steps": 20,
                  "judge": "roborl.robot.operators:success_flag_judge"}}))
    proc = roborl("train", str(config), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    refits = [json.loads(line) for line in (tmp_path / "run" / "reward_corrections" / "refits.jsonl").read_text().splitlines()]
    assert refits and refits[-1]["vetoed_frames"] > 0
    refit = RewardClassifier.load(tmp_path / "run" / "reward_corrections")
    assert refit.metadata["refits"] == refits[-1]["refits"]
    with np.load(tmp_path / "run" / "reward_corrections" / "judged_frames.npz") as judged:
        assert len(judged["labels"]) == refits[-1]["judged_frames"]
        vetoed = judged["frames"][~judged["labels"]]
    assert float((refit.success_prob(vetoed) > 0.5).float().mean()) < 0.5  # what it was shown, it unlearned
    tb = EventAccumulator(str(tmp_path / "run" / "tb"))
    tb.Reload()
    assert sum(e.value for e in tb.Scalars("rollout/vetoes")) > 0
