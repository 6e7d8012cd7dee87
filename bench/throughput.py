"""Throughput on the Push scene, all measured in one run on this machine, interleaved so that a busy moment
hits every contender alike:

1. raw batched MuJoCo, both of its batched stepping APIs (`mujoco.batch.Batch`, which our VecEnv steps with,
   and `mujoco.rollout`), same model, substeps and threads, replaying our env's controls; the faster is the
   raw physics every ratio is taken against,
2. our VecEnv (controller IK, observations, rewards, auto-reset included),
3. our PPO end to end (the runner's iteration: the collector's rollout, GAE, the update, the normalizer),
4. the ideal of PPO on this machine: physics, policy inference and the PPO update, each measured alone on
   the same sizes, added up (what a learner with no other cost would reach, running them one after another),
5. rsl_rl's PPO (`rsl-rl-lib`, its OnPolicyRunner) on our VecEnv through a thin adapter (whose own cost is
   measured too), with the same network, rollout length, epochs and minibatches,
6. Stable-Baselines3 PPO as SB3 users run it (N one-env Gymnasium adapters) and fed our batched VecEnv.

Prints a table and, last, `vecenv/raw=X ppo/ideal=Y ppo/rsl_rl=Z ppo/sb3=W` (at the largest N); writes
`docs/results/throughput.{md,json,png}`.
Usage: python bench/throughput.py [--sizes 16 64 256] [--seconds 10] [--rounds 10]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
import time
from collections.abc import Callable

import mujoco
import numpy as np
import torch
from mujoco import batch, rollout
from peer_adapters import RslRlAdapter, SB3Adapter, rsl_rl_train_cfg
from study import write_results

from roborl import (
    sim,
    tasks,  # noqa: F401
)
from roborl.config import Config
from roborl.runner import Runner
from roborl.sim.gym_adapters import GymnasiumEnv, GymnasiumVectorEnv

ENV_ID = "mujoco/Push"
ROLLOUT_STEPS, EPOCHS, MINIBATCHES, HIDDEN = 32, 4, 4, [256, 256]


def interleaved(contenders: dict[str, Callable[[], int]], seconds: float, rounds: int) -> dict[str, float]:
    """Env steps per second of each contender (a callable that does some work and returns its env steps):
    `rounds` turns of `seconds / rounds` each, the contenders one after another in every round, so that the
    machine's slow and fast moments fall on all of them alike; each one's steps over its time in all rounds."""
    for fn in contenders.values():
        fn()  # warm-up
    steps, elapsed = dict.fromkeys(contenders, 0), dict.fromkeys(contenders, 0.0)
    for _ in range(rounds):
        for name, fn in contenders.items():
            start = time.perf_counter()
            while time.perf_counter() - start < seconds / rounds:
                steps[name] += fn()
            elapsed[name] += time.perf_counter() - start
    return {name: steps[name] / elapsed[name] for name in contenders}


def timed(step: Callable[[], int], seconds: float) -> float:
    """Env steps per second of `step` (a callable returning its env steps) over `seconds`, after a warm-up."""
    return interleaved({"step": step}, seconds, 1)["step"]


def raw_mujoco(n: int, engine: str = "batch") -> Callable[[], int]:
    """MuJoCo's batched stepping alone (`engine`: "batch", `mujoco.batch.Batch`, or "rollout",
    `mujoco.rollout`), replaying the controls our VecEnv produced for random actions (so both move the arm
    and touch the cube alike) from the same start state, one episode over and over."""
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
    if engine == "batch":
        return _raw_batch(model, n, substeps, nthread, start, [c[:, 0] for c in controls])
    datas = [mujoco.MjData(model) for _ in range(nthread)]
    models = [model] * n
    state = start.copy()
    out = np.empty((n, substeps, state.shape[1]))
    sens = np.empty((n, substeps, 0))
    pool = rollout.Rollout(nthread=nthread)
    t = {"i": 0}

    def step() -> int:
        i = t["i"] % len(controls)
        if i == 0:
            np.copyto(state, start)
        pool.rollout(models, datas, state, controls[i], skip_checks=True, nstep=substeps, state=out, sensordata=sens)
        np.copyto(state, out[:, -1])
        t["i"] += 1
        return n
    return step


def _raw_batch(model: mujoco.MjModel, n: int, substeps: int, nthread: int, start: np.ndarray,
               controls: list[np.ndarray]) -> Callable[[], int]:
    physics = batch.Batch(model, n, nthread=nthread)
    ctrl = physics.bind("ctrl")
    full = start.shape[1]  # the full-physics state leads the Batch's rows on this scene (no mocap or plugins)
    t = {"i": 0}

    def step() -> int:
        i = t["i"] % len(controls)
        if i == 0:
            physics.state[:] = 0.0
            physics.state[:, :full] = start
        ctrl[:] = controls[i]
        physics.step(nstep=substeps)
        t["i"] += 1
        return n
    return step


def our_vecenv(n: int) -> Callable[[], int]:
    env = sim.make(ENV_ID, n)
    env.reset()
    action = torch.zeros(n, env.action_dim)
    gen = torch.Generator().manual_seed(0)

    def step() -> int:
        env.step(action.uniform_(-1, 1, generator=gen))
        return n
    return step


def ppo_config(n: int) -> Config:
    cfg = Config()
    cfg.env.id, cfg.env.num_envs = ENV_ID, n
    cfg.policy.hidden = HIDDEN
    cfg.algo.epochs, cfg.algo.minibatches = EPOCHS, MINIBATCHES
    cfg.train.rollout_steps, cfg.train.threads, cfg.train.progress = ROLLOUT_STEPS, 1, False
    cfg.train.run_dir = tempfile.mkdtemp(prefix="roborl-throughput-")
    return cfg


def our_ppo(n: int) -> tuple[Callable[[], int], Runner]:
    """The runner's own iteration (what `roborl train` repeats between evaluations)."""
    runner = Runner(ppo_config(n))
    runner.start()

    def iteration() -> int:
        runner.iterate(10**9)
        return n * ROLLOUT_STEPS
    return iteration, runner


