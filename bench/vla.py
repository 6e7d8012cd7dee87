"""VLA fine-tuning on LangTabletop (reach a named ball, push a named cube in a named direction, lift a named
cube; 64×64 images, instructions, proprio): SFT of each family on scripted demos, then PPO and GRPO from
the SFT checkpoint, and (`--algorithms ... residual_ppo`) residual PPO on the frozen SFT VLA. Every stage
runs as its own `roborl` process, so its peak memory is that process's.

`--families flow_vla_fewshot` runs pi0's recipe: the flow VLA's SFT backbone (`sft_flow_vla`, run first)
under a new flow expert cloned from 15 demos, then PPO and GRPO of the expert on the frozen features.
`--families token_vla_fewshot` does the same with a new action-token decoder cloned from 60 demos.

`--families flow_state` runs the flow VLA's action expert and RL code on the same tasks with privileged
state (objects, goal, task one-hot) instead of image and instruction: what RL adds there is what it can add
on these tasks once perception and grounding are solved, the headroom the VLAs' RL gains compare against.

Prints, per family and algorithm, the success of the SFT start and of the RL result on each task and on
their average (deterministic eval, `--episodes` fresh episodes per task), with the env steps, wall time,
peak memory and rollout frames/s of each stage. Writes `docs/results/vla.{md,json}`, keeping the rows of
earlier calls that this one did not measure (each row names the command and date that measured it).

Usage: python bench/vla.py [--run-dir runs/vla] [--episodes 50]
                           [--families flow_vla token_vla flow_vla_fewshot token_vla_fewshot flow_state]
                           [--algorithms ppo grpo residual_ppo] [--seeds 0 1 2] [--jobs 2] [--reuse] [key=value ...]
`--seeds` trains each RL stage once per seed from the one SFT (`--jobs` of them side by side) and reports the mean
and 95% CI over the seeds per task. `--families pi0_tabletop` runs pi0 (transformers' PI0ForConditionalGeneration),
`--families smolvla_tabletop` LeRobot's SmolVLA (its demos kept as a LeRobot v3 dataset).
`--reuse` keeps every stage whose run already finished. Overrides go to every stage (e.g. train.threads=2).
On 2 CPU cores, one VLA family per bench (two benches side by side): demos (900 episodes) ≈ 3 min, SFT ≈ 4
min, each RL run 15–25 min (its config's train.max_minutes or total_steps), each per-task evaluation (150
episodes) ≈ 1 min. flow_vla_fewshot: its SFT ≈ 2 min after sft_flow_vla's (token_vla_fewshot: ≈ 5 min),
each RL run 50–100 min (2.4M steps; the token runs take longest). flow_state: demos ≈ 10 s, SFT ≈ 30 s,
each RL run 10 min.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from study import RESULTS, hardware, pretraining_stage, record_vla_demos, run_stage, side_by_side, write_results
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from roborl.config import load_config
from roborl.errors import UserError
from roborl.run_dir import write_json

ROOT = Path(__file__).resolve().parents[1]
EPISODES = 50  # eval episodes per task
TASKS = {name: f"mujoco/LangTabletopFixed-{name.capitalize()}" for name in ("reach", "push", "lift")}


def frames_per_second(run: Path) -> float | None:
    """Mean rollout rate (env frames rendered and stepped per second of collection) from TensorBoard."""
    acc = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    if "train/collect_sps" not in acc.Tags()["scalars"]:
        return None
    values = [e.value for e in acc.Scalars("train/collect_sps")]
    return sum(values) / len(values)


def per_task(checkpoints: list[Path], out: Path, episodes: int, log: Path) -> dict[str, dict]:
    """Success per task and on their average: the mean over the checkpoints (training seeds) and, from two
    seeds on, its 95% bootstrap CI (roborl/stats.py, through `roborl eval`)."""
    if not (out / "eval.json").exists():
        run_stage(["eval", *map(str, checkpoints), "--tasks", *TASKS.values(), "--episodes", str(episodes),
                   "--envs", str(min(episodes, 50)), "--no-video", "--out", str(out)], log)
    report = json.loads((out / "eval.json").read_text())
    scores = {name: report["tasks"][task]["success"] for name, task in TASKS.items()}
    scores["average"] = report["aggregate"]["success"]
    return scores


def stage(name: str, command: list[str], runs: Path, reuse: bool) -> dict:
    """Runs (or, with --reuse, keeps) one training stage; its summary plus the process measurements."""
    run = runs / name
    measured = run / "bench_stage.json"
    if reuse and measured.exists():
        return json.loads(measured.read_text())
    print(f"running {name} ...", flush=True)
    info = run_stage(command, runs / f"{name}.log")
    summary = json.loads((run / "summary.json").read_text())
    info.update(env_steps=summary.get("env_steps", 0), wall_s=summary["wall_time_s"],
                frames_per_s=frames_per_second(run), best=summary.get("best_success_rate"))
    write_json(measured, info)
    return info


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", default="runs/vla")
    p.add_argument("--episodes", type=int, default=EPISODES, help="eval episodes per task")
    p.add_argument("--families", nargs="+", default=["flow_vla", "token_vla"])
    p.add_argument("--algorithms", nargs="*", default=["ppo", "grpo"],
                   help="ppo, grpo (fine-tune the VLA), residual_ppo (a residual on the frozen VLA); "
                        "the flag with no names: SFT only")
    p.add_argument("--reuse", action="store_true")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds of each RL stage (train.seed)")
    p.add_argument("--jobs", type=int, default=1, help="RL seeds trained side by side (each on one thread)")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args()
    for names in (a.families, a.algorithms):  # `--families token_vla key=value` also swallows the overrides
        a.overrides += [n for n in names if "=" in n]
        names[:] = [n for n in names if "=" not in n]
    for family in a.families:  # every stage's config, before any stage runs
        for config in [f"sft_{family}", *(f"{alg}_{family}" for alg in a.algorithms)]:
            if not (ROOT / f"configs/{config}.yaml").exists():
                raise SystemExit(f"bench/vla.py: there is no configs/{config}.yaml; give --families among those "
                                 "with an sft_<family>.yaml and --algorithms among ppo, grpo, residual_ppo (the "
                                 "flag alone: SFT only)")
    runs = Path(a.run_dir).resolve()
    runs.mkdir(parents=True, exist_ok=True)
    common = [f"train.run_dir={runs}", "train.progress=false", *a.overrides]
    rows = []
    measured = {"command": shlex.join(["python", "bench/vla.py", *sys.argv[1:]]),
                "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "episodes": a.episodes,
                "hardware": hardware()}
    for family in a.families:
        sft_name = f"sft_{family}"
        try:
            sft_cfg = load_config(ROOT / f"configs/{sft_name}.yaml")
        except UserError as exc:
            raise SystemExit(f"bench/vla.py: family '{family}': {exc}") from None
        demos = record_vla_demos(runs, "rgb" in sft_cfg.env.obs_mode,  # flow_state: state only
                                 lerobot=sft_cfg.policy.kind == "lerobot")
        start = []
        if pre := pretraining_stage(sft_cfg.policy.init):  # flow_vla_fewshot: the backbone of sft_flow_vla
            stage(pre, ["bc", f"configs/{pre}.yaml", f"bc.demos={demos}", *common], runs, a.reuse)
            start = [f"policy.init={runs / pre / 'checkpoints' / 'best.safetensors'}"]
        sft = stage(sft_name, ["bc", f"configs/{sft_name}.yaml", f"bc.demos={demos}", *start, *common], runs,
                    a.reuse)
        sft_ckpt = runs / sft_name / "checkpoints" / "best.safetensors"
        sft_scores = per_task([sft_ckpt], runs / f"eval_{sft_name}", a.episodes, runs / f"eval_{sft_name}.log")
        print(f"{sft_name}: " + ", ".join(f"{task} {score['mean']:.2f}" for task, score in sft_scores.items()))
        for algorithm in a.algorithms:
            config = f"{algorithm}_{family}"
            start = "residual.base" if algorithm.startswith("residual") else "policy.init"  # the SFT VLA frozen
            names = [config if len(a.seeds) == 1 else f"{config}_seed{seed}" for seed in a.seeds]
            with ThreadPoolExecutor(a.jobs) as pool:
                stages = list(pool.map(lambda name, seed: stage(name, [
                    "train", f"configs/{config}.yaml", f"{start}={sft_ckpt}", f"train.seed={seed}",
                    f"train.name={name}", *common, *side_by_side(a.jobs)], runs, a.reuse), names, a.seeds))
            last = [runs / name / "checkpoints" / "last.safetensors" for name in names]  # best may be the start
            rl_scores = per_task(last, runs / f"eval_{config}", a.episodes, runs / f"eval_{config}.log")
            rows.append({"family": family, "algorithm": algorithm, "sft": sft_scores, "rl": rl_scores,
                         "sft_stage": sft, "rl_stages": stages, "measured": measured})
    if not rows:
        print("SFT only: docs/results/vla.md is kept as it was")
        return
    rows = merged_with_earlier(rows, a.episodes)
    seeds = "1 SFT per family; RL training seeds as each row says"
    lines = markdown(rows, a.episodes).splitlines()
    machines = {row["measured"].get("hardware") for row in rows} - {None}
    write_results("vla", "VLA fine-tuning on LangTabletop: SFT, then RL", lines, {"rows": rows}, seeds=seeds,
                  machines="as each row's command says: " + "; ".join(sorted(machines)) if len(machines) > 1 else "")


def merged_with_earlier(rows: list[dict], episodes: int) -> list[dict]:
    """This call's rows beside the rows (family, RL algorithm) an earlier call measured with as many eval episodes
    and this one did not (docs/results/vla.json), so the page grows a family at a time; each row keeps the command
    and date that measured it."""
    earlier = RESULTS / "vla.json"
    if not earlier.is_file():
        return rows
    data = json.loads(earlier.read_text())
    mine = {}
    for row in data["rows"]:
        row.setdefault("measured", {"command": data["meta"]["command"], "date": data["meta"]["date"],
                                    "episodes": episodes_of(data["meta"]["command"]),
                                    "hardware": data["meta"]["hardware"]})
        if row["measured"]["episodes"] == episodes:
            mine[row["family"], row["algorithm"]] = row
    mine.update({(row["family"], row["algorithm"]): row for row in rows})
    return list(mine.values())


def episodes_of(command: str) -> int:
    """The eval episodes per task of a bench/vla.py command line (the default where it gives none)."""
    words = shlex.split(command)
    return int(words[words.index("--episodes") + 1]) if "--episodes" in words else EPISODES


def markdown(rows: list[dict], episodes: int) -> str:
    names = [*TASKS, "average"]
    head = ("| family | RL | " + " | ".join(f"{n} SFT → RL" for n in names) +
            " | RL seeds | RL env steps | SFT / RL wall | SFT / RL peak memory | rollout frames/s | measured |")
    title = (f"Success rates, deterministic, {episodes} episodes per task: SFT `best` → RL `last` (from SFT `best`); "
             "with several RL seeds, their mean [95% CI] and the gain of the mean in points.")
    lines = [title, "", head,
             "|" + "---|" * (len(names) + 8)]

    def cell(sft: dict, rl: dict) -> str:
        ci = f" [{rl['ci95'][0]:.2f}, {rl['ci95'][1]:.2f}]" if rl.get("ci95") else ""
        return f"{sft['mean']:.2f} → {rl['mean']:.2f}{ci} ({100 * (rl['mean'] - sft['mean']):+.0f})"

    for r in rows:
        s, stages = r["sft_stage"], r["rl_stages"]
        mean = {k: sum(st[k] or 0 for st in stages) / len(stages) for k in ("env_steps", "wall_s", "peak_mib",
                                                                            "frames_per_s")}
        fps = f"{mean['frames_per_s']:.0f}" if mean["frames_per_s"] else "n/a"
        lines.append(f"| {r['family']} | {r['algorithm']} | " + " | ".join(cell(r['sft'][n], r['rl'][n]) for n in names) +
                     f" | {len(stages)} | {mean['env_steps']:,.0f} | {s['wall_s'] / 60:.1f} / {mean['wall_s'] / 60:.1f} min"
                     f" | {s['peak_mib']:.0f} / {mean['peak_mib']:.0f} MiB | {fps} | {r['measured']['date'][:10]} |")
    measured_by = {}
    for r in rows:
        on = f" (on {r['measured']['hardware']})" if "hardware" in r["measured"] else ""
        measured_by.setdefault(f"`{r['measured']['command']}`{on}", []).append(f"{r['family']} {r['algorithm']}")
    lines += ["", "Each row again (with `--reuse`, the stages that had finished in its run directory were kept; each row's "
              "wall times, memory and frame rates are those of its own runs, on the machine named):", ""]
    lines += [f"- {', '.join(labels)}: {command}" for command, labels in measured_by.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
