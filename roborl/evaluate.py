"""Deterministic evaluation: success rate, return and length over a number of episodes, optional video."""
from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from roborl import sim
from roborl.checkpoint import Checkpoint
from roborl.collect import Step, run_steps
from roborl.errors import UserError
from roborl.policies.act import Act


def tile(frames: torch.Tensor) -> np.ndarray:
    """N×H×W×3 frames side by side in one row."""
    return torch.cat(list(frames), dim=1).cpu().numpy()


def episode_quota(episodes: int, num_envs: int) -> torch.Tensor:
    """How many episodes each environment contributes, fixed before the first step: counting the first
    `episodes` episodes to end instead would over-represent short episodes (early successes or failures)."""
    quota = torch.full((num_envs,), episodes // num_envs, dtype=torch.long)
    quota[: episodes % num_envs] += 1
    return quota


def require_video_writer() -> None:
    """imageio writes mp4 through the imageio-ffmpeg package; without it imageio picks another plugin that
    fails with a traceback after the episodes ran. Checked before the first step instead."""
    if importlib.util.find_spec("imageio_ffmpeg") is None:
        raise UserError("eval videos need the imageio-ffmpeg package: pip install imageio-ffmpeg "
                        "(or turn videos off: train.video=false, roborl eval --no-video)")


@torch.no_grad()
def evaluate(policy: torch.nn.Module, env: sim.VecEnv, episodes: int, seed: int = 12345,
             video_path: str | Path | None = None, video_envs: int = 4,
             progress: Callable[[int], object] | None = None) -> dict[str, float]:
    """Runs `policy.act(deterministic=True)` until every environment has ended its share of `episodes`
    episodes. The video (if any) tiles the first episode of the first `video_envs` environments;
    `progress(n)` is called as n more episodes are counted."""
    if video_path is not None:
        require_video_writer()
    stats: dict[str, list[torch.Tensor]] = {"success_at_end": [], "success_once": [], "return": [], "length": [],
                                            "cost": []}
    frames: list[np.ndarray] = []
    quota = episode_quota(episodes, env.num_envs)
    ended = torch.zeros(env.num_envs, dtype=torch.long)
    shown = list(range(min(video_envs, env.num_envs)))
    recording = [video_path is not None]
    limit = 10 * (env.max_episode_steps or 1000) * (episodes // env.num_envs + 1)

    def act(obs: dict) -> Act:
        if recording[0]:
            try:
                frames.append(tile(env.render(shown)))
            except NotImplementedError:  # a backend without rendering: evaluate without a video
                recording[0] = False
        return policy.act(obs, deterministic=True)

    def record(step: Step) -> bool:
        info = step.info
        if "episode" in info:
            done = info["done"].cpu()
            counted = done & (ended < quota)
            ended.add_(done.long())
            for key in stats:
                if key in info["episode"]:
                    stats[key].append(info["episode"][key].cpu()[counted].float())
            recording[0] = recording[0] and not bool((ended[shown] > 0).all())
            if progress is not None:
                progress(int(counted.sum()))
        return bool((ended >= quota).all())

    run_steps(env, env.reset(seed=seed), act, record, limit)
    if video_path is not None and frames:
        import imageio.v2 as imageio

        fps = max(1, round(1.0 / env.control_dt))
        imageio.mimwrite(str(video_path), frames, fps=fps, macro_block_size=1)
    out = {k: float(torch.cat(v).mean()) if v else float("nan") for k, v in stats.items()}
    result = {"success_rate": out["success_at_end"], "success_once": out["success_once"],
              "mean_return": out["return"], "mean_length": out["length"],
              "episodes": int(torch.minimum(ended, quota).sum())}
    if stats["cost"]:  # safety: how often the episodes violated a constraint (info["cost"] > 0)
        cost = torch.cat(stats["cost"])
        result.update(mean_cost=float(cost.mean()), violating_episodes=int((cost > 0).sum()),
                      violation_steps=float(cost.sum()))
    return result


def load_for_eval(ckpt: Checkpoint, num_envs: int, device: torch.device,
                  env_id: str | None = None) -> tuple[sim.VecEnv, torch.nn.Module]:
    """A loaded checkpoint's policy (weights in, eval mode) and the environment of its config, base and
    wrappers included; `env_id` swaps the task and keeps everything else."""
    from roborl.builder import build
    from roborl.config import config_from_dict

    cfg = config_from_dict(ckpt.config)
    cfg.env = cfg.env.for_evaluation()
    cfg.env.num_envs = num_envs
    if env_id is not None:
        cfg.env.id = env_id
    env, policy = build(cfg, device)
    try:
        ckpt.load_policy(policy)
    except Exception:
        env.close()
        raise
    return env, policy.eval()


def evaluate_checkpoint(path: str | Path, episodes: int, envs: int = 25, seed: int = 12345, device: str = "auto",
                        video_path: str | Path | None = None) -> dict[str, float]:
    """`evaluate` of a saved policy in the environment of its own config (base and wrappers included)."""
    from roborl.builder import resolve_device

    env, policy = load_for_eval(Checkpoint(path), min(envs, episodes), resolve_device(device))
    try:
        return evaluate(policy, env, episodes, seed=seed, video_path=video_path)
    finally:
        env.close()