def ppo_parts(runner: Runner) -> dict[str, Callable[[], int]]:
    """Policy inference and the PPO update alone, on the sizes of one iteration of `runner` (whose buffer
    holds a real rollout): each returns the env steps it stands for."""
    algo, n = runner.algo, runner.env.num_envs
    obs = runner.obs

    def inference() -> int:
        with torch.no_grad():
            algo.act(obs)
        return n

    def update() -> int:
        algo.update(algo.buffer, algo.generator)
        return n * ROLLOUT_STEPS
    return {"inference": inference, "update": update}


def with_threads(fn: Callable[[], int], threads: int) -> Callable[[], int]:
    """`fn` run with `threads` torch threads (the process's setting is put back after)."""
    def run() -> int:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return fn()
        finally:
            torch.set_num_threads(before)
    return run


def rsl_rl_ppo(n: int, cfg: Config) -> tuple[Callable[[], int], Callable[[], int]]:
    """rsl_rl's OnPolicyRunner iteration on our VecEnv, and the adapter's step alone (to show its cost).
    rsl_rl leaves torch's threads as they are, so it is measured with one thread and with all the cores
    (torch's default), and the faster counts."""
    from rsl_rl.runners import OnPolicyRunner

    env = RslRlAdapter(sim.make(ENV_ID, n))
    train_cfg = rsl_rl_train_cfg(HIDDEN, cfg.policy.activation, float(np.exp(cfg.policy.init_log_std)), ROLLOUT_STEPS,
                                 EPOCHS, MINIBATCHES, cfg.algo.lr, cfg.algo.gamma, cfg.algo.gae_lambda)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its networks
        runner = OnPolicyRunner(env, train_cfg, log_dir=None, device="cpu")
    action = torch.zeros(n, env.num_actions)
    gen = torch.Generator().manual_seed(0)

    def iteration() -> int:
        runner.learn(1)
        return n * ROLLOUT_STEPS

    def adapter_step() -> int:
        env.step(action.uniform_(-1, 1, generator=gen))
        return n
    return iteration, adapter_step


