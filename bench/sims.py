"""Env steps per second of each installed simulator backend through our VecEnv against the backend's own loop,
random actions, one run on this machine:

- mujoco/Push: raw `mujoco.batch` replaying our controls (bench/throughput.py) vs our MujocoVecEnv;
- gym/Pusher-v5: Gymnasium's SyncVectorEnv vs our GymVecEnv (the same SyncVectorEnv plus torch conversion);
- maniskill/PushCube-v1 (CPU sim): ManiSkill's CPU recipe (Gymnasium AsyncVectorEnv, one process per env,
  CPUGymWrapper, as its ppo_cpu.py) vs our ManiSkillVecEnv (one worker process per core); and one env in one
  process (`gym.make` loop vs ours with workers=0), the per-step cost without any parallelism.

Prints a markdown table and writes `docs/results/sims.{md,json,png}`.
Usage: python bench/sims.py [--seconds 5] [--mujoco-envs 64] [--maniskill-envs 8]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
from collections.abc import Callable

import gymnasium as gym
import torch
from study import write_results
from throughput import our_vecenv, raw_mujoco, timed

from roborl import sim


def vecenv_sps(env_id: str, n: int, seconds: float, **options) -> float:
    """Our VecEnv `env_id` with N envs stepped with uniform random actions."""
    env = sim.make(env_id, n, **options)
    env.reset(seed=0)
    gen = torch.Generator().manual_seed(0)

    def step() -> int:
        env.step(torch.rand(n, env.action_dim, generator=gen) * 2 - 1)
        return n
    try:
        return timed(step, seconds)
    finally:
        env.close()


def native_sps(venv: gym.vector.VectorEnv | gym.Env, n: int, seconds: float) -> float:
    """A Gymnasium env or vector env of N envs (own autoreset) stepped with samples of its action space."""
    venv.reset(seed=0)
    venv.action_space.seed(0)

    def step() -> int:
        venv.step(venv.action_space.sample())
        return n
    try:
        return timed(step, seconds)
    finally:
        venv.close()


def maniskill_env(env_id: str) -> Callable[[], gym.Env]:
    def make() -> gym.Env:
        import mani_skill.envs  # noqa: F401
        from mani_skill.utils.wrappers.gymnasium import CPUGymWrapper

        env = gym.make(env_id, num_envs=1, sim_backend="physx_cpu", render_backend="cpu", obs_mode="state",
                       control_mode="pd_joint_delta_pos", reward_mode="normalized_dense")
        return CPUGymWrapper(env)
    return make


def rows(seconds: float, mujoco_envs: int, maniskill_envs: int) -> list[tuple[str, str, int, str, float, float]]:
    out = []
    n = mujoco_envs
    out.append(("mujoco", "Push", n, "mujoco.batch", timed(raw_mujoco(n), seconds), timed(our_vecenv(n), seconds)))
    try:
        gym.make("Pusher-v5").close()
        n = 16
        native = native_sps(gym.make_vec("Pusher-v5", num_envs=n, vectorization_mode="sync"), n, seconds)
        out.append(("gym", "Pusher-v5", n, "gymnasium SyncVectorEnv", native, vecenv_sps("gym/Pusher-v5", n, seconds)))
    except (gym.error.Error, ImportError) as exc:
        print(f"skipping gym/Pusher-v5: {exc}")
    if importlib.util.find_spec("mani_skill") is None:
        print("skipping maniskill/: mani_skill is not installed (pip install -e '.[maniskill]')")
        return out
    ms = "PushCube-v1"
    n = maniskill_envs
    native = native_sps(gym.vector.AsyncVectorEnv([maniskill_env(ms)] * n, context="spawn"), n, seconds)
    out.append(("maniskill (CPU)", ms, n, f"AsyncVectorEnv, {n} processes", native,
                vecenv_sps(f"maniskill/{ms}", n, seconds)))
    native = native_sps(maniskill_env(ms)(), 1, seconds)
    out.append(("maniskill (CPU)", ms, 1, "gym.make loop, 1 process", native,
                vecenv_sps(f"maniskill/{ms}", 1, seconds, workers=0)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--mujoco-envs", type=int, default=64)
    parser.add_argument("--maniskill-envs", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    table = rows(args.seconds, args.mujoco_envs, args.maniskill_envs)
    lines = [f"Env steps per second with random actions, {args.seconds:g} s per measurement, {os.cpu_count()} cores.", "",
             "| backend | task | N | native loop | native steps/s | our VecEnv steps/s | ours / native |",
             "|---|---|---:|---|---:|---:|---:|"]
    for backend, task, n, loop, native, ours in table:
        lines.append(f"| {backend} | {task} | {n} | {loop} | {native:,.0f} | {ours:,.0f} | {ours / native:.2f} |")
    data = [dict(zip(("backend", "task", "envs", "native_loop", "native_sps", "ours_sps"), row)) for row in table]
    write_results("sims", "Simulator backends: our VecEnv against each backend's own loop", lines, {"rows": data},
                  seeds="not applicable (speed)", bars={f"{b} {t}, N={n}": o / nat for b, t, n, _, nat, o in table},
                  bar_label="our VecEnv steps/s ÷ the backend's own loop")


if __name__ == "__main__":
    main()
