"""Helpers shared by the benchmarks: reuse finished runs, run a `roborl` stage in its own process, record the
VLA demos, find when a learning curve first reaches a target, time envs alike, and write a benchmark's results
page under docs/results/ (markdown + JSON + PNG, with the command, the date, the hardware and the seeds), which is
never edited by hand."""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import torch

from roborl.config import load_config
from roborl.files import atomic_write
from roborl.plots import plot_bars, plot_curves
from roborl.runner import Runner

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
VLA_DEMO_ARGS = ["LangTabletopFixed-ReachPushLift", "--episode-length", "60", "--episodes", "900", "--envs", "30",
                 "--noise", "0.3", "--dart"]


def run_once(run_dir: Path, name: str, reuse: bool, start: Callable[[], dict]) -> dict:
    """The run's summary: read from `run_dir/name/summary.json` when `reuse` and that run finished, else `start()`.
    A run that was cut short is not taken for a result: the bench stops and says how to go on."""
    path = run_dir / name / "summary.json"
    if reuse and path.is_file():
        summary = json.loads(path.read_text())
        if summary.get("finished"):
            return summary
        raise SystemExit(f"{run_dir / name} was cut short at {summary['env_steps']:,} env steps: carry it on "
                         f"(resume={run_dir / name}/checkpoints/last.safetensors with the command that started it) "
                         "or delete it to start it again")
    return start()


@contextmanager
def started_runner(config: Path, overrides: list[str]) -> Iterator[Runner]:
    """A Runner of `config` in a temporary run directory (no progress bar, no videos), started (`Runner.start`)
    and closed after: what a benchmark times `Runner.iterate` on."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(config, [f"train.run_dir={tmp}", "train.name=bench", "train.progress=false",
                                   "train.video=false", *overrides])
        runner = Runner(cfg)
        try:
            runner.start()
            yield runner
        finally:
            runner.close()


def first_reaching(history: list[list[float]], target: float) -> tuple[float, float] | None:
    """(env steps, wall seconds) of the first eval in `[[steps, wall, success], ...]` with success >= target."""
    for steps, wall, success in history:
        if success >= target:
            return steps, wall
    return None


def median_to(reached: list[tuple[float, float] | None], index: int) -> float | None:
    """Median over all seeds of the steps (index 0) or seconds (1) to a target (`first_reaching` of each seed), a
    seed that never reached it counting as never; None when the median seed never reached it."""
    value = statistics.median([r[index] if r else float("inf") for r in reached])
    return None if value == float("inf") else value


def env_seconds_per_step(envs: dict, actions: torch.Tensor, repeats: int = 3) -> dict[str, float]:
    """Seconds per `step` of each env on the same action sequence (T×N×A), best of `repeats`, the envs
    interleaved so that a busy moment hits them alike."""
    best = {key: float("inf") for key in envs}
    for _ in range(repeats):
        for key, env in envs.items():
            env.reset(seed=0)
            start = time.perf_counter()
            for a in actions:
                env.step(a)
            best[key] = min(best[key], (time.perf_counter() - start) / len(actions))
    return best


def hardware() -> str:
    """CPU model and cores, memory, GPU: what a reader needs to compare the numbers with their machine."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{cpu}, {os.cpu_count()} cores, {memory:.0f} GiB, {gpu}"


def software() -> str:
    import mujoco

    commit = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--abbrev=7"], capture_output=True,
                            text=True)
    rev = f", roborl {commit.stdout.strip()}" if commit.returncode == 0 else ""
    return f"Python {platform.python_version()}, torch {torch.__version__}, MuJoCo {mujoco.__version__}{rev}"


