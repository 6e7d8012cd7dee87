"""`roborl eval` over tasks and seeds: IQM and bootstrap intervals, eval.json schema, eval.md, videos, bad input."""
import json

import numpy as np
import pytest
import scipy.stats
import torch
from helpers import ROOT, roborl_in_process

from roborl import stats
from roborl.builder import build
from roborl.checkpoint import save_checkpoint
from roborl.cli import main
from roborl.config import config_to_dict, load_config
from roborl.evaluate import episode_quota, evaluate_checkpoint

REACH = str(ROOT / "configs" / "ppo_reach.yaml")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, str]:
    """Untrained policies for Reach and Push, saved as the trainer saves them."""
    out = {}
    for task in ("Reach", "Push"):
        cfg = load_config(REACH, [f"env.id=mujoco/{task}", "env.num_envs=1"])
        env, policy = build(cfg, torch.device("cpu"))
        env.close()
        out[task] = str(tmp_path_factory.mktemp("ckpt") / f"{task}.safetensors")
        save_checkpoint(out[task], policy, None, config_to_dict(cfg), {"iteration": 0})
    return out


def test_iqm_is_scipy_trim_mean():
    rng = np.random.default_rng(0)
    for n in range(1, 40):
        x = rng.normal(size=n)
        assert np.isclose(stats.iqm(x), scipy.stats.trim_mean(x, 0.25))
    x = rng.uniform(size=(6, 11))
    assert np.allclose(stats.iqm(x, axis=-1), scipy.stats.trim_mean(x, 0.25, axis=-1))
    assert stats.iqm([100, 1, 7, 2, 6, 3, 5, 4]) == 4.5  # 1, 2 and 7, 100 cut: mean of 3, 4, 5, 6


def test_bootstrap_interval_holds_the_mean_shrinks_and_repeats():
    rng = np.random.default_rng(1)
    few, many = rng.uniform(size=5), rng.uniform(size=80)
    for x in (few, many):
        mean, (lo, hi) = stats.point_and_ci([x], stats.mean_of_tasks)
        assert mean == pytest.approx(x.mean()) and lo <= mean <= hi
        value, (lo, hi) = stats.point_and_ci([x], stats.iqm_of_runs)
        assert lo <= value <= hi
    width = [np.diff(stats.point_and_ci([x], stats.mean_of_tasks)[1])[0] for x in (few, many)]
    assert width[1] < width[0] / 2
    assert stats.summarize([few]) == stats.summarize([few])
    assert stats.summarize([many], seed=1) != stats.summarize([many], seed=2)


def test_summary_needs_enough_runs_and_keeps_tasks_apart():
    assert stats.summarize([[0.5]]) == {"mean": 0.5, "ci95": None, "iqm": None, "iqm_ci95": None}
    four = stats.summarize([[0.1, 0.2, 0.3, 0.4]])
    assert four["ci95"] is not None and four["iqm"] is None
    assert stats.summarize([[0.1, 0.2, 0.3, 0.4, 0.5]])["iqm"] == pytest.approx(0.3)
    # stratified by task: every resample keeps both tasks, so two constant tasks give a point interval
    both = stats.summarize([[0.0] * 5, [1.0] * 5])
    assert both["mean"] == 0.5 and both["ci95"] == [0.5, 0.5]


def test_episode_quota_is_fixed_and_even():
    for episodes, envs in [(50, 25), (7, 3), (2, 5)]:
        quota = episode_quota(episodes, envs)
        assert int(quota.sum()) == episodes and int(quota.max() - quota.min()) <= 1