def sb3_ppo(n: int, batched: bool) -> Callable[[], int]:
    """SB3 PPO, as SB3 users run it (`DummyVecEnv` over N single-env `gymnasium.Env` adapters) or,
    with `batched`, over one shim that feeds SB3 our batched VecEnv through the Gymnasium vector adapter."""
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    if batched:
        venv = SB3Adapter(GymnasiumVectorEnv(sim.make(ENV_ID, n)))
    else:
        venv = DummyVecEnv([lambda i=i: GymnasiumEnv(sim.make(ENV_ID, 1, seed=i, nthread=1)) for i in range(n)])
    model = SB3PPO("MlpPolicy", venv, n_steps=ROLLOUT_STEPS, batch_size=n * ROLLOUT_STEPS // MINIBATCHES,
                   n_epochs=EPOCHS, policy_kwargs={"net_arch": HIDDEN}, device="cpu", verbose=0)

    def iteration() -> int:
        model.learn(n * ROLLOUT_STEPS, reset_num_timesteps=False)
        return n * ROLLOUT_STEPS
    return iteration


def measure(n: int, seconds: float, rounds: int) -> dict:
    """Every contender at N envs, interleaved; then the ideal from the parts."""
    ours, runner = our_ppo(n)
    rsl, adapter_step = rsl_rl_ppo(n, runner.cfg)
    cores = os.cpu_count() or 1
    contenders = {"raw_batch": raw_mujoco(n, "batch"), "raw_rollout": raw_mujoco(n, "rollout"),
                  "our_vecenv": our_vecenv(n), "our_ppo": ours,
                  **ppo_parts(runner), "rsl_rl_ppo_1_thread": rsl, f"rsl_rl_ppo_{cores}_threads": with_threads(rsl, cores),
                  "rsl_rl_adapter": adapter_step,
                  "sb3_ppo": sb3_ppo(n, batched=False), "sb3_ppo_batched": sb3_ppo(n, batched=True)}
    rates = interleaved(contenders, seconds, rounds)
    rates["raw_mujoco"] = max(rates["raw_batch"], rates["raw_rollout"])
    per_step = 1 / rates["raw_mujoco"] + 1 / rates["inference"] + 1 / rates["update"]  # seconds per env step
    rates["ideal_ppo"] = 1 / per_step
    rates["rsl_rl_ppo"] = max(rates["rsl_rl_ppo_1_thread"], rates[f"rsl_rl_ppo_{cores}_threads"])
    rates["envs"] = n
    runner.close()
    return rates


