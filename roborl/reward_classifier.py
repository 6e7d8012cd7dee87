"""A learned success detector on camera frames, the reward of real-world RL where no simulator computes one
(HIL-SERL's binary reward classifier): P(success | frame) from a small CNN, trained on labelled frames.

The frames and labels come from a demos file with `obs/rgb` (`roborl demos TASK --rgb`, or frames of a
real cell written in the same layout): a frame is labelled with the task's success flag of the state it
shows (the flag after the previous step; the first frame of an episode is a failure). Episodes, not
frames, are split into training and held-out sets, so the held-out accuracy measures frames of episodes
the classifier never saw. Both classes are sampled equally in training.

`roborl reward-classifier DEMOS --out DIR` trains one and writes `DIR/reward_classifier.safetensors` with its
settings and accuracies in the file's metadata; `RewardClassifier.load(path)` reads it back.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch import nn
from tqdm import tqdm

from roborl.checkpoint import write_safetensors
from roborl.demos_hdf5 import demos_file, episode_names, open_demos
from roborl.errors import UserError
from roborl.policies.cnn import CNNEncoder

FILE = "reward_classifier.safetensors"


class RewardClassifier(nn.Module):
    def __init__(self, height: int, width: int, hidden: int = 128) -> None:
        super().__init__()
        self.size = (height, width)
        self.encoder = CNNEncoder(height, width, hidden)
        self.head = nn.Linear(hidden, 1)

    def forward(self, rgb: torch.Tensor) -> torch.Tensor:
        """Logits of success for N×H×W×3 uint8 frames."""
        return self.head(self.encoder(rgb)).squeeze(-1)

    @torch.no_grad()
    def success_prob(self, rgb: torch.Tensor | np.ndarray) -> torch.Tensor:
        """P(success) per frame (N×H×W×3 uint8, or one H×W×3 frame)."""
        if isinstance(rgb, np.ndarray) and not rgb.flags.writeable:  # e.g. decoded from the wire
            rgb = rgb.copy()
        rgb = torch.as_tensor(np.asarray(rgb))
        single = rgb.dim() == 3
        prob = torch.sigmoid(self(rgb[None] if single else rgb))
        return prob[0] if single else prob

    @classmethod
    def load(cls, path: str | Path) -> RewardClassifier:
        path = Path(path)
        path = path / FILE if path.is_dir() else path
        try:
            with safe_open(str(path), "pt") as f:
                meta = json.loads(f.metadata()["reward_classifier"])
            model = cls(*meta["size"], meta["hidden"])
            model.load_state_dict(load_file(str(path)))
        except (OSError, KeyError, ValueError, RuntimeError, SafetensorError) as exc:
            raise UserError(f"'{path}' is not a reward classifier written by `roborl reward-classifier` ({exc})") from exc
        model.metadata = meta
        return model.eval()


def labelled_frames(path: str | Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """(frames T×H×W×3 uint8, labels T bool) per episode of a demos file with frames."""
    episodes = []
    with open_demos(path) as (path, data):
        for name in episode_names(data, path, ("success", "obs/state")):
            demo = data[name]
            if "rgb" not in demo["obs"]:
                raise UserError(f"'{path}' has no obs/rgb frames: record them with `roborl demos TASK --rgb`")
            success = np.asarray(demo["success"], bool)
            episodes.append((np.asarray(demo["obs"]["rgb"]), np.concatenate([[False], success[:-1]])))
    return episodes


def demos_camera(path: str | Path) -> str:
    """The camera a demos file's frames come from (the task's default, front, for files that do not say)."""
    with open_demos(path) as (_, data):
        return json.loads(data.attrs.get("env_args", "{}")).get("camera") or "front"


def accuracy(model: RewardClassifier, frames: np.ndarray, labels: np.ndarray, batch: int = 512) -> float:
    hits = sum(int(((model.success_prob(frames[i:i + batch]) > 0.5).numpy() == labels[i:i + batch]).sum())
               for i in range(0, len(frames), batch))
    return hits / max(len(frames), 1)


def split_episodes(episodes: list, holdout: float, seed: int) -> tuple[list, list]:
    """(training, held-out) episodes: a `holdout` fraction (at least one) held out, chosen by `seed`."""
    order = np.random.default_rng(seed).permutation(len(episodes))
    n_held = max(1, round(holdout * len(episodes)))
    return [episodes[i] for i in order[n_held:]], [episodes[i] for i in order[:n_held]]


def stacked(episodes: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The frames and the labels of `episodes` (from `labelled_frames`), each joined into one array."""
    return np.concatenate([f for f, _ in episodes]), np.concatenate([lab for _, lab in episodes])


