"""`roborl eval` over a suite: every task × checkpoint × evaluation seed, checked before anything runs.

A suite maps tasks to checkpoints. Several checkpoints of a task are taken as several training seeds of one
method; each is evaluated with `seeds` evaluation seeds (`seed`, `seed + 1`, ...) of `episodes` episodes.
The suite comes from the command line (`roborl eval CKPT ... [--tasks ...]`) or from a YAML file:

    episodes: 50          # optional: episodes, seeds, seed, envs, device, video (the command line wins)
    seeds: 2
    tasks:
      mujoco/Reach: runs/reach_s*/checkpoints/best.safetensors     # a glob, sorted
      mujoco/Push: [runs/push_s0/checkpoints/best.safetensors, runs/push_s1/checkpoints/best.safetensors]

Relative paths in the file are relative to the file's folder.
"""
from __future__ import annotations

import dataclasses
import glob
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from tqdm import tqdm

from roborl.checkpoint import Checkpoint
from roborl.errors import UserError
from roborl.evaluate import evaluate, load_for_eval


@dataclass
class Suite:
    tasks: dict[str, list[str]]  # task id -> checkpoint paths
    episodes: int = 50  # per checkpoint and evaluation seed
    seeds: int = 1  # evaluation seeds per checkpoint
    seed: int = 12345  # the first evaluation seed
    envs: int = 25  # environments run in parallel
    device: str = "auto"
    video: bool = True  # the first episodes of each task (first checkpoint, first seed)


SETTINGS = tuple(f.name for f in dataclasses.fields(Suite) if f.name != "tasks")


def suite_from_checkpoints(checkpoints: list[str], tasks: list[str] | None, **settings) -> Suite:
    """Every checkpoint on every task of `tasks`, or (no `tasks`) each checkpoint on the task it was trained on."""
    if tasks:
        return checked(Suite({task: list(checkpoints) for task in dict.fromkeys(tasks)}, **settings))
    grouped: dict[str, list[str]] = {}
    for path in checkpoints:
        grouped.setdefault(Checkpoint(path).config["env"]["id"], []).append(path)
    return checked(Suite(grouped, **settings))


def suite_from_yaml(path: str | Path, **overrides) -> Suite:
    """A suite file; `overrides` (settings given on the command line) replace the file's."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"suite file '{path}' does not exist")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise UserError(f"suite file '{path}' is not valid YAML ({' '.join(str(exc).split())})") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("tasks"), dict) or not raw["tasks"]:
        raise UserError(f"suite file '{path}' needs `tasks:`, a mapping of task ids to checkpoint paths or globs")
    unknown = sorted(set(raw) - {"tasks", *SETTINGS})
    if unknown:
        raise UserError(f"suite file '{path}': unknown key '{unknown[0]}'; valid keys: tasks, {', '.join(SETTINGS)}")
    tasks = {str(task): _expand(paths, path.parent, f"suite file '{path}', task {task}")
             for task, paths in raw["tasks"].items()}
    settings = {k: v for k, v in raw.items() if k != "tasks"}
    settings.update(overrides)
    return checked(Suite(tasks, **settings))


def _expand(paths: object, base: Path, where: str) -> list[str]:
    items = [paths] if isinstance(paths, str) else paths
    if not isinstance(items, list) or not items or not all(isinstance(p, str) for p in items):
        raise UserError(f"{where}: give a checkpoint path, a glob or a list of them")
    out: list[str] = []
    for item in items:
        pattern = str(base / item)
        if glob.has_magic(pattern):
            found = sorted(glob.glob(pattern))
            if not found:
                raise UserError(f"{where}: '{item}' matches no file")
            out.extend(found)
        else:
            out.append(pattern)
    return out


def checked(suite: Suite) -> Suite:
    for name in ("episodes", "seeds", "envs"):
        value = getattr(suite, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UserError(f"eval {name} must be a positive integer, got {value!r}")
    if not isinstance(suite.seed, int) or isinstance(suite.seed, bool):
        raise UserError(f"eval seed must be an integer, got {suite.seed!r}")
    return suite


def _spaces(ckpt: Checkpoint, env_id: str) -> str:
    """The observation and action shapes of the checkpoint's run environment on `env_id` (one env, on CPU)."""
    from roborl.builder import describe_spaces, make_run_env
    from roborl.config import config_from_dict

    cfg = config_from_dict(ckpt.config)
    cfg.env = cfg.env.for_evaluation()
    cfg.env.id = env_id
    env = make_run_env(cfg, 1, 0, torch.device("cpu"))
    try:
        return describe_spaces(env)
    finally:
        env.close()


def check(suite: Suite) -> dict[str, Checkpoint]:
    """Loads every checkpoint and makes sure its policy can act on every task it is paired with, so that a
    bad input fails in seconds, not after the tasks before it were evaluated."""
    ckpts = {path: Checkpoint(path) for paths in suite.tasks.values() for path in paths}
    trained: dict[str, str] = {}
    for task, paths in suite.tasks.items():
        for path in paths:
            own = ckpts[path].config["env"]["id"]
            if task == own:
                continue
            target = _spaces(ckpts[path], task)
            if path not in trained:
                trained[path] = _spaces(ckpts[path], own)
            if target != trained[path]:
                raise UserError(f"checkpoint '{path}' was trained on {own} ({trained[path]}); "
                                f"{task} has {target}: its policy cannot act there")
    return ckpts


def run_suite(suite: Suite, out_dir: Path, progress: bool = True) -> dict[str, dict]:
    """{task: {"per_seed": [one dict per checkpoint and evaluation seed], "videos": [paths under out_dir]}}."""
    from roborl.builder import resolve_device

    ckpts = check(suite)
    device = resolve_device(suite.device)
    (out_dir / "videos").mkdir(parents=True, exist_ok=True)
    total = sum(len(paths) for paths in suite.tasks.values()) * suite.seeds * suite.episodes
    results: dict[str, dict] = {}
    with tqdm(total=total, unit="episode", disable=not progress, desc="eval") as bar:
        for task, paths in suite.tasks.items():
            bar.set_description(task)
            per_seed, videos = [], []
            for index, path in enumerate(paths):
                env, policy = load_for_eval(ckpts[path], min(suite.envs, suite.episodes), device, env_id=task)
                try:
                    for s in range(suite.seeds):
                        video = out_dir / "videos" / f"{task.replace('/', '_')}.mp4"
                        record = suite.video and index == 0 and s == 0
                        if record:
                            video.unlink(missing_ok=True)
                        r = evaluate(policy, env, suite.episodes, seed=suite.seed + s,
                                     video_path=video if record else None, progress=bar.update)
                        per_seed.append({"checkpoint": path, "seed": suite.seed + s, "success": r["success_rate"],
                                         "success_once": r["success_once"], "return": r["mean_return"],
                                         "length": r["mean_length"], "episodes": r["episodes"]})
                        if record and video.exists():
                            videos.append(str(video.relative_to(out_dir)))
                finally:
                    env.close()
            results[task] = {"per_seed": per_seed, "videos": videos}
    return results