def test_eval_over_tasks_and_seeds_writes_json_markdown_and_videos(tmp_path, ckpts):
    out = tmp_path / "eval"
    proc = roborl_in_process("eval", ckpts["Reach"], ckpts["Push"], "--seeds", "2", "--episodes", "2", "--envs", "2",
                             "--out", str(out), "--json", "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "eval.json").read_text())
    assert report == json.loads(proc.stdout)
    assert report["schema"] == "roborl.eval/1" and set(report) == {"schema", "tasks", "aggregate", "config"}
    assert list(report["tasks"]) == ["mujoco/Reach", "mujoco/Push"]
    for task in report["tasks"].values():
        assert task["unit"] == "eval_seed" and task["runs"] == 2 and task["episodes"] == 4
        assert [row["seed"] for row in task["per_seed"]] == [12345, 12346]
        for row in task["per_seed"]:
            assert set(row) == {"checkpoint", "seed", "success", "success_once", "return", "length", "episodes"}
            assert isinstance(row["success"], float) and row["episodes"] == 2
        for name in ("success", "success_once", "return", "episode_length"):
            summary = task[name]
            assert set(summary) == {"mean", "ci95", "iqm", "iqm_ci95"}
            assert isinstance(summary["mean"], float) and len(summary["ci95"]) == 2
            assert summary["iqm"] is None  # 2 runs: too few for an IQM
        assert task["episode_length"]["mean"] > 0
        (video,) = task["videos"]
        assert (out / video).stat().st_size > 1000
    assert report["aggregate"]["tasks"] == 2 and set(report["aggregate"]["success"]) == {"mean", "ci95", "iqm",
                                                                                         "iqm_ci95"}
    cfg = report["config"]
    assert cfg["eval_seeds"] == [12345, 12346] and cfg["episodes_per_run"] == 2 and cfg["device"] == "cpu"
    rows = [line for line in (out / "eval.md").read_text().splitlines() if line.startswith("| mujoco/")]
    assert [row.split("|")[1].strip() for row in rows] == ["mujoco/Reach", "mujoco/Push"]


def test_suite_file_with_training_seeds(tmp_path, ckpts, capsys):
    (tmp_path / "a.safetensors").write_bytes(open(ckpts["Reach"], "rb").read())
    (tmp_path / "b.safetensors").write_bytes(open(ckpts["Reach"], "rb").read())
    suite = tmp_path / "suite.yaml"
    suite.write_text("episodes: 1\nenvs: 1\ntasks:\n  mujoco/Reach: '*.safetensors'\n")
    assert main(["eval", "--suite", str(suite), "--out", str(tmp_path / "out"), "--no-video", "--quiet"]) == 0
    report = json.loads((tmp_path / "out" / "eval.json").read_text())
    reach = report["tasks"]["mujoco/Reach"]
    assert reach["unit"] == "checkpoint" and reach["runs"] == 2 and reach["videos"] == []
    assert [row["checkpoint"] for row in reach["per_seed"]] == [str(tmp_path / "a.safetensors"),
                                                                str(tmp_path / "b.safetensors")]
    assert "| mujoco/Reach | 2 (checkpoints) | 2 |" in capsys.readouterr().out


def test_one_checkpoint_keeps_the_plain_eval(ckpts, capsys):
    assert main(["eval", ckpts["Reach"], "--episodes", "2", "--envs", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result == evaluate_checkpoint(ckpts["Reach"], 2, envs=2)  # the plain eval's dict, as the function gives it


def test_tasks_without_out_print_the_table_and_write_nothing(tmp_path, ckpts, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["eval", ckpts["Reach"], "--tasks", "mujoco/Reach", "--seeds", "2", "--episodes", "2", "--envs", "2",
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "| mujoco/Reach | 2 (eval seeds) | 4 |" in out, out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,fragment", [
    (["{missing}", "--out", "{out}"], "does not exist"),
    (["{Reach}", "--tasks", "mujoco/Nope", "--out", "{out}"], "unknown environment 'mujoco/Nope'"),
    (["{Reach}", "--tasks", "mujoco/Push", "--out", "{out}"], "was trained on mujoco/Reach (state (24,), action (4,)); "
                                                              "mujoco/Push has state (34,)"),
    (["{Reach}", "--seeds", "0", "--out", "{out}"], "seeds must be a positive integer"),
    (["--suite", "{suite}", "--out", "{out}"], "unknown key 'episode'"),
])
def test_bad_input_is_one_line(tmp_path, ckpts, capsys, args, fragment):
    (tmp_path / "suite.yaml").write_text("episode: 3\ntasks:\n  mujoco/Reach: x.safetensors\n")
    names = {"missing": tmp_path / "missing.safetensors", "out": tmp_path / "out", "suite": tmp_path / "suite.yaml",
             **ckpts}
    assert main(["eval", *[a.format(**names) for a in args]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("roborl: error: ") and fragment in err[0], err
    assert not (tmp_path / "out" / "eval.json").exists()