def table(rows: list[dict], seconds: float, rounds: int) -> list[str]:
    lines = [f"Env steps per second on mujoco/Push, over {seconds:g} s of each contender in {rounds} rounds, all "
             "contenders taking turns in every round (so the machine's slow moments fall on all alike).", "",
             "| N | raw MuJoCo | our VecEnv | VecEnv ÷ raw | rsl_rl adapter ÷ raw | our PPO | ideal PPO | "
             "ours ÷ ideal | rsl_rl PPO | ours ÷ rsl_rl | SB3 PPO | ours ÷ SB3 | SB3 PPO, batched env | "
             "ours ÷ SB3 batched |", "|---:" * 14 + "|"]
    for r in rows:
        lines.append(f"| {r['envs']} | {r['raw_mujoco']:,.0f} | {r['our_vecenv']:,.0f} | "
                     f"{r['our_vecenv'] / r['raw_mujoco']:.2f} | {r['rsl_rl_adapter'] / r['raw_mujoco']:.2f} | "
                     f"{r['our_ppo']:,.0f} | {r['ideal_ppo']:,.0f} | {r['our_ppo'] / r['ideal_ppo']:.2f} | "
                     f"{r['rsl_rl_ppo']:,.0f} | {r['our_ppo'] / r['rsl_rl_ppo']:.2f} | "
                     f"{r['sb3_ppo']:,.0f} | {r['our_ppo'] / r['sb3_ppo']:.2f} | "
                     f"{r['sb3_ppo_batched']:,.0f} | {r['our_ppo'] / r['sb3_ppo_batched']:.2f} |")
    last = rows[-1]
    cores = os.cpu_count() or 1
    lines += ["", f"Parts at N = {last['envs']} (env steps per second of each alone, one torch thread): policy "
              f"inference {last['inference']:,.0f}, PPO update {last['update']:,.0f}. Ideal PPO: physics, inference "
              "and update added up, 1 / (1/raw + 1/inference + 1/update). Threads: MuJoCo steps on all cores; our "
              "runner keeps torch on one thread during rollouts and gives the update all the cores, which the "
              "physics leaves idle then (`train.update_threads`), so it can pass the one-thread ideal. rsl_rl leaves "
              f"torch's threads alone: it ran with 1 and with {cores} ({last['rsl_rl_ppo_1_thread']:,.0f} and "
              f"{last[f'rsl_rl_ppo_{cores}_threads']:,.0f} env steps/s) and the faster is shown. SB3: one torch "
              "thread.", "",
              f"PPO settings on every side: networks {HIDDEN} (tanh), {ROLLOUT_STEPS} steps per env per iteration, "
              f"{EPOCHS} epochs of {MINIBATCHES} minibatches. Raw MuJoCo: the faster of MuJoCo's two batched "
              f"stepping APIs replaying our env's controls (at N = {last['envs']}: `mujoco.batch.Batch`, which our "
              f"VecEnv steps with, {last['raw_batch']:,.0f} env steps/s; `mujoco.rollout` "
              f"{last['raw_rollout']:,.0f}). rsl_rl: `rsl-rl-lib`'s OnPolicyRunner with its recommended PPO "
              "settings (adaptive lr, observation normalization), on our VecEnv through `bench/peer_adapters.py` "
              "(its step costs the ratio shown against raw physics). SB3 PPO: DummyVecEnv over N one-env Gymnasium "
              "adapters (how SB3 runs envs); SB3 batched: SB3 fed our batched VecEnv through a shim, so both share "
              "the same physics cost."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--seconds", type=float, default=10.0, help="per contender and N, over all rounds")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for n in args.sizes:
        rows.append(measure(n, args.seconds, args.rounds))
        print({k: round(v) for k, v in rows[-1].items()}, flush=True)
    last = rows[-1]
    labels = {"raw_mujoco": "raw MuJoCo", "our_vecenv": "our VecEnv", "ideal_ppo": "ideal PPO", "our_ppo": "our PPO",
              "rsl_rl_ppo": "rsl_rl PPO", "sb3_ppo_batched": "SB3 PPO, batched env", "sb3_ppo": "SB3 PPO"}
    write_results("throughput", "Throughput: our VecEnv and PPO against raw MuJoCo, the ideal, rsl_rl and SB3",
                  table(rows, args.seconds, args.rounds), {"rows": rows}, seeds="not applicable (speed)",
                  bars={label: last[key] for key, label in labels.items()},
                  plot_title=f"mujoco/Push, N = {last['envs']}", bar_label="env steps per second")
    print(f"vecenv/raw={last['our_vecenv'] / last['raw_mujoco']:.2f} ppo/ideal={last['our_ppo'] / last['ideal_ppo']:.2f} "
          f"ppo/rsl_rl={last['our_ppo'] / last['rsl_rl_ppo']:.2f} ppo/sb3={last['our_ppo'] / last['sb3_ppo']:.2f}")


if __name__ == "__main__":
    main()
