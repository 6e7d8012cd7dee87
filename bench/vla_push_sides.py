"""Where a LangTabletop push policy puts the gripper: of the episodes of `mujoco/LangTabletopFixed-Push`,
the share in which the gripper came down (below 5 cm) within 2 cm of the named cube's push pose for the
named direction (just behind the cube, on the side opposite the direction), of the pose for another
direction, of a pose of the other cube, or of none. A policy that finds the cube but not the side to push
it from has not grounded the direction words; one that finds neither has not found the cube.

Usage: python bench/vla_push_sides.py CHECKPOINT [--episodes 50] [--seed 12345]   (about 30 s per checkpoint)
"""
from __future__ import annotations

import argparse
import json

import torch

from roborl.checkpoint import Checkpoint
from roborl.evaluate import load_for_eval
from tasks.language import DIRECTION_XY

TASK = "mujoco/LangTabletopFixed-Push"
LOW, NEAR = 0.05, 0.02  # metres: the gripper is "down" below LOW and "at" a pose within NEAR of it


def push_sides(checkpoint: str, episodes: int = 50, seed: int = 12345) -> dict[str, float]:
    env, policy = load_for_eval(Checkpoint(checkpoint), episodes, torch.device("cpu"), TASK)
    try:
        sim = env.unwrapped
        obs = env.reset(seed=seed)
        dirs = torch.tensor(DIRECTION_XY, dtype=torch.float64)
        named = (sim.push_direction[:, None] == dirs[None]).all(-1).long().argmax(-1)
        behind = (sim.cube.pos[:, :2] - sim.push_pose()[:, :2]).norm(dim=-1)  # how far push_pose is from the cube
        offset = dirs[None] * behind[:, None, None]  # sim.push_pose() for each of the four directions
        poses = torch.stack([sim.cube.pos[:, None, :2] - offset, sim.other.pos[:, None, :2] - offset], 1)  # n×2×4×2
        closest = torch.full(poses.shape[:3], float("inf"), dtype=torch.float64)
        for _ in range(env.max_episode_steps or 60):
            with torch.no_grad():
                obs, _, term, trunc, _ = env.step(policy.act(obs, deterministic=True).action)
            dist = (poses - sim.tcp[:, None, None, :2]).norm(dim=-1)
            down = (sim.tcp[:, 2] < LOW)[:, None, None]
            closest = torch.minimum(closest, torch.where(down, dist, torch.inf))
            if bool((term | trunc).any()):  # the first episode of every env has ended
                break
        at = closest < NEAR
        rows = torch.arange(episodes)
        right = at[rows, 0, named]
        wrong = at[:, 0].any(-1) & ~right
        other = at[:, 1].any(-1) & ~at[:, 0].any(-1)
        share = {"named_direction": right, "other_direction": wrong, "other_cube": other,
                 "none": ~(right | wrong | other)}
        return {k: float(v.double().mean()) for k, v in share.items()}
    finally:
        env.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--episodes", type=int, default=50)
    p.add_argument("--seed", type=int, default=12345)
    a = p.parse_args()
    print(json.dumps(push_sides(a.checkpoint, a.episodes, a.seed)))


if __name__ == "__main__":
    main()
