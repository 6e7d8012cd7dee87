"""Throughput on the Push scene, all measured in one run on this machine:

1. raw batched MuJoCo (`mujoco.rollout`, same model, substeps and threads, replaying our env's controls),
2. our VecEnv (controller IK, observations, rewards, auto-reset included),
3. our PPO end to end (collect + update),
4. Stable-Baselines3 PPO on the same task through our Gymnasium adapter, same envs, network, batch sizes.

Prints a table and, last, `vecenv/raw=X ppo/sb3=Y` (both at the largest N); writes
`docs/results/throughput.{md,json,png}`.
Usage: python bench/throughput.py [--sizes 16 64 256] [--seconds 10]
"""
from __future__ import annotations

import argparse
import time

import mujoco
import numpy as np
import torch
from mujoco import rollout
from study import write_results

from roborl import (
    sim,
    tasks,  # noqa: F401
)
from roborl.algos.ppo import PPO
from roborl.buffer import RolloutBuffer
from roborl.builder import make_policy
from roborl.config import Config

ENV_ID = "mujoco/Push"


def timed(fn, seconds: float) -> float:
    """Calls fn() (which returns how many env steps it did) until `seconds` pass; env steps per second."""
    fn()  # warm-up
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        steps += fn()
    return steps / (time.perf_counter() - start)


def raw_mujoco(n: int, seconds: float) -> float:
    """`mujoco.rollout` alone, replaying the controls our VecEnv produced for random actions (so both move
    the arm and touch the cube alike) from the same start state."""
    env = sim.make(ENV_ID, n)
    env.reset()
    start = env.state.copy()
    gen = torch.Generator().manual_seed(0)
    controls = []
    for _ in range(env.max_episode_steps - 1):  # one episode, no reset in between
        env.step(torch.rand(n, env.action_dim, generator=gen) * 2 - 1)
        controls.append(env._ctrl.copy())
    model, substeps, nthread = env.model, env.substeps, env.nthread
    env.close()
    datas = [mujoco.MjData(model) for _ in range(nthread)]
    models = [model] * n
    state = start.copy()
    out = np.empty((n, substeps, state.shape[1]))
    sens = np.empty((n, substeps, 0))
    t = {"i": 0}
    with rollout.Rollout(nthread=nthread) as pool:
        def step() -> int:
            i = t["i"] % len(controls)
            if i == 0:
                np.copyto(state, start)
            pool.rollout(models, datas, state, controls[i], skip_checks=True, nstep=substeps, state=out,
                         sensordata=sens)
            np.copyto(state, out[:, -1])
            t["i"] += 1
            return n
        return timed(step, seconds)


def our_vecenv(n: int, seconds: float) -> float:
    env = sim.make(ENV_ID, n)
    env.reset()
    action = torch.zeros(n, env.action_dim)
    gen = torch.Generator().manual_seed(0)

    def step() -> int:
        action.uniform_(-1, 1, generator=gen)
        env.step(action)
        return n
    sps = timed(step, seconds)
    env.close()
    return sps


def ppo_config(n: int) -> Config:
    cfg = Config()
    cfg.env.id, cfg.env.num_envs = ENV_ID, n
    cfg.policy.hidden = [256, 256]
    cfg.algo.epochs, cfg.algo.minibatches = 4, 4
    cfg.train.rollout_steps = 32
    return cfg


def our_ppo(n: int, seconds: float) -> float:
    cfg = ppo_config(n)
    env = sim.make(ENV_ID, n)
    policy = make_policy(cfg.policy, env)
    algo = PPO(policy, cfg.algo)
    buf = RolloutBuffer(cfg.train.rollout_steps, n, torch.device("cpu"))
    state = {"obs": env.reset()}

    def iteration() -> int:
        obs = state["obs"]
        with torch.no_grad():
            for _ in range(cfg.train.rollout_steps):
                act = policy.act(obs)
                nxt, r, te, tr, info = env.step(act.action)
                buf.add(obs, act, r, te | tr)
                obs = nxt
            buf.finish(policy.value(obs), cfg.algo.gamma, cfg.algo.gae_lambda)
        algo.update(buf)
        state["obs"] = obs
        return n * cfg.train.rollout_steps
    sps = timed(iteration, seconds)
    env.close()
    return sps


