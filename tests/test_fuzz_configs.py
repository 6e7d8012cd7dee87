"""Random corruptions of every shipped config, run as a user runs them (`roborl train FILE`, tiny budgets; the
CLI's `main` in this process, which spares each case the seconds of a child's start-up).

Each case either trains and exits 0 (with a whole checkpoint and a summary), or exits 2 with at most three
lines on stderr and no traceback, leaving no checkpoint behind. Hypothesis draws the cases from a fixed
seed (`derandomize`), so CI runs the same ones every time; the counts are printed at the end.

Corruptions: a key set to a bad value (negative, zero, huge, NaN, infinite, text, a list, a mapping, null,
a boolean), a key deleted, an unknown key added, or the whole file replaced (random bytes, gzip, a YAML
list, nothing). Keys whose huge values only ask for more work (more episodes, more epochs) are not set
huge: such a run is valid and merely long.
"""
import gzip
import math
import tempfile
from collections import Counter
from pathlib import Path

import yaml
from helpers import ROOT, roborl_in_process
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roborl.checkpoint import Checkpoint

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
HUGE = 1_000_000_000
BAD_VALUES = [-1, 0, -0.5, 1.5, HUGE, math.nan, math.inf, "text", [], {"x": 1}, None, True, [1, "a"]]
WORK = {"total_steps", "eval_episodes", "eval_envs", "eval_every", "save_every", "video_envs", "epochs", "steps",
        "train_timesteps", "samples", "finetune_steps", "resample_rounds", "critic_warmup", "seed_steps",
        "progressive_steps", "max_restarts", "max_staleness", "episode_length", "render_size", "hidden",
        "critic_hidden", "value_hidden", "obs_history", "horizon", "threads", "utd_ratio", "actor_delay"}
ENVS = 8  # every shipped group size divides it
CASES = 24


def leaves(tree: dict, prefix: tuple = ()) -> list[tuple]:
    out = []
    for key, value in tree.items():
        path = (*prefix, key)
        out += leaves(value, path) if isinstance(value, dict) and value else [path]
    return out


def tiny(data: dict) -> dict:
    """The config at a budget of about one iteration of ENVS envs, evaluated on 4 episodes."""
    env, train = data.setdefault("env", {}), data.setdefault("train", {})
    env["num_envs"] = ENVS
    rollout = train.get("rollout_steps", 50)
    train.update(total_steps=ENVS * rollout * env.get("action_chunk", 1), eval_episodes=4, eval_envs=4,
                 video=False, progress=False, save_every=1, eval_at_start=False)
    if "sac" in data:
        data["sac"].update(seed_steps=ENVS * 2, batch_size=16)
    policy = data.get("policy", {})
    for key in ("init", "init_modules"):  # checkpoints of earlier runs that a fresh machine does not have
        policy.pop(key, None)
    base = str(data.get("residual", {}).get("base", ""))
    if base not in ("", "expert") and ":" not in base:  # a checkpoint or LeRobot directory of an earlier run
        data["residual"]["base"] = "expert"
    return data


@st.composite
def corrupted(draw) -> tuple[str, str, bytes]:
    """(config name, what was done, the file's new bytes)."""
    path = draw(st.sampled_from(CONFIGS))
    data = tiny(yaml.safe_load(path.read_text()))
    kind = draw(st.sampled_from(["value", "value", "value", "delete", "unknown", "file"]))
    if kind == "file":
        content = draw(st.sampled_from(["bytes", "gzip", "list", "empty"]))
        raw = {"bytes": bytes(draw(st.lists(st.integers(128, 255), min_size=8, max_size=64))),
               "gzip": gzip.compress(path.read_bytes()), "list": b"- env\n- train\n", "empty": b""}[content]
        return path.name, f"file replaced by {content}", raw
    keys = leaves(data)
    key = draw(st.sampled_from(keys))
    node = data
    for part in key[:-1]:
        node = node[part]
    if kind == "delete":
        del node[key[-1]]
        return path.name, f"deleted {'.'.join(key)}", yaml.safe_dump(data).encode()
    if kind == "unknown":
        node[key[-1] + "_typo"] = 1
        return path.name, f"added {'.'.join(key)}_typo", yaml.safe_dump(data).encode()
    value = draw(st.sampled_from([v for v in BAD_VALUES if not (v == HUGE and key[-1] in WORK)]))
    node[key[-1]] = value
    return path.name, f"{'.'.join(key)}={value!r}", yaml.safe_dump(data, allow_unicode=True).encode()


def check_case(case: tuple[str, str, bytes], counts: Counter) -> None:
    name, what, content = case
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / name
        config.write_bytes(content)
        proc = roborl_in_process("train", str(config), f"train.run_dir={tmp}/runs", "train.name=run",
                                 "train.max_minutes=1")
        run = Path(tmp) / "runs" / "run"
        label = f"{name}: {what}"
        assert "Traceback" not in proc.stderr, f"{label}\n{proc.stderr[-3000:]}"
        if proc.returncode == 0:
            counts["trained"] += 1
            Checkpoint(run / "checkpoints" / "last.safetensors")  # whole and readable
            assert (run / "summary.json").exists(), label
        else:
            counts["refused"] += 1
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode == 2 and 1 <= len(lines) <= 3, f"{label}: exit {proc.returncode}\n{proc.stderr}"
            assert lines[-1].startswith("roborl: error: "), f"{label}\n{proc.stderr}"
            assert not list(run.rglob("*.safetensors")) if run.exists() else True, label
        assert not list(Path(tmp).rglob(".*.tmp-*")), f"{label}: a temporary file was left behind"


def test_corrupted_configs_train_or_are_refused_in_one_line():
    counts: Counter = Counter()

    @settings(max_examples=CASES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=corrupted())
    def one(case):
        check_case(case, counts)

    one()
    print(f"\nfuzzed configs: {sum(counts.values())} cases, {counts['refused']} refused in one line, "
          f"{counts['trained']} trained")
    assert sum(counts.values()) >= CASES and counts["refused"] >= 10 and counts["trained"] >= 3, counts