def train_reward_classifier(demos: str | Path, out: str | Path, *, epochs: int = 30, holdout: float = 0.25,
                            batch_size: int = 64, lr: float = 3e-4, seed: int = 0, progress: bool = True) -> dict:
    """Trains on the demos' episodes but a held-out `holdout` fraction; returns and stores the accuracies."""
    if epochs < 1:
        raise UserError(f"--epochs must be >= 1, got {epochs}")
    episodes = labelled_frames(demos)
    if not 0 < holdout < 1:
        raise UserError(f"--holdout must be in (0, 1), got {holdout}")
    train, held = split_episodes(episodes, holdout, seed)
    if not train:
        raise UserError(f"'{demos}' has {len(episodes)} episode(s), all held out to measure accuracy: record more "
                        "episodes (a quarter of them are held out by default, at least one)")
    (frames, labels), (held_frames, held_labels) = stacked(train), stacked(held)
    if labels.all() or not labels.any():
        raise UserError(f"the training episodes of '{demos}' need frames of both success and failure "
                        f"({int(labels.sum())} of {len(labels)} are successes); record more varied episodes")
    torch.manual_seed(seed)
    model = RewardClassifier(*frames.shape[1:3])
    fit(model, [(frames, labels)], epochs * len(frames) // batch_size, batch_size=batch_size, lr=lr, seed=seed,
        progress=progress)
    result = {"train_accuracy": accuracy(model, frames, labels), "heldout_accuracy": accuracy(model, held_frames, held_labels),
              "train_frames": len(frames), "heldout_frames": len(held_frames), "heldout_episodes": len(held),
              "heldout_success_frames": int(held_labels.sum()), "size": list(frames.shape[1:3]), "hidden": 128,
              "camera": demos_camera(demos), "demos": str(demos_file(demos).resolve()), "holdout": holdout, "seed": seed}
    path = save(model, out, result)
    return {**result, "path": str(path)}


def fit(model: RewardClassifier, sources: list[tuple[np.ndarray, np.ndarray]], steps: int, *, batch_size: int = 64,
        lr: float = 3e-4, seed: int = 0, progress: bool = False) -> None:
    """`steps` Adam steps on batches with both classes equally often, drawn from each (frames, labels) source
    equally often (a few corrected frames weigh as much as the whole training set), each frame shifted by up
    to 2 pixels (robust to a re-mounted camera)."""
    gen = torch.Generator().manual_seed(seed)
    data = [(torch.as_tensor(f), torch.as_tensor(lab, dtype=torch.float32)) for f, lab in sources]
    weights = torch.cat([_balanced(lab) / len(sources) for _, lab in sources])
    frames_t, labels_t = torch.cat([f for f, _ in data]), torch.cat([lab for _, lab in data])
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in tqdm(range(steps), desc="reward classifier", disable=not progress):
        idx = torch.multinomial(weights, batch_size, replacement=True, generator=gen)
        shift = torch.randint(-2, 3, (2,), generator=gen)
        batch = torch.roll(frames_t[idx], shifts=(int(shift[0]), int(shift[1])), dims=(1, 2))
        loss = nn.functional.binary_cross_entropy_with_logits(model(batch), labels_t[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()


def _balanced(labels: np.ndarray) -> torch.Tensor:
    """Sampling weights summing to 1 that give each class present half of it."""
    labels = np.asarray(labels, bool)
    classes = int(labels.any()) + int((~labels).any())
    return torch.as_tensor(np.where(labels, 1 / max(labels.sum(), 1), 1 / max((~labels).sum(), 1)) / classes)


def save(model: RewardClassifier, out: str | Path, metadata: dict) -> Path:
    """Writes `out/reward_classifier.safetensors` (atomically) with `metadata`; returns its path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / FILE
    write_safetensors(path, {k: v.contiguous() for k, v in model.state_dict().items()},
                      {"reward_classifier": json.dumps(metadata)})
    return path