def sb3_ppo(n: int, seconds: float, batched: bool) -> float:
    """SB3 PPO, as SB3 users run it (`DummyVecEnv` over N single-env `gymnasium.Env` adapters) or,
    with `batched`, over one shim that feeds SB3 our batched VecEnv through the Gymnasium vector adapter."""
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.vec_env import DummyVecEnv
    from stable_baselines3.common.vec_env import VecEnv as SB3VecEnv

    from roborl.sim.gym_adapters import GymnasiumEnv, GymnasiumVectorEnv

    class SB3Adapter(SB3VecEnv):
        """SB3's VecEnv interface over our Gymnasium vector adapter (bench only)."""

        def __init__(self, venv: GymnasiumVectorEnv) -> None:
            self.venv = venv
            super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)

        def reset(self):
            return self.venv.reset()[0]

        def step_async(self, actions):
            self._actions = actions

        def step_wait(self):
            obs, rew, term, trunc, info = self.venv.step(self._actions)
            done = term | trunc
            infos = [{} for _ in range(self.num_envs)]
            for i in np.flatnonzero(done):
                infos[i]["terminal_observation"] = info["final_obs"][i]
                infos[i]["TimeLimit.truncated"] = bool(trunc[i] and not term[i])
            return obs, rew.astype(np.float32), done, infos

        def close(self):
            self.venv.close()

        def get_attr(self, name, indices=None):
            return [getattr(self, name, None)] * self.num_envs

        def set_attr(self, name, value, indices=None):
            pass

        def env_method(self, name, *args, indices=None, **kwargs):
            return [None] * self.num_envs

        def env_is_wrapped(self, wrapper_class, indices=None):
            return [False] * self.num_envs

        def seed(self, seed=None):
            return [None] * self.num_envs

    cfg = ppo_config(n)
    if batched:
        venv = SB3Adapter(GymnasiumVectorEnv(sim.make(ENV_ID, n)))
    else:
        venv = DummyVecEnv([lambda i=i: GymnasiumEnv(sim.make(ENV_ID, 1, seed=i, nthread=1)) for i in range(n)])
    steps = cfg.train.rollout_steps
    model = SB3PPO("MlpPolicy", venv, n_steps=steps, batch_size=n * steps // cfg.algo.minibatches,
                   n_epochs=cfg.algo.epochs, policy_kwargs={"net_arch": list(cfg.policy.hidden)},
                   device="cpu", verbose=0)
    sps = timed(lambda: (model.learn(n * steps, reset_num_timesteps=False), n * steps)[1], seconds)
    venv.close()
    return sps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for n in args.sizes:
        raw, ours = raw_mujoco(n, args.seconds), our_vecenv(n, args.seconds)
        ppo, sb3, sb3b = our_ppo(n, args.seconds), sb3_ppo(n, args.seconds, False), sb3_ppo(n, args.seconds, True)
        rows.append({"envs": n, "raw_mujoco": raw, "our_vecenv": ours, "our_ppo": ppo, "sb3_ppo": sb3,
                     "sb3_ppo_batched": sb3b})
        print(rows[-1], flush=True)
    lines = [f"Env steps per second on mujoco/Push, one torch thread, {args.seconds:g} s per measurement.", "",
             "| N | raw MuJoCo | our VecEnv | VecEnv ÷ raw | our PPO | SB3 PPO | ours ÷ SB3 | SB3 PPO, batched env | "
             "ours ÷ SB3 batched |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['envs']} | {r['raw_mujoco']:,.0f} | {r['our_vecenv']:,.0f} | "
                     f"{r['our_vecenv'] / r['raw_mujoco']:.2f} | "
                     f"{r['our_ppo']:,.0f} | {r['sb3_ppo']:,.0f} | {r['our_ppo'] / r['sb3_ppo']:.2f} | "
                     f"{r['sb3_ppo_batched']:,.0f} | {r['our_ppo'] / r['sb3_ppo_batched']:.2f} |")
    lines += ["", "Raw MuJoCo: `mujoco.rollout` replaying our env's controls. SB3 PPO: DummyVecEnv over N one-env "
              "Gymnasium adapters (how SB3 runs envs); SB3 batched: SB3 fed our batched VecEnv through a shim, so both "
              "share the same physics cost."]
    last = rows[-1]
    write_results("throughput", "Throughput: our VecEnv and PPO against raw MuJoCo and Stable-Baselines3", lines,
                  {"rows": rows}, seeds="not applicable (speed)",
                  bars={label: last[key] for key, label in (("raw_mujoco", "raw MuJoCo"), ("our_vecenv", "our VecEnv"),
                                                            ("our_ppo", "our PPO"), ("sb3_ppo", "SB3 PPO"),
                                                            ("sb3_ppo_batched", "SB3 PPO, batched env"))},
                  plot_title=f"mujoco/Push, N = {last['envs']}", bar_label="env steps per second")
    print(f"vecenv/raw={last['our_vecenv'] / last['raw_mujoco']:.2f} ppo/sb3={last['our_ppo'] / last['sb3_ppo']:.2f}")


if __name__ == "__main__":
    main()
