"""Recipe cards: every shipped recipe (configs/*.yaml) trained over several training seeds, each seed in its own
`roborl train` process (`--jobs` of them side by side, as bench/vla.py trains its seeds).

Prints and writes one row per recipe: its final deterministic eval success (the last eval of each run) as IQM and
mean with 95% bootstrap CIs over the seeds (roborl/stats.py), how many seeds reached the recipe's success threshold
within its time budget, the median env steps and minutes to it, and every seed's own final success. A recipe that
starts from a BC or SFT checkpoint (`policy.init` / `residual.base: runs/<stage>/checkpoints/...`, or
`runs/<stage>/pretrained`: that checkpoint exported as a LeRobot directory) gets it first, as bench/flow_rl.py and
bench/vla.py do: scripted demos, then `roborl bc configs/<stage>.yaml` (and `roborl export`), trained once with
seed 0 and shared by all seeds. A recipe whose simulator or device is missing here is listed as not run. Writes
`docs/results/recipes.{md,json,png}` (the png: mean final success per recipe).

Usage: python bench/recipes.py [--recipes NAME ...] [--run-dir runs/recipes] [--jobs 2] [--reuse]
       [--only-seeds S ...] [--seeds N] [--max-minutes M]   (--seeds and --max-minutes for smoke tests only: the
       page says so)
       python bench/recipes.py --recipes NAME ... --rescore   (trains nothing: the rows again from the runs the
       page's JSON holds, against the bars RECIPES states now)
A card longer than one sitting is measured in parts: `--only-seeds 0 1` now, `--only-seeds 2` later. Each part
trains the recipe's prerequisites again and takes the other seeds from docs/results/recipes.json only where they
started from the same prerequisite weights (a sha256 of their tensors) and the same config; the row says which
seeds are still to run until all are in. Trained twice on one machine a prerequisite comes out bit-identical; on
another machine it may not (same code, config, torch and MuJoCo, other weights), and the later part is then refused:
the card is trained again in one call. A few-shot VLA card's three 120-minute seeds fit one call of about 2.2 hours
with --jobs 3 (the row then says 3 runs at a time: each seed shared the 2 cores with two others).
Each seed runs at most its recipe's budget (RECIPES: 10–40 minutes for the MuJoCo recipes, 10–120 for the VLA
ones, 75 for ManiSkill's PushCube), and most end sooner at their `train.total_steps` or `train.stop_at_success`.
All of them on 2 CPU cores: at most about 31 hours for the MuJoCo recipes (5 seeds), 36 for the VLA ones and 5
for ManiSkill's (3 seeds) with --jobs 1, fewer with --jobs 2; each BC or SFT prerequisite adds minutes. Keep
--jobs at most the number of cores where the time allows: on one 2-core machine three rgb VLA runs made 20% fewer env
steps per second together than two (each run's rendering threads and its torch thread then wait for each other's
cores); with --jobs 3 on another, each of grpo_token_vla_fewshot's seeds made 1.56M env steps in its 120 minutes,
where two at a time had made 1.8M. The few-shot VLA recipes take longest: 3 seeds of 2.4M env steps, with --jobs 2
about 130 minutes of both cores for grpo_flow_vla_fewshot after its SFT prerequisites (about 10 minutes), more for
the token VLA's.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import shlex
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

import torch
from study import (
    PRETRAINED,
    RESULTS,
    TRAINED_WITH,
    first_reaching,
    median_to,
    pretraining_stage,
    record_vla_demos,
    run_once,
    run_stage,
    train_runs,
    train_stage,
    write_results,
)

from roborl.checkpoint import Checkpoint
from roborl.config import Config, load_config
from roborl.demos import record_demos
from roborl.demos_hdf5 import demos_file
from roborl.stats import summarize


class Recipe(NamedTuple):
    seeds: int  # training seeds 0 .. seeds-1
    threshold: float | None  # the eval success the documentation says the recipe reaches; None: it states none
    minutes: float  # the time budget of each seed (train.max_minutes)


# Budgets are the config's train.max_minutes unless said otherwise. Thresholds: the targets the recipes are held
# to, or what the documentation's results pages say they reach.
RECIPES: dict[str, Recipe] = {
    "ppo_reach": Recipe(5, 0.80, 10),  # tests/test_training.py: >= 0.8 after 80k of its 300k steps
    "ppo_push": Recipe(5, 0.90, 20),
    "ppo_pickplace": Recipe(5, 0.80, 15),  # the target: >= 0.80 within 15 minutes
    "ppo_stack": Recipe(5, 0.80, 30),  # the target: >= 0.80 within 30 minutes
    "ppo_reachavoid": Recipe(5, 0.95, 10),  # docs/results/shield.md: 1.000; no max_minutes, docs/guides/safety.md:
    #                                         "about 3 minutes per run on 2 CPU cores"
    "ppo_shielded_reachavoid": Recipe(5, 0.95, 10),  # shield.md: 0.987; budget as ppo_reachavoid
    "ppo_lagrangian_reachavoid": Recipe(5, 0.95, 15),  # shield.md: 1.000; no max_minutes, 1M steps (2.5x the others')
    "rm_sequence": Recipe(5, 0.90, 20),  # docs/results/reward_machines.md: 1.000, >= 90% after 704k steps (1.5 min)
    "ppo_sequence_sparse": Recipe(5, 0.90, 20),  # rm_sequence's bar; reward_machines.md: 0.000 in 2M steps, so the
    #                                              card shows how many seeds learn the sparse task at all
    "hrm_tour_options": Recipe(5, 0.80, 10),  # docs/results/hrm.md: 1.00 [1.00, 1.00], 3/3 seeds >= 80% (128k steps)
    "hrm_tour_ltlf": Recipe(5, 0.80, 10),  # hrm_tour_options' bar: the same hierarchy, split from the formula
    "hrm_errands_options": Recipe(5, 0.80, 10),  # docs/results/hrm_choice.md: 3/3 seeds >= 80% (128k steps)
    "hrm_tour_options_sac": Recipe(5, 0.80, 15),  # docs/results/hrm_variants.md: 0.97 [0.95, 1.00], 3/3 seeds >= 80%
    #                                               (80k of its 150k steps)
    "hrm_tour_flat": Recipe(5, 0.80, 10),  # hrm.md: 0.94 [0.91, 0.97], 3/3 seeds >= 80% (832k steps)
    "ppo_tour_sparse": Recipe(5, 0.80, 10),  # hrm_tour_options' bar; hrm.md: 0.00 on 3 seeds (the sparse baseline)
    "mappo_two_arms": Recipe(3, 0.90, 10),  # docs/results/two_arms.md (300k steps, 3 seeds per shield setting)
    "ppo_push_dr": Recipe(5, 0.90, 40),
    "dppo_push": Recipe(5, 0.90, 25),  # bench/flow_rl.py and docs/guides/generative-rl.md: each mode to >= 90%
    "flow_noise_push": Recipe(5, 0.90, 20),  # as dppo_push
    "flow_sde_push": Recipe(5, 0.90, 20),  # as dppo_push
    "fpo_push": Recipe(5, 0.90, 25),  # the target: >= 0.90
    "residual_ppo_pickplace": Recipe(5, 0.95, 30),  # docs/guides/residual.md measures steps to 90% and 95%; its
    #                                                 stop_at_success 0.96
    "residual_sac_pickplace": Recipe(5, 0.95, 30),  # as residual PPO; stop_at_success 0.99
    "residual_ppo_push_bcflow": Recipe(5, 0.90, 30),  # the other Push recipes' bar (no page states one for it)
    "residual_act_pickplace": Recipe(5, 0.95, 30),  # residual_ppo_pickplace's bar; its stop_at_success 0.96
    "ppo_pi0_tabletop": Recipe(3, 0.45, 20),  # docs/results/vla.md: RL average 0.47 [0.45, 0.48]; threshold: the
    #                                           CI's lower end rounded down to 0.05
    "grpo_pi0_tabletop": Recipe(3, 0.45, 20),  # vla.md: 0.46 [0.45, 0.47]
    "ppo_smolvla_tabletop": Recipe(3, 0.35, 20),  # vla.md: 0.40 [0.37, 0.42]
    "grpo_smolvla_tabletop": Recipe(3, 0.35, 20),  # vla.md: 0.40 [0.38, 0.43]
    # The flow and token VLAs' bars: what docs/guides/vla.md says they reach, from their first cards (3 seeds): the
    # lower end of the mean's 95% CI rounded down to 0.05, as for pi0 (flow: 0.50, 0.54, 0.52; token: 0.27, 0.25, 0.29)
    "ppo_flow_vla": Recipe(3, 0.50, 20),
    "grpo_flow_vla": Recipe(3, 0.50, 20),
    "residual_ppo_flow_vla": Recipe(3, 0.50, 20),
    "ppo_token_vla": Recipe(3, 0.25, 25),
    "grpo_token_vla": Recipe(3, 0.25, 25),
    "residual_ppo_token_vla": Recipe(3, 0.25, 20),
    "ppo_flow_vla_fewshot": Recipe(3, 0.50, 120),  # as the VLAs' bars, from its first card: 0.56 [0.52, 0.58]
    "grpo_flow_vla_fewshot": Recipe(3, 0.55, 120),  # 0.58 [0.56, 0.60]
    "ppo_token_vla_fewshot": Recipe(3, 0.45, 120),  # 0.54 [0.46, 0.58]
    "grpo_token_vla_fewshot": Recipe(3, 0.50, 120),  # 0.55 [0.52, 0.58] over its first two seeds (a third, measured
    #                                                  apart, started from other SFT weights: module docstring)
    "ppo_flow_state": Recipe(3, 0.70, 10),  # as the VLAs' bars, from its first card: 0.75 [0.73, 0.77]
    "grpo_flow_state": Recipe(3, 0.50, 10),  # 0.60 [0.52, 0.67]
    "ppo_maniskill_pushcube": Recipe(3, 0.90, 75),  # docs/guides/simulators.md: stops at 90% or after 75 minutes
    "ppo_maniskill_pickcube_gpu": Recipe(3, 0.95, 30),  # its stop_at_success (ManiSkill's baseline settings); no
    #                                                    max_minutes: 30 bounds 50M steps on one GPU
}
# Baselines: the task's own sparse reward without the reward machine of the recipe named, carded against that
# recipe's bar to show how many seeds learn the task without it (the page says so beside the table).
BASELINES = {"ppo_sequence_sparse": "rm_sequence", "ppo_tour_sparse": "hrm_tour_options"}
# Not in the table: the configs of NOT_CARDS, and bc_* and sft_* (prerequisites, trained here).
NOT_CARDS = {"ppo_gym_pusher": "Gymnasium's Pusher-v5 reports no success",
             "hil_sac_push": "real-world RL in real time on the twin, measured by bench/real_world_rl.py",
             "hil_sac_franka_reach": "real-world RL on a Franka or franky-sim, in real time"}
ROOT = Path(__file__).resolve().parents[1]
DEMO_EPISODES = 200  # scripted demos of a state-based BC prerequisite, as bench/flow_rl.py records them


def unavailable(cfg: Config) -> str | None:
    """Why the recipe cannot run on this machine (ManiSkill does not import, no CUDA GPU), or None."""
    if cfg.train.device.startswith("cuda") and not torch.cuda.is_available():
        return f"needs a CUDA GPU (train.device: {cfg.train.device})"
    if cfg.env.id.startswith("maniskill/"):
        check = subprocess.run([sys.executable, "-c", "import mani_skill.envs"], capture_output=True, text=True)
        if check.returncode != 0:
            last = (check.stderr.strip().splitlines() or [f"exit code {check.returncode}"])[-1]
            return f"ManiSkill does not import ({last})"
    return None


def demos_for(cfg: Config, runs: Path) -> Path:
    """The demos a BC / SFT stage learns from, recorded once per run dir: as bench/vla.py for the LangTabletop
    SFTs, as bench/flow_rl.py (the task's scripted expert, DEMO_EPISODES episodes) for the others."""
    if cfg.env.id.startswith("mujoco/LangTabletop"):
        return record_vla_demos(runs, "rgb" in cfg.env.obs_mode, lerobot=cfg.policy.kind == "lerobot")
    demos = runs / f"demos_{cfg.env.id.split('/')[-1].lower()}"
    if not demos_file(demos).is_file():
        print(record_demos(cfg.env.id, DEMO_EPISODES, demos, progress=False), flush=True)
    return demos


def stages_of(cfg: Config) -> list[str]:
    """The stages a config starts from: those its `policy.init` and `residual.base` name."""
    return [stage for value in (cfg.policy.init, cfg.residual.base) if (stage := pretraining_stage(value))]


def start_from(cfg: Config, runs: Path, reuse: bool, common: list[str], trained: dict[str, dict]) -> list[str]:
    """Overrides pointing `policy.init` / `residual.base` at the stage they name, trained first in `runs`."""
    starts = []
    for key, value in (("policy.init", cfg.policy.init), ("residual.base", cfg.residual.base)):
        if stage := pretraining_stage(value):
            start = prerequisite(stage, runs, reuse, common, trained)
            if Path(value).name == PRETRAINED:
                start = exported(start, runs / stage / PRETRAINED)
            starts.append(f"{key}={start}")
    return starts


def exported(checkpoint: Path, out: Path) -> Path:
    """The checkpoint in its library's own format (`roborl export --format pretrained`: a LeRobot directory for an
    ACT base), written anew from it."""
    shutil.rmtree(out, ignore_errors=True)
    run_stage(["export", str(checkpoint), "--format", "pretrained", "--out", str(out)], out.with_suffix(".log"))
    return out


def prerequisite(stage: str, runs: Path, reuse: bool, common: list[str], trained: dict[str, dict]) -> Path:
    """BC / SFT stage `stage` (seed 0 of configs/<stage>.yaml, after its own prerequisite, on its demos), trained
    once per call of the bench and shared by every seed of every recipe that starts from it; its best checkpoint."""
    if stage not in trained:
        cfg = load_config(ROOT / "configs" / f"{stage}.yaml", common)
        args = ["bc", f"configs/{stage}.yaml", f"bc.demos={demos_for(cfg, runs)}",
                *start_from(cfg, runs, reuse, common, trained), *common, "train.seed=0", f"train.name={stage}"]
        print(f"prerequisite {stage} ...", flush=True)
        trained[stage] = {**run_once(runs, stage, reuse, lambda: train_stage(args, runs, stage)),
                          "starts_from": stages_of(cfg)}
    return runs / stage / "checkpoints" / "best.safetensors"


def with_own_prerequisites(stages: list[str], trained: dict[str, dict]) -> list[str]:
    """The stages, each after the stages it was trained from in turn, as `prerequisite` recorded them
    (sft_flow_vla_fewshot after sft_flow_vla)."""
    chain: list[str] = []
    for stage in stages:
        before = with_own_prerequisites(trained[stage]["starts_from"], trained)
        chain += [name for name in [*before, stage] if name not in chain]
    return chain


class SeedRun(NamedTuple):
    config: str
    seed: int
    minutes: float  # its train.max_minutes
    start: list[str]  # the overrides that point it at its prerequisites

    @property
    def name(self) -> str:
        """Its run's train.name, the folder of its summary under --run-dir."""
        return f"{self.config}_seed{self.seed}"

    @property
    def args(self) -> list[str]:
        """Its `roborl train` arguments (study.train_runs adds the run folder, name and threads)."""
        return [f"configs/{self.config}.yaml", *self.start, f"train.seed={self.seed}",
                f"train.max_minutes={self.minutes:g}"]


def finished_on(runs: Path, name: str) -> str:
    """The UTC date the run wrote its summary: when it was measured, also where --reuse takes it from an earlier
    call."""
    return datetime.fromtimestamp((runs / name / "summary.json").stat().st_mtime, UTC).strftime("%Y-%m-%d")


def weights_fingerprint(checkpoint: Path) -> str:
    """sha256 of a checkpoint's policy weights (names, dtypes, shapes and bytes, in name order): the same for a
    prerequisite trained again to the same weights, whatever its run folder, wall time or metadata say."""
    digest = hashlib.sha256()
    weights = Checkpoint(checkpoint).policy_state
    for name in sorted(weights):
        tensor = weights[name].contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def origin(config: str, runs: Path, stages: list[str]) -> dict:
    """What a recipe's seeds start from: its config file and the weights of each prerequisite. Seeds measured in
    different calls belong to one card only where these are equal."""
    text = (ROOT / "configs" / f"{config}.yaml").read_bytes()
    return {"config_sha256": hashlib.sha256(text).hexdigest(),
            "start": {stage: weights_fingerprint(runs / stage / "checkpoints" / "best.safetensors")
                      for stage in stages}}


def page_data(results: Path = RESULTS) -> dict:
    """The page's JSON as the last call wrote it ({} before the first)."""
    data = results / "recipes.json"
    return json.loads(data.read_text()) if data.is_file() else {}


def page_runs(config: str, results: Path = RESULTS) -> list[dict]:
    """The seeds' runs the page's JSON holds for `config`."""
    return [run for row in page_data(results).get("rows", []) if row["recipe"] == config for run in row.get("runs", [])]


def trained_with(runs: Path, run: SeedRun, measured: str, results: Path = RESULTS) -> dict:
    """How and where a seed's run was trained (the runs side by side, the software, the machine), as `train_runs`
    wrote it beside the run; for a run trained before it did, as the page's JSON recorded it then (same seed, same
    date); {} if neither. A run --reuse takes keeps these, not the reusing call's."""
    path = runs / run.name / TRAINED_WITH
    if path.is_file():
        return json.loads(path.read_text())
    return next(({key: earlier[key] for key in ("jobs", "software", "hardware") if key in earlier}
                 for earlier in page_runs(run.config, results)
                 if earlier["seed"] == run.seed and earlier.get("measured") == measured), {})


def differs(then: dict, now: dict) -> str:
    """What a run's recorded start (`origin`) has that `now` has not: each prerequisite's other weights, the config."""
    before = then.get("start", {})
    parts = [f"{stage} {before.get(stage, 'none')[:8]}… then, {weights[:8]}… now"
             for stage, weights in now["start"].items() if before.get(stage) != weights]
    return "; ".join(parts + (["another config"] if then.get("config_sha256") != now["config_sha256"] else []))


def earlier_runs(config: str, start: dict, seeds: list[int], results: Path = RESULTS) -> list[dict]:
    """The runs of `seeds` the page's JSON holds for `config`, refused in one line where they started from other
    weights or another config than `start` (their prerequisites were trained again to other weights, or the config
    changed): such seeds do not make one card."""
    runs = [run for run in page_runs(config, results) if run["seed"] in seeds]
    if other := [run for run in runs if run.get("origin") != start]:
        raise SystemExit(f"{results / 'recipes.json'}'s seed(s) {', '.join(str(run['seed']) for run in other)} of "
                         f"{config} did not start from the prerequisite weights and config this call starts from "
                         f"({differs(other[0].get('origin') or {}, start)}): train all its seeds in one call, without "
                         "--only-seeds (prerequisites trained again on another machine can come out as other weights)")
    return runs


def run_record(seed: int, summary: dict, **extra: object) -> dict:
    """One seed's run as the page's JSON keeps it."""
    return {"seed": seed, "final_success": summary["success_rate"], "best_success": summary["best_success_rate"],
            "env_steps": summary["env_steps"], "minutes": summary["wall_time_s"] / 60,
            "eval_history": summary["eval_history"], **extra}


def card(config: str, recipe: Recipe, runs: list[dict]) -> dict:
    """A recipe's row from its seeds' runs (run_record): final success over the seeds, seeds reaching the threshold,
    medians to it, each seed's run, and the recipe's seeds not measured yet."""
    runs = sorted(runs, key=lambda run: run["seed"])
    seeds = [run["seed"] for run in runs]
    finals = [run["final_success"] for run in runs]
    reached = [first_reaching(run["eval_history"], recipe.threshold) if recipe.threshold is not None else None
               for run in runs]
    steps, seconds = median_to(reached, 0), median_to(reached, 1)
    jobs = sorted({run["jobs"] for run in runs if "jobs" in run})
    return {"recipe": config, "config": f"configs/{config}.yaml", "seeds": seeds, "threshold": recipe.threshold,
            "budget_minutes": recipe.minutes, **summarize([finals]), "final_success": finals,
            "reached": sum(r is not None for r in reached) if recipe.threshold is not None else None,
            "median_env_steps_to_threshold": steps,
            "median_minutes_to_threshold": seconds / 60 if seconds is not None else None,
            **({"measured": max(run["measured"] for run in runs)} if all("measured" in run for run in runs) else {}),
            **({"jobs": jobs[0] if len(jobs) == 1 else ", ".join(str(run["jobs"]) for run in runs)} if jobs else {}),
            "missing_seeds": [seed for seed in range(recipe.seeds) if seed not in seeds],
            "runs": [{**run, "env_steps_to_threshold": r[0] if r else None,
                      "minutes_to_threshold": r[1] / 60 if r else None} for run, r in zip(runs, reached)]}


def rescored(configs: list[str], results: Path = RESULTS) -> list[dict]:
    """The rows of `configs` scored again from the runs the page's JSON holds, against RECIPES' bars as they are now
    (a bar stated after its seeds ran), each with the prerequisites it started from; nothing is trained."""
    rows = {row["recipe"]: row for row in page_data(results).get("rows", [])}
    if missing := [config for config in configs if not rows.get(config, {}).get("runs")]:
        raise SystemExit(f"{results / 'recipes.json'} holds no runs of {', '.join(missing)}: measure them first "
                         f"(python bench/recipes.py --recipes {' '.join(missing)})")
    derived = ("env_steps_to_threshold", "minutes_to_threshold")  # card() works these out again from the new bar
    return [{**card(config, RECIPES[config], [{k: v for k, v in run.items() if k not in derived}
                                              for run in rows[config]["runs"]]),
             "prerequisites": rows[config].get("prerequisites", {})} for config in configs]


def prerequisite_evals(evals: dict[str, list[str]]) -> str:
    """A stage's best eval, or its evals with the recipes that started from each where calls trained it apart."""
    if len(evals) == 1:
        return next(iter(evals))
    return "; ".join(f"{best} for {', '.join(recipes)}" for best, recipes in evals.items())


def interval(point: float | None, ci: list[float] | None) -> str:
    if point is None:
        return "— (from 5 seeds)"
    return f"{point:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def seeds_label(row: dict) -> str:
    """How many seeds a row holds: "3", or "1 of 3" while some are still to be measured."""
    missing = row.get("missing_seeds", [])
    return f"{len(row['seeds'])} of {len(row['seeds']) + len(missing)}" if missing else f"{len(row['seeds'])}"


def machine(hardware: str) -> str:
    """A machine as a row names it: its CPU (and its GPU where it has one), without the trademark signs."""
    cpu, *_, gpu = hardware.split(", ")
    return re.sub(r"\((R|TM)\)", "", cpu) + ("" if gpu == "no GPU" else f" + {gpu}")


def machines(row: dict) -> str:
    """The machines a row's seeds trained on (— for a run that did not record its machine)."""
    return ", ".join(dict.fromkeys(machine(run["hardware"]) if "hardware" in run else "—"
                                   for run in row.get("runs", []))) or "—"


def machines_line(rows: list[dict]) -> str:
    """The page's hardware line: each machine the rows name, in full."""
    runs = [run for row in rows for run in row.get("runs", [])]
    named = [f"{machine(h)} = {h}" for h in dict.fromkeys(run["hardware"] for run in runs if "hardware" in run)]
    unnamed = ["— = not recorded"] if any("hardware" not in run for run in runs) else []
    return "each row's `machine`: " + "; ".join(named + unnamed)


def table_row(row: dict) -> str:
    budget = f"{row['budget_minutes']:g} min"
    threshold = f"≥ {row['threshold']:.2f} in {budget}" if row["threshold"] is not None else f"none stated ({budget})"
    head = (f"| {row['recipe']} | {row.get('measured', '—')} | {machines(row)} | {row.get('jobs', '—')} | "
            f"{seeds_label(row)} | {threshold}")
    if "not_run" in row:
        return head + f" | not run: {row['not_run']} | — | — | — | — | — |"
    reached = f"{row['reached']}/{len(row['seeds'])}" if row["reached"] is not None else "—"
    steps = row["median_env_steps_to_threshold"]
    minutes = row["median_minutes_to_threshold"]
    return (head + f" | {reached} | {interval(row['iqm'], row['iqm_ci95'])} | {interval(row['mean'], row['ci95'])} | "
            f"{f'{steps:,.0f}' if steps is not None else '—'} | {f'{minutes:.1f}' if minutes is not None else '—'} | "
            + ", ".join(f"{s:.2f}" for s in row["final_success"]) + " |")


def side_by_side_as(row: dict) -> list[str]:
    """The --jobs a row's seeds ran with, where more than one: its minutes hold only with as many runs at a time."""
    return [f"--jobs={row['jobs']}"] if isinstance(row.get("jobs"), int) and row["jobs"] > 1 else []


def markdown(rows: list[dict], args: argparse.Namespace, trained: dict[str, dict]) -> list[str]:
    """The table, what its columns mean, the prerequisites, the command reproducing each row and what was not run."""
    lines = ["Final success: each run's last deterministic eval (`success_rate` of its summary.json, the config's "
             "`train.eval_episodes` episodes), with the IQM (from 5 seeds on) and the mean over the training seeds and "
             "their 95% percentile-bootstrap CIs (roborl/stats.py). Threshold: the eval success the documentation "
             "says the recipe reaches (— where it states none), within the budget every seed ran under "
             "(`train.max_minutes`). Reached: seeds whose eval reached the threshold. The medians count a seed that "
             "never reached it as never (— when the median seed did not); minutes are each run's wall time on the "
             "row's machine (the CPU its seeds trained on; the page's hardware line names each in full), with as "
             "many runs side by side as the row says (`--jobs`: runs at a time, each on one torch thread). Per-seed "
             "final success in the order of the seeds (0, 1, …).", "",
             "| recipe | measured | machine | runs at a time | seeds | threshold | reached (k/n) | final success IQM "
             "[95% CI] | mean [95% CI] | median env steps to threshold | median minutes to threshold | per-seed final "
             "success |", "|---|---|---|---|---|---|---|---|---|---|---|---|", *map(table_row, rows)]
    baselines = [f"{row['recipe']} (against {BASELINES[row['recipe']]})" for row in rows if row["recipe"] in BASELINES]
    if baselines:
        lines += ["", "Baselines, not recipes to use: " + ", ".join(baselines) + " train on the task's own sparse "
                  "reward, without the reward machine of the recipe in brackets, and are held to that recipe's bar, so "
                  "their row counts the seeds that learn the task without it."]
    started = [row for row in rows if row.get("median_env_steps_to_threshold") == 0]
    if started:
        lines += ["", "A median of 0 env steps to the threshold: the policy the recipe starts from (its BC / SFT "
                  "prerequisite, evaluated before the first update) already met it, so the row's threshold says "
                  "nothing of what RL adds; the start's eval success, per seed: " +
                  "; ".join(f"{row['recipe']} " + ", ".join(f"{run['eval_history'][0][2]:.2f}" for run in row["runs"])
                            for row in started) + "."]
    overridden = [f"`--seeds {args.seeds}` (the recipes' own: 5 or 3 seeds)" if args.seeds else "",
                  f"`--max-minutes {args.max_minutes:g}` for every run{', prerequisites included' if trained else ''} "
                  "instead of the recipes' budgets" if args.max_minutes else ""]
    if any(overridden):
        lines += ["", "**Overridden, so these numbers do not stand for the recipes:** " +
                  "; ".join(o for o in overridden if o) + "."]
    starts: dict[str, dict[str, list[str]]] = {}  # stage -> its best eval -> the recipes whose seeds started there
    for row in rows:
        for name, best in row.get("prerequisites", {}).items():
            starts.setdefault(name, {}).setdefault(f"{best:.2f}", []).append(row["recipe"])
    if starts:
        lines += ["", "Prerequisites, each trained once per call (`roborl bc`, seed 0 of its own config, on scripted "
                  "demos) and shared by all seeds of the recipes that start from it (`policy.init` or "
                  "`residual.base`; a base at `runs/<stage>/pretrained` is the stage's best checkpoint written by "
                  "`roborl export --format pretrained`); where calls trained a stage to different evals, the recipes "
                  "each started from: " + ", ".join(f"`{name}` (best eval {prerequisite_evals(evals)})"
                                                     for name, evals in starts.items()) + "."]
    extra = ([f"--seeds={args.seeds}"] if args.seeds else []) + ([f"--max-minutes={args.max_minutes:g}"]
                                                                 if args.max_minutes else [])
    lines += ["", "Each row again:", ""]
    again = {row["recipe"]: shlex.join(["python", "bench/recipes.py", "--recipes", row["recipe"], *extra,
                                        *side_by_side_as(row)]) for row in rows}
    lines += [f"- {name}: `{command}`" for name, command in again.items()]
    partial = [f"{row['recipe']}: seed {', '.join(map(str, row['missing_seeds']))} "
               f"(`python bench/recipes.py --recipes {row['recipe']} --only-seeds "
               f"{' '.join(map(str, row['missing_seeds']))}`)" for row in rows if row.get("missing_seeds")]
    if partial:
        lines += ["", "Not all seeds measured yet (a row of \"k of n\" seeds counts the seeds measured; its other "
                  "seeds join it when they have run from the same prerequisite weights and config; where the "
                  "prerequisites train to other weights, the whole card is trained again in one call): " +
                  "; ".join(partial) + "."]
    missing = [name for name in RECIPES if name not in {row["recipe"] for row in rows}]
    not_run = [f"{row['recipe']}: {row['not_run']}" for row in rows if "not_run" in row]
    if not_run:
        lines += ["", "Not run on this machine: " + "; ".join(not_run) + "."]
    lines += ["", "Not measured yet (each: `python bench/recipes.py --recipes NAME`): " +
              (", ".join(missing) if missing else "none") + ".",
              "Not recipe cards: " + "; ".join(f"{name} ({why})" for name, why in NOT_CARDS.items()) + "."]
    return lines


def merged_with_earlier(rows: list[dict], args: argparse.Namespace) -> list[dict]:
    """This call's rows beside the rows of the recipes an earlier call
    measured and this one did not (from docs/results/recipes.json), in the order of RECIPES: the page grows one
    recipe at a time. A smoke call (--seeds / --max-minutes) keeps no earlier rows."""
    rows = sorted(rows, key=lambda row: list(RECIPES).index(row["recipe"]))
    data = page_data()
    if args.seeds or args.max_minutes or not data or any(data.get("overridden", {}).values()):
        return rows
    mine = {row["recipe"]: row for row in data["rows"] if row["recipe"] in RECIPES}
    mine.update({row["recipe"]: row for row in rows})
    return [mine[name] for name in RECIPES if name in mine]


def seeds_line(rows: list[dict], override: int | None) -> str:
    counts = sorted({len(row["seeds"]) + len(row.get("missing_seeds", [])) for row in rows}, reverse=True)
    per = " or ".join(f"{n} (0–{n - 1})" if n > 1 else "1 (0)" for n in counts)
    note = f", set by --seeds {override}" if override else ", as each row says"
    return f"training seeds per recipe: {per}{note}; each BC / SFT prerequisite once, seed 0"


def write_cards(rows: list[dict], args: argparse.Namespace, trained: dict[str, dict]) -> None:
    """The page with this call's rows beside the earlier calls' (merged_with_earlier), its JSON and its plot."""
    rows = merged_with_earlier(rows, args)
    measured = {row["recipe"] + (f" ({seeds_label(row)} seeds)" if row.get("missing_seeds") else ""): row["mean"]
                for row in rows if "mean" in row}
    write_results("recipes", "Recipe cards: every shipped recipe over training seeds", markdown(rows, args, trained),
                  {"rows": rows, "prerequisites": trained,
                   "overridden": {"seeds": args.seeds, "max_minutes": args.max_minutes}},
                  seeds=seeds_line(rows, args.seeds), bars=measured or None,
                  plot_title="Mean final deterministic eval success over training seeds",
                  bar_label="mean final success", machines=machines_line(rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES), metavar="NAME")
    p.add_argument("--run-dir", default="runs/recipes")
    p.add_argument("--jobs", type=int, default=1, help="training seeds side by side (each on one thread)")
    p.add_argument("--reuse", action="store_true", help="keep the runs that already finished in --run-dir")
    p.add_argument("--only-seeds", type=int, nargs="+", default=None, metavar="SEED",
                   help="train only these of each recipe's seeds and take its others from docs/results/recipes.json "
                        "(a card measured in parts)")
    p.add_argument("--seeds", type=int, default=None, help="seeds per recipe instead of its own (smoke tests)")
    p.add_argument("--max-minutes", type=float, default=None, help="every run's budget (smoke tests)")
    p.add_argument("--rescore", action="store_true",
                   help="train nothing: score the rows of --recipes again from the runs docs/results/recipes.json "
                        "holds, against the bars RECIPES states now")
    args = p.parse_args()
    if args.only_seeds and (args.seeds or args.max_minutes):
        p.error("--only-seeds measures part of a recipe's own card: leave out --seeds and --max-minutes")
    if args.rescore:
        if args.only_seeds or args.seeds or args.max_minutes or args.reuse:
            p.error("--rescore trains nothing: leave out --only-seeds, --seeds, --max-minutes and --reuse")
        write_cards(rescored(args.recipes), args, page_data().get("prerequisites", {}))
        return
    runs = Path(args.run_dir).resolve()
    runs.mkdir(parents=True, exist_ok=True)
    common = ["train.progress=false", f"train.run_dir={runs}"]
    common += [f"train.max_minutes={args.max_minutes:g}"] if args.max_minutes else []
    rows, trained, planned = [], {}, {}
    for config in args.recipes:
        recipe = RECIPES[config]._replace(seeds=args.seeds or RECIPES[config].seeds,
                                          minutes=args.max_minutes or RECIPES[config].minutes)
        seeds = list(range(recipe.seeds))
        if args.only_seeds:
            if other := sorted(set(args.only_seeds) - set(seeds)):
                p.error(f"{config} trains seeds 0–{recipe.seeds - 1}: --only-seeds {' '.join(map(str, other))} is "
                        "not one of them")
            seeds = sorted(set(args.only_seeds))
        cfg = load_config(ROOT / "configs" / f"{config}.yaml", common)
        if reason := unavailable(cfg):
            print(f"{config}: not run: {reason}", flush=True)
            rows.append({"recipe": config, "config": f"configs/{config}.yaml", "seeds": seeds,
                         "threshold": recipe.threshold, "budget_minutes": recipe.minutes, "not_run": reason})
            continue
        start = start_from(cfg, runs, args.reuse, common, trained)
        stages = stages_of(cfg)
        began = origin(config, runs, stages)
        others = [seed for seed in range(recipe.seeds) if seed not in seeds]
        kept = earlier_runs(config, began, others) if args.only_seeds else []
        planned[config] = (recipe, [SeedRun(config, seed, recipe.minutes, start) for seed in seeds], stages, began,
                           kept)
    summaries = iter(train_runs([(run.name, run.args) for plan in planned.values() for run in plan[1]], runs,
                                args.reuse, args.jobs))
    for config, (recipe, seed_runs, stages, began, kept) in planned.items():
        new = [run_record(run.seed, next(summaries), origin=began, measured=(day := finished_on(runs, run.name)),
                          **trained_with(runs, run, day)) for run in seed_runs]
        rows.append({**card(config, recipe, kept + new), "prerequisites": {
            stage: trained[stage]["best_success_rate"] for stage in with_own_prerequisites(stages, trained)}})
    write_cards(rows, args, trained)


if __name__ == "__main__":
    main()
