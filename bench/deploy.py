"""Sim-to-real on Push: a policy trained with domain randomization (configs/ppo_push_dr.yaml) against one
trained without (configs/ppo_push.yaml). Each is exported (ONNX), served by `roborl serve` in its own
process, and driven by the robot-side control loop on MuJoCo digital twins in their own processes at
real-time rate: the issue's perturbed robot (cube mass ×1.5, friction ×0.5, 20 ms actuation latency)
and the same robot with 5 mm of sensor noise on the state.

Prints per policy: success in simulation (nominal and with each perturbation, batched, fresh
episodes), success on each twin, the control rate achieved, loop jitter, and round-trip latency
percentiles of the policy requests. Writes `docs/results/deploy.{json,md,png}`.

Usage: python bench/deploy.py [--run-dir runs/deploy] [--sim-episodes 200] [--twin-episodes 30] [--reuse]
Training takes 15-40 minutes per policy on 2 CPU cores; the twin episodes run in real time (4 s each).
"""
from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path

import torch
from study import run_once, write_results

from roborl.builder import build
from roborl.checkpoint import Checkpoint
from roborl.config import config_from_dict, load_config
from roborl.deploy.client import PolicyClient
from roborl.deploy.export import export_checkpoint
from roborl.deploy.server import start_server
from roborl.evaluate import evaluate
from roborl.robot.episodes import run_episodes
from roborl.robot.twin import TwinRobot, TwinSettings, start_twin
from roborl.runner import Runner

ROOT = Path(__file__).resolve().parents[1]
SEEDS = "1 training seed per run (`train.seed` of each config)"
RUNS = {"push_nodr": "ppo_push", "push_dr": "ppo_push_dr"}
PERTURBED = {"object_mass": 1.5, "friction": 0.5, "latency_ms": 20.0}
TWINS = {"perturbed": PERTURBED, "perturbed+noise": {**PERTURBED, "obs_noise": 0.005}}


def sim_success(checkpoint: Path, perturb: dict[str, float], episodes: int) -> float:
    """Deterministic success of the policy in the batched simulator with the perturbation held fixed."""
    ckpt = Checkpoint(checkpoint)
    cfg = config_from_dict(ckpt.config)
    cfg.env.num_envs, cfg.env.randomize = 50, TwinSettings(perturb=perturb).randomization()
    env, policy = build(cfg, torch.device("cpu"))
    ckpt.load_policy(policy)
    try:
        return evaluate(policy.eval(), env, episodes, seed=777)["success_rate"]
    finally:
        env.close()


def twin_episodes(uri: str, twin_uri: str, episodes: int, seed: int, out: dict) -> None:
    """Episodes on one twin through the policy server; fills `out` (run in a thread per twin)."""
    client = PolicyClient(uri)
    robot = TwinRobot(twin_uri)
    robot.connect()
    before = robot.status()
    out.update(run_episodes(robot, client, episodes, seed))
    after = robot.status()  # counted over these episodes only (the twin also ticks while it waits for them)
    out.update(twin_missed_commands=after["missed"] - before["missed"], twin_overruns=after["overruns"] - before["overruns"],
               twin_ticks=after["ticks"] - before["ticks"])
    robot.close()
    client.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", default="runs/deploy")
    p.add_argument("--sim-episodes", type=int, default=200)
    p.add_argument("--twin-episodes", type=int, default=30)
    p.add_argument("--reuse", action="store_true")
    args = p.parse_args()
    run_dir = Path(args.run_dir)
    rows, curves, processes = [], {}, []
    try:
        twins = {name: start_twin(TwinSettings(env_id="mujoco/Push", perturb=perturb)) for name, perturb in TWINS.items()}
        processes += [proc for proc, _ in twins.values()]
        for name, config in RUNS.items():
            cfg = load_config(ROOT / "configs" / f"{config}.yaml", [f"train.run_dir={run_dir}", "train.progress=false",
                                                                     f"train.name={name}"])
            summary = run_once(run_dir, name, args.reuse, lambda: Runner(cfg).train())
            curves[name] = [(s, r) for s, _, r in summary["eval_history"]]
            checkpoint = run_dir / name / "checkpoints" / "best.safetensors"
            row = {"policy": name, "config": f"configs/{config}.yaml", "env_steps": summary["env_steps"],
                   "sim": {"nominal": sim_success(checkpoint, {}, args.sim_episodes)}}
            for twin, perturb in TWINS.items():
                row["sim"][twin] = sim_success(checkpoint, perturb, args.sim_episodes)
            artifact = run_dir / name / f"{name}.onnx"
            export_checkpoint(checkpoint, "onnx", artifact)
            server, uri = start_server(artifact)
            processes.append(server)
            results = {twin: {} for twin in TWINS}
            threads = [threading.Thread(target=twin_episodes, args=(uri, twin_uri, args.twin_episodes, 1000, results[twin]))
                       for twin, (_, twin_uri) in twins.items()]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            row["twin"] = results
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        for proc in processes:
            proc.kill()
    lines = ["| policy | sim nominal | sim perturbed | sim perturbed + noise | twin perturbed | twin perturbed + noise | "
             "control rate (Hz, target 20) | loop jitter p50 / p99 (ms) | round trip p50 / p95 / p99 (ms) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = r["twin"]["perturbed"]
        lines.append(f"| {r['policy']} | {r['sim']['nominal']:.3f} | {r['sim']['perturbed']:.3f} | "
                     f"{r['sim']['perturbed+noise']:.3f} | {t['success']:.3f} | {r['twin']['perturbed+noise']['success']:.3f} | "
                     f"{t['loop']['rate_hz']:.2f} | {t['loop']['jitter_ms_p50']:.1f} / {t['loop']['jitter_ms_p99']:.1f} | "
                     f"{t['round_trip_ms']['p50']:.2f} / {t['round_trip_ms']['p95']:.2f} / {t['round_trip_ms']['p99']:.2f} |")
    lines += ["", f"Sim: {args.sim_episodes} fresh episodes, batched. Twin: {args.twin_episodes} episodes each, real time, "
              f"through `roborl serve` (ONNX). Perturbed: {PERTURBED}; + noise: obs_noise 0.005."]
    write_results("deploy", "Sim-to-real on Push: domain randomization, ONNX, policy server, digital twins", lines,
                  {"rows": rows, "twins": TWINS}, seeds=SEEDS, curves=curves, plot_title="Push: eval success while training")


if __name__ == "__main__":
    main()
