"""Demonstrations as LeRobot v3 datasets, both ways, through LeRobot's own `LeRobotDataset`.

- `write_dataset(demos, out)`: a `roborl demos` recording (demos.hdf5) as a LeRobot v3 dataset
  (meta/info.json, parquet episodes, AV1 videos of the camera): `observation.state`,
  `observation.images.camera` (when recorded with images), `action`, and each episode's instruction as its
  task; meta/info.json also holds, under `roborl`, the env the demos were recorded in and whether each
  episode succeeded. `roborl demos --format lerobot` records straight into one.
- `load_windows(root, ...)`: a local LeRobot v3 dataset (ours or anyone's with `observation.state` and
  `action`) as the training windows `roborl bc` reads: the states, the first camera's frames, the task
  strings as instructions.

Videos are decoded by LeRobot's own decoder (torchcodec, over the FFmpeg libraries set-up installs).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from tqdm import tqdm

from roborl.demo_windows import DemoWindows, episode_windows
from roborl.demos_hdf5 import episode_names, open_demos
from roborl.errors import UserError
from roborl.files import atomic_write

CAMERA = "observation.images.camera"
# LeRobot appends each episode to the current data and video file by rewriting it: files of a few MB keep
# writing linear in the number of episodes (with its defaults of 100 and 500 MB, 900 small episodes take hours)
FILE_MB = 8
ROBORL_KEY = "roborl"  # what roborl adds to meta/info.json: {"env_args": ..., "episode_success": [...]}


def is_dataset(path: str | Path) -> bool:
    return (Path(path).expanduser() / "meta" / "info.json").is_file()


def _lerobot(what: str):
    from roborl.policies.lerobot import compat

    try:
        compat.require(what)
    except ImportError as exc:
        raise UserError(str(exc)) from exc
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset


def write_dataset(demos: str | Path, out: str | Path, repo_id: str | None = None, progress: bool = True) -> dict:
    """`demos` (a directory or file written by `roborl demos`) as a LeRobot v3 dataset in `out`, written to a
    temporary directory and renamed (files.atomic_write: never half-written)."""
    LeRobotDataset = _lerobot("--format lerobot")
    target = Path(out).expanduser()
    if target.exists() and any(target.iterdir()):
        raise UserError(f"'{target}' exists and is not empty: LeRobot datasets are written to a new directory")
    with open_demos(Path(demos).expanduser()) as (source, data):
        env_args = json.loads(data.attrs.get("env_args", "{}"))
        names = episode_names(data, source)
        if not names:
            raise UserError(f"demonstrations '{source}' hold no episodes: nothing to write")
        first = data[names[0]]
        features = {"observation.state": {"dtype": "float32", "shape": first["obs/state"].shape[1:], "names": None},
                    "action": {"dtype": "float32", "shape": first["actions"].shape[1:], "names": None}}
        if "obs/rgb" in first:
            features[CAMERA] = {"dtype": "video", "shape": first["obs/rgb"].shape[1:],
                                "names": ["height", "width", "channels"]}
        fps = int(env_args.get("control_freq") or 20)
        with atomic_write(target) as tmp:
            dataset = LeRobotDataset.create(repo_id=repo_id or f"roborl/{target.name}", fps=fps, features=features,
                                            root=tmp, robot_type=str(env_args.get("env_id", "roborl")),
                                            use_videos=CAMERA in features)
            dataset.meta.update_chunk_settings(data_files_size_in_mb=FILE_MB, video_files_size_in_mb=FILE_MB)
            for name in tqdm(names, desc=f"lerobot dataset {target.name}", unit="episode", disable=not progress):
                g = data[name]
                state, actions = g["obs/state"][()], g["actions"][()]
                rgb = g["obs/rgb"][()] if CAMERA in features else None
                task = str(g.attrs.get("instruction", "")) or str(env_args.get("env_id", "task"))
                for t in range(len(actions)):
                    frame = {"observation.state": state[t], "action": actions[t], "task": task}
                    if rgb is not None:
                        frame[CAMERA] = rgb[t]
                    dataset.add_frame(frame)
                dataset.save_episode()
            dataset.finalize()
            info_file = tmp / "meta" / "info.json"
            info = json.loads(info_file.read_text())
            success = [bool(data[name].attrs.get("success", True)) for name in names]
            info_file.write_text(json.dumps({**info, ROBORL_KEY: {"env_args": env_args, "episode_success": success}},
                                            indent=4))
    return {"path": str(target), "episodes": len(names), "fps": fps, "features": sorted(features)}


def load_windows(root: str | Path, obs_history: int = 1, horizon: int = 1, max_episodes: int | None = None,
                 success_only: bool = True, images: bool = False):
    """The BC windows (demos.DemoWindows) of a local LeRobot v3 dataset, read by LeRobot's `LeRobotDataset`.
    With `success_only`, the episodes that roborl recorded as failures are skipped (a dataset from elsewhere
    does not say: all its episodes are used)."""
    from lerobot.datasets.video_utils import decode_video_frames


    LeRobotDataset = _lerobot("bc.demos <a LeRobot dataset>")
    root = Path(root).expanduser()
    try:
        dataset = LeRobotDataset(f"local/{root.name}", root=root)
    except Exception as exc:  # LeRobot raises many kinds on a broken dataset
        raise UserError(f"'{root}' is not a readable LeRobot v3 dataset ({type(exc).__name__}: {exc})") from exc
    columns = dataset.hf_dataset.column_names
    for needed in ("observation.state", "action"):
        if needed not in columns:
            raise UserError(f"LeRobot dataset '{root}' has no '{needed}' column (it has {', '.join(columns)})")
    cameras = [k for k in dataset.meta.video_keys]
    if images and not cameras:
        raise UserError(f"LeRobot dataset '{root}' holds no videos; this policy reads images")
    table = dataset.hf_dataset.with_format("torch")[:]  # every frame's columns as tensors
    episode_index = table["episode_index"]
    state, actions, task_index = table["observation.state"], table["action"], table["task_index"]
    ours = dataset.meta.info.get(ROBORL_KEY, {})
    success = ours.get("episode_success")
    tasks = {int(i): name for name, i in zip(dataset.meta.tasks.index, dataset.meta.tasks["task_index"])}
    obs_windows, act_windows, instructions, frames, used = [], [], [], [], 0
    for ep in range(dataset.meta.total_episodes):
        if max_episodes is not None and used >= max_episodes:
            break
        rows = (episode_index == ep).nonzero().flatten()
        if len(rows) == 0 or (success_only and success is not None and not success[ep]):
            continue
        o, a = episode_windows(state[rows].float(), actions[rows].float(), obs_history, horizon)
        obs_windows.append(o)
        act_windows.append(a)
        instructions += [tasks[int(i)] for i in task_index[rows]]
        if images:
            meta = dataset.meta.episodes[ep]
            start = meta[f"videos/{cameras[0]}/from_timestamp"]
            stamps = (start + table["timestamp"][rows]).tolist()
            video = root / dataset.meta.get_video_file_path(ep, cameras[0])
            decoded = decode_video_frames(video, stamps, dataset.tolerance_s, dataset.video_backend)
            frames.append((decoded * 255).round().to(torch.uint8).permute(0, 2, 3, 1))
        used += 1
    if not used:
        raise UserError(f"LeRobot dataset '{root}' holds no {'successful ' if success_only else ''}episodes")
    return DemoWindows(torch.cat(obs_windows), torch.cat(act_windows), used, ours.get("env_args", {}), instructions,
                       torch.cat(frames) if images else None)
