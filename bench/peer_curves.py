"""Learning curves: our PPO against rsl_rl's PPO (`rsl-rl-lib`) on the same VecEnv, over training seeds.

Both learners train on the env `roborl train` builds from the config (rsl_rl through the thin adapter of
bench/peer_adapters.py), with the config's network, rollout length, epochs, minibatches, learning rate, gamma
and lambda; rsl_rl with the PPO settings its docs recommend (adaptive learning rate, clipped value loss,
observation normalization). Both are evaluated alike at the same env steps: our deterministic evaluation
(roborl/evaluate.py) on the same evaluation envs and seeds, rsl_rl's policy acting by its mean.

Prints, per learner, the deterministic eval success over the seeds at a few env-step marks (mean with a 95%
bootstrap CI), the final success, the seeds and median env steps to 80%, and minutes per run. Writes
`docs/results/peer_curves.{json,md,png}` (with another config, `peer_curves_<config>.*`).

Usage: python bench/peer_curves.py [--config configs/ppo_reach.yaml] [--seeds 0 1 2] [--steps N] [--reuse]
       [--run-dir runs/peer_curves]
About 10 minutes on 2 CPU cores with the defaults (six runs of Reach, one after the other).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import time
from pathlib import Path

import numpy as np
import torch
from peer_adapters import RslRlAdapter, rsl_rl_train_cfg
from study import first_reaching, mean_curve, median_to, train_runs, write_results

from roborl.builder import make_run_env
from roborl.config import load_config
from roborl.evaluate import evaluate
from roborl.policies.act import Act
from roborl.run_dir import write_json
from roborl.stats import summarize

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.8
EVAL_EVERY = 4  # iterations between evaluations, on both sides
DEFAULT_CONFIG = "configs/ppo_reach.yaml"  # its page is peer_curves.md


class MeanActor(torch.nn.Module):
    """rsl_rl's policy acting by its mean, behind the `act` that roborl's evaluation calls."""

    def __init__(self, policy: torch.nn.Module, num_envs: int) -> None:
        super().__init__()
        self.policy, self.num_envs = policy, num_envs

    def act(self, obs: dict, deterministic: bool = True) -> Act:
        from tensordict import TensorDict

        with torch.inference_mode():
            action = self.policy(TensorDict({"policy": obs["state"]}, batch_size=[obs["state"].shape[0]]))
        return Act(action, torch.zeros(len(action)))


def train_rsl_rl(config: Path, overrides: list[str], seed: int, run_dir: Path, reuse: bool) -> dict:
    """rsl_rl's OnPolicyRunner for as many iterations as our runner runs, evaluated every EVAL_EVERY of them."""
    summary_path = run_dir / f"rsl_rl_{config.stem}_seed{seed}.json"
    if reuse and summary_path.is_file():
        return json.loads(summary_path.read_text())
    from rsl_rl.runners import OnPolicyRunner

    cfg = load_config(config, [*overrides, f"train.seed={seed}"])
    t, a, p = cfg.train, cfg.algo, cfg.policy
    torch.manual_seed(seed)
    np.random.seed(seed)
    device = torch.device("cpu")
    env = RslRlAdapter(make_run_env(cfg, cfg.env.num_envs, t.seed, device), seed=t.seed)  # as our runner resets
    eval_env = make_run_env(dataclasses.replace(cfg, env=cfg.env.for_evaluation()), min(t.eval_envs, t.eval_episodes),
                            t.seed + 1, device)
    train_cfg = rsl_rl_train_cfg(list(p.hidden), p.activation, float(np.exp(p.init_log_std)), t.rollout_steps,
                                 a.epochs, a.minibatches, a.lr, a.gamma, a.gae_lambda)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its networks
        runner = OnPolicyRunner(env, train_cfg, log_dir=None, device="cpu")
    per_iteration = cfg.env.num_envs * t.rollout_steps
    iterations = -(-t.total_steps // per_iteration)
    history, start, done = [], time.perf_counter(), 0  # wall time with the evaluations, as our runner's clock
    while done < iterations:
        chunk = min(EVAL_EVERY, iterations - done)
        with contextlib.redirect_stdout(io.StringIO()):
            runner.learn(chunk)
        done += chunk
        wall = time.perf_counter() - start
        result = evaluate(MeanActor(runner.get_inference_policy(), eval_env.num_envs), eval_env, t.eval_episodes,
                          seed=t.seed + 1000)
        runner.alg.train_mode()
        history.append([done * per_iteration, round(wall, 2), result["success_rate"]])
    env.close()
    eval_env.close()
    summary = {"success_rate": history[-1][2], "env_steps": done * per_iteration, "wall_time_s": history[-1][1],
               "eval_history": history}
    write_json(summary_path, summary)
    print(f"rsl_rl seed {seed}: final success {summary['success_rate']:.3f}, {summary['env_steps']:,} env steps, "
          f"{summary['wall_time_s'] / 60:.1f} min", flush=True)
    return summary


def at(history: list[list[float]], steps: int) -> float:
    """Success of the last evaluation at or before `steps` env steps."""
    return [success for s, _, success in history if s <= steps][-1]


def row(learner: str, summaries: list[dict], marks: list[int]) -> dict:
    reached = [first_reaching(s["eval_history"], TARGET) for s in summaries]
    return {"learner": learner, **summarize([[s["success_rate"] for s in summaries]]),
            "final_success": [s["success_rate"] for s in summaries], "reached": sum(r is not None for r in reached),
            "median_env_steps_to_target": median_to(reached, 0),
            "at": {str(m): summarize([[at(s["eval_history"], m) for s in summaries]]) for m in marks},
            "minutes": [s["wall_time_s"] / 60 for s in summaries], "env_steps": [s["env_steps"] for s in summaries],
            "eval_history": [s["eval_history"] for s in summaries]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=DEFAULT_CONFIG)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=0, help="env steps per run (0: the config's train.total_steps)")
    p.add_argument("--run-dir", default="runs/peer_curves")
    p.add_argument("--reuse", action="store_true", help="keep the runs that already finished in --run-dir")
    args = p.parse_args()
    config, runs = ROOT / args.config, Path(args.run_dir).resolve()
    name = config.stem
    overrides = [f"train.total_steps={args.steps}"] if args.steps else []
    ours = train_runs([(f"{name}_seed{seed}", [str(config), *overrides, f"train.seed={seed}",
                                              f"train.eval_every={EVAL_EVERY}", "train.video=false"])
                       for seed in args.seeds], runs, args.reuse, 1)
    theirs = [train_rsl_rl(config, overrides, seed, runs, args.reuse) for seed in args.seeds]
    total = min(s["env_steps"] for s in ours + theirs)
    points = [h[0] for h in ours[0]["eval_history"] if h[0] <= total]  # both sides evaluate at these env steps
    marks = sorted({min(points, key=lambda x: abs(x - total * f)) for f in (1 / 8, 1 / 4, 1 / 2, 1)})
    rows = [row("roborl PPO", ours, marks), row("rsl_rl PPO", theirs, marks)]
    cfg = load_config(config, overrides)
    lines = ["| learner | " + " | ".join(f"success at {m:,} env steps" for m in marks) + f" | seeds reaching "
             f"{TARGET:.0%} | median env steps to {TARGET:.0%} | minutes per run | each seed's final success |",
             "|---|" + "---|" * (len(marks) + 4)]
    for r in rows:
        cells = [f"{r['at'][str(m)]['mean']:.2f} [{r['at'][str(m)]['ci95'][0]:.2f}, {r['at'][str(m)]['ci95'][1]:.2f}]"
                 for m in marks]
        steps = f"{int(r['median_env_steps_to_target']):,}" if r["median_env_steps_to_target"] else "not reached"
        lines.append(f"| {r['learner']} | {' | '.join(cells)} | {r['reached']}/{len(args.seeds)} | {steps} | "
                     f"{', '.join(f'{m:.1f}' for m in r['minutes'])} | {', '.join(f'{x:.2f}' for x in r['final_success'])} |")
    lines += ["", f"Task {cfg.env.id} with `{args.config}` on both sides: {cfg.env.num_envs} envs, rollouts of "
              f"{cfg.train.rollout_steps} steps, networks {list(cfg.policy.hidden)} ({cfg.policy.activation}), "
              f"{cfg.algo.epochs} epochs of {cfg.algo.minibatches} minibatches, lr {cfg.algo.lr:g}, gamma "
              f"{cfg.algo.gamma:g}, lambda {cfg.algo.gae_lambda:g}. Ours keeps the config's PPO settings (target KL "
              f"{cfg.algo.target_kl:g}, fixed lr); rsl_rl runs its recommended ones (adaptive lr for a KL of 0.01, "
              "clipped value loss, observation normalization). Success: the deterministic evaluation's "
              f"({cfg.train.eval_episodes} episodes, the same evaluation envs and seeds on both sides) every "
              f"{EVAL_EVERY} iterations; each cell is the mean over seeds of the last evaluation at or before that "
              "many env steps, with its 95% bootstrap CI. Minutes: each run's wall time, its evaluations included, "
              "one run at a time."]
    page = "peer_curves" if args.config == DEFAULT_CONFIG else f"peer_curves_{name}"
    write_results(page, "Learning curves: our PPO and rsl_rl's PPO on the same VecEnv", lines,
                  {"config": args.config, "rows": rows},
                  seeds=f"training seeds {', '.join(map(str, args.seeds))} for both learners",
                  curves={r["learner"]: mean_curve(r["eval_history"]) for r in rows},
                  plot_title=f"{cfg.env.id}: our PPO vs rsl_rl's PPO (mean over seeds)")


if __name__ == "__main__":
    main()