def write_results(name: str, title: str, lines: list[str], data: dict, seeds: str,
                  curves: dict | None = None, bars: dict[str, float] | None = None, plot_title: str = "",
                  bar_label: str = "", out: Path = RESULTS, xlabel: str = "env steps", machines: str = "") -> Path:
    """Prints the table and writes `out/name.md` (the page), `name.json` (the data and how it was measured) and
    `name.png` (learning `curves`, or `bars`); then rewrites `out/index.md`, the list of the pages. `machines`, where
    the page's rows were measured on other machines than this one (a page that grows over calls), says which."""
    command = shlex.join(["python", f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]])
    meta = {"command": command, "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "hardware": machines or hardware(), "software": software(), "seeds": seeds}
    out.mkdir(parents=True, exist_ok=True)
    if curves:
        plot_curves(out / f"{name}.png", curves, plot_title or title, xlabel=xlabel)
    elif bars:
        plot_bars(out / f"{name}.png", bars, plot_title or title, bar_label)
    png = f"\n![{plot_title or title}]({name}.png)\n" if curves or bars else ""
    table = "\n".join(lines)
    print(table)
    header = [f"# {title}", "",
              f"Written by `bench/{Path(sys.argv[0]).name}`; not edited by hand: run the command again to renew it.", "",
              "| how it was measured | |", "|---|---|", f"| command | `{command}` |", f"| date | {meta['date']} |",
              f"| hardware | {meta['hardware']} |", f"| software | {meta['software']} |", f"| seeds | {seeds} |",
              f"| data | [{name}.json]({name}.json) |", ""]
    write_page(out / f"{name}.md", "\n".join(header) + "\n" + table + "\n" + png)
    write_page(out / f"{name}.json", json.dumps({"meta": meta, **data}, indent=2) + "\n")
    write_index(out)
    return out / f"{name}.md"


def write_page(path: Path, text: str) -> None:
    """A results file, written whole (a killed bench leaves the page it had)."""
    with atomic_write(path) as tmp:
        tmp.write_text(text)


def write_index(out: Path = RESULTS) -> None:
    """`out/index.md`: one line per results page with its title, date and command."""
    rows = []
    for page in sorted(out.glob("*.md")):
        data = out / f"{page.stem}.json"
        if page.name == "index.md" or not data.is_file():
            continue
        meta = json.loads(data.read_text())["meta"]
        title = page.read_text().splitlines()[0].removeprefix("# ")
        rows.append(f"| [{title}]({page.name}) | {meta['date']} | `{meta['command']}` |")
    benches = sorted(path.stem for path in Path(__file__).parent.glob("*.py") if "write_results(" in path.read_text()
                     and path.stem != "study")
    missing = [f"- `python bench/{name}.py`" for name in benches if not (out / f"{name}.md").is_file()]
    write_page(out / "index.md", "\n".join([
        "# Results", "",
        "Every page here is written by a benchmark in `bench/` when it runs; none is edited by hand. Each page says",
        "the command, the date, the hardware and the seeds behind its numbers.", "",
        "| page | measured | command |", "|---|---|---|", *rows,
        *(["", "Not measured here yet (each writes its page when it runs):", "", *missing] if missing else [])]) + "\n")


def run_stage(args: list[str], log: Path) -> dict:
    """One `roborl` command in its own process (exits with a line naming its log if it fails); its peak RSS."""
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "roborl.cli", *args], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"`roborl {' '.join(args)}` failed; see {log}")
    return {"peak_mib": usage.ru_maxrss / 1024}


def train_stage(args: list[str], run_dir: Path, name: str) -> dict:
    """`roborl ARGS` training run `name` in its own process (run_stage), logged to run_dir/name.log; its summary."""
    run_stage(args, run_dir / f"{name}.log")
    return json.loads((run_dir / name / "summary.json").read_text())


