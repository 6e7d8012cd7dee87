"""Deterministic evaluation: success rate, return and length over a number of episodes, optional video."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

import sim


def tile(frames: torch.Tensor) -> np.ndarray:
    """N×H×W×3 frames side by side in one row."""
    return torch.cat(list(frames), dim=1).cpu().numpy()


@torch.no_grad()
def evaluate(policy: torch.nn.Module, env: sim.VecEnv, episodes: int, seed: int = 12345,
             video_path: str | Path | None = None, video_envs: int = 4) -> dict[str, float]:
    """Runs `policy.act(deterministic=True)` until `episodes` episodes have ended."""
    obs = env.reset(seed=seed)
    stats: dict[str, list[torch.Tensor]] = {"success_at_end": [], "success_once": [], "return": [], "length": [],
                                            "cost": []}
    frames: list[np.ndarray] = []
    recording = video_path is not None
    done_count = 0
    limit = 10 * (env.max_episode_steps or 1000) * (episodes // env.num_envs + 1)
    for _ in range(limit):
        if recording:
            frames.append(tile(env.render(list(range(min(video_envs, env.num_envs))))))
        act = policy.act(obs, deterministic=True)
        obs, _, _, _, info = env.step(act.action)
        if "episode" in info:
            done = info["done"]
            for key in stats:
                if key in info["episode"]:
                    stats[key].append(info["episode"][key][done].float().cpu())
            done_count += int(done.sum())
            recording = False  # the first episode of each env is enough for the video
        if done_count >= episodes:
            break
    if video_path is not None and frames:
        import imageio.v2 as imageio

        fps = max(1, round(1.0 / env.control_dt))
        imageio.mimwrite(str(video_path), frames, fps=fps, macro_block_size=1)
    out = {k: float(torch.cat(v)[:episodes].mean()) if v else float("nan") for k, v in stats.items()}
    result = {"success_rate": out["success_at_end"], "success_once": out["success_once"],
              "mean_return": out["return"], "mean_length": out["length"], "episodes": min(done_count, episodes)}
    if stats["cost"]:  # safety: how often the episodes violated a constraint (info["cost"] > 0)
        cost = torch.cat(stats["cost"])[:episodes]
        result.update(mean_cost=float(cost.mean()), violating_episodes=int((cost > 0).sum()),
                      violation_steps=float(cost.sum()))
    return result


def evaluate_checkpoint(path: str | Path, episodes: int, envs: int = 25, seed: int = 12345, device: str = "auto",
                        video_path: str | Path | None = None) -> dict[str, float]:
    """`evaluate` of a saved policy in the environment of its own config (base and wrappers included)."""
    from roborl.builder import build, resolve_device
    from roborl.checkpoint import Checkpoint
    from roborl.config import config_from_dict

    ckpt = Checkpoint(path)
    cfg = config_from_dict(ckpt.config)
    cfg.env.num_envs = min(envs, episodes)
    env, policy = build(cfg, resolve_device(device))
    ckpt.load_policy(policy)
    try:
        return evaluate(policy.eval(), env, episodes, seed=seed, video_path=video_path)
    finally:
        env.close()
