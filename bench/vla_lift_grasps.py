"""Why a LangTabletop lift policy fails: of the episodes of `mujoco/LangTabletopFixed-Lift` (deterministic
actions), the share that never grasped the cube, grasped it but never held it at the goal height, held it
there but not at the end, or succeeded; and where the gripper was, relative to the cube, when the policy
first commanded it closed (mean and std in cm per axis, for the episodes that grasped and those that never
did). A policy that closes at the right place but drops the cube needs a firmer hold; one that closes too
high or off to the side needs a more precise approach.

Usage: python bench/vla_lift_grasps.py CHECKPOINT [--episodes 64] [--seed 4242]   (about 30 s per checkpoint)
"""
from __future__ import annotations

import argparse
import json

import torch

from roborl.checkpoint import Checkpoint
from roborl.evaluate import load_for_eval
from tasks.multitask_tabletop import CUBE_HALF, LIFT_HEIGHT

TASK = "mujoco/LangTabletopFixed-Lift"


def lift_grasps(checkpoint: str, episodes: int = 64, seed: int = 4242) -> dict:
    env, policy = load_for_eval(Checkpoint(checkpoint), episodes, torch.device("cpu"), TASK)
    try:
        sim = env.unwrapped
        obs = env.reset(seed=seed)
        grasped = torch.zeros(episodes, dtype=torch.bool)
        high = torch.zeros(episodes, dtype=torch.bool)
        at_close = torch.full((episodes, 3), float("nan"), dtype=torch.float64)
        for _ in range(env.max_episode_steps or 60):
            with torch.no_grad():
                action = policy.act(obs, deterministic=True).action
            closing = action.reshape(episodes, -1, action.shape[-1])[:, 0, -1] < 0  # the first step it executes
            first = closing & at_close[:, 0].isnan()
            at_close[first] = (sim.tcp - sim.cube.pos)[first]
            obs, _, term, trunc, info = env.step(action)
            holding = sim.is_grasping(sim.cube.pos)
            grasped |= holding
            high |= holding & (sim.cube.pos[:, 2] > CUBE_HALF + LIFT_HEIGHT)
            if bool((term | trunc).any()):  # the first episode of every env has ended
                break
        success = info["success"].cpu()
        share = {"success": success, "never_grasped": ~grasped, "grasped_never_high": grasped & ~high,
                 "high_not_at_end": high & ~success}
        result: dict = {k: round(float(v.double().mean()), 3) for k, v in share.items()}
        for name, rows in (("grasped", grasped), ("never_grasped", ~grasped)):
            cm = at_close[rows & ~at_close[:, 0].isnan()] * 100
            result[f"close_offset_cm_{name}"] = {"episodes": len(cm), "mean_xyz": cm.mean(0).round(decimals=2).tolist(),
                                                 "std_xyz": cm.std(0).round(decimals=2).tolist()}
        return result
    finally:
        env.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--seed", type=int, default=4242)
    a = p.parse_args()
    print(json.dumps(lift_grasps(a.checkpoint, a.episodes, a.seed)))


if __name__ == "__main__":
    main()