def seeds_study_parser(description: str, run_dir: str, steps: int) -> argparse.ArgumentParser:
    """The arguments of a study over training seeds with one env-step budget shared by every run."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--run-dir", default=run_dir)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=steps, help="env steps per run (the shared budget)")
    p.add_argument("--max-minutes", type=float, default=15.0, help="a cap on each run's wall time")
    p.add_argument("--jobs", type=int, default=1, help="runs side by side")
    p.add_argument("--reuse", action="store_true", help="read the runs already finished in --run-dir")
    return p


def side_by_side(jobs: int) -> list[str]:
    """Overrides for one of `jobs` runs sharing the machine: one torch thread each, in rollouts and updates alike
    (a run alone lets its update take the cores its idle simulator leaves; side by side those cores are taken)."""
    return ["train.threads=1", "train.update_threads=1"] if jobs > 1 else []


TRAINED_WITH = "trained_with.json"  # beside a run's summary: the runs side by side, the software and the machine that
#                                    trained it


def train_runs(runs: list[tuple[str, list[str]]], run_dir: Path, reuse: bool, jobs: int = 1) -> list[dict]:
    """`roborl train` for each (run name, CLI arguments after `train`), `jobs` side by side (one torch thread
    each when more than one), each in its own process with its log beside its run; their summaries (a finished
    run is read back with `reuse`). Each run it trains gets TRAINED_WITH beside it, so that a later call reusing
    the run reports how and where it was trained, not how the reusing call would have trained it."""
    threads, made_by, machine = side_by_side(jobs), software(), hardware()

    def trained(name: str, cli: list[str]) -> dict:
        summary = train_stage(cli, run_dir, name)
        write_page(run_dir / name / TRAINED_WITH, json.dumps({"jobs": jobs, "software": made_by, "hardware": machine}))
        return summary

    def one(run: tuple[str, list[str]]) -> dict:
        name, args = run
        cli = ["train", *args, f"train.run_dir={run_dir}", f"train.name={name}", "train.progress=false", *threads]
        summary = run_once(run_dir, name, reuse, lambda: trained(name, cli))
        print(f"{name}: final success {summary['success_rate']:.3f}, best {summary['best_success_rate']:.3f}, "
              f"{summary['env_steps']:,} env steps, {summary['wall_time_s'] / 60:.1f} min", flush=True)
        return summary

    run_dir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(one, runs))


def mean_curve(histories: list[list[list[float]]]) -> list[tuple[float, float]]:
    """Eval success averaged over seeds at the eval points every seed reached (`eval_history` rows)."""
    length = min(len(h) for h in histories)
    return [(histories[0][i][0], sum(h[i][2] for h in histories) / len(histories)) for i in range(length)]


def record_vla_demos(runs: Path, images: bool, lerobot: bool = False) -> Path:
    """The scripted demos (900 episodes) the SFT stages learn from, recorded once per run dir; for LeRobot's
    policies as a LeRobot v3 dataset."""
    demos = runs / ("demos_lerobot" if lerobot else "demos" if images else "demos_state")
    if not (demos / "demos.hdf5").exists() and not (demos / "meta" / "info.json").exists():
        print(f"recording {demos.name} ...", flush=True)
        fmt = ["--format", "lerobot"] if lerobot else []
        run_stage(["demos", *VLA_DEMO_ARGS, *(["--rgb"] if images else []), *fmt, "--out", str(demos), "--quiet"],
                  runs / f"{demos.name}.log")
    return demos


PRETRAINED = "pretrained"  # runs/<stage>/pretrained: the stage's best checkpoint in its library's own format


def pretraining_stage(init: str | None) -> str | None:
    """The stage whose weights a config starts from (its `policy.init` or `residual.base:
    runs/<stage>/checkpoints/...`, or `runs/<stage>/pretrained`: that checkpoint exported by `roborl export
    --format pretrained`), e.g. the SFT a family's few-shot SFT or its RL starts from; None if none."""
    parts = Path(init).parts if init else ()
    named = len(parts) > 3 and parts[2] == "checkpoints" or parts[2:] == (PRETRAINED,)
    return parts[1] if parts[:1] == ("runs",) and named else None
