"""What a benchmark writes: its results page (markdown with command, date, hardware, seeds), its JSON and its
PNG under the results folder, and the index of the pages, which also names the benchmarks not run yet."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def study(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    monkeypatch.setattr(sys, "argv", ["bench/shield.py", "--episodes", "10"])
    import study

    return study


@pytest.mark.parametrize("plot", ["curves", "bars"])
def test_a_benchmark_writes_its_page_data_and_plot(study, tmp_path: Path, plot: str) -> None:
    figure = {"curves": {"curves": {"a": [(0, 0.1), (100, 0.9)]}}, "bars": {"bars": {"ours": 2.0, "peer": 1.0}}}[plot]
    page = study.write_results("shield", "Safe RL", ["| run | success |", "|---|---|", "| a | 0.9 |"], {"rows": [1]},
                               seeds="3 training seeds", out=tmp_path, **figure)
    text = page.read_text()
    assert text.startswith("# Safe RL\n")
    assert "| command | `python bench/shield.py --episodes 10` |" in text
    assert "| seeds | 3 training seeds |" in text and "| a | 0.9 |" in text and "![" in text
    data = json.loads((tmp_path / "shield.json").read_text())
    assert data["rows"] == [1] and set(data["meta"]) == {"command", "date", "hardware", "software", "seeds"}
    assert "cores" in data["meta"]["hardware"] and "torch" in data["meta"]["software"]
    assert (tmp_path / "shield.png").read_bytes()[:4] == b"\x89PNG"
    index = (tmp_path / "index.md").read_text()
    assert "[Safe RL](shield.md)" in index
    assert "`python bench/throughput.py`" in index.split("Not measured here yet")[1]
    assert "`python bench/shield.py`" not in index.split("Not measured here yet")[1]


def test_a_benchmark_reuses_finished_runs_and_stops_at_one_cut_short(study, tmp_path: Path) -> None:
    """`--reuse` takes a finished run's summary for its result; a run killed mid-way is refused, not averaged in."""
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "summary.json").write_text(json.dumps({"finished": True, "success_rate": 0.5}))
    assert study.run_once(tmp_path, "done", True, lambda: {"success_rate": 0.0})["success_rate"] == 0.5
    assert study.run_once(tmp_path, "done", False, lambda: {"success_rate": 0.0})["success_rate"] == 0.0
    assert study.run_once(tmp_path, "new", True, lambda: {"success_rate": 0.7})["success_rate"] == 0.7
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "summary.json").write_text(json.dumps({"finished": False, "env_steps": 1200}))
    with pytest.raises(SystemExit, match=r"cut was cut short at 1,200 env steps: carry it on \(resume=.*last"):
        study.run_once(tmp_path, "cut", True, lambda: {"success_rate": 0.7})


def test_a_recipe_card_keeps_the_runs_at_a_time_it_was_measured_with(study, monkeypatch) -> None:
    """Minutes depend on how many runs shared the cores: a row measured with --jobs 1 still says 1 on a page a
    later --jobs 2 call rewrites."""
    monkeypatch.setattr(sys, "argv", ["bench/recipes.py"])
    import recipes

    summary = {"success_rate": 0.9, "best_success_rate": 0.9, "env_steps": 1000, "wall_time_s": 60.0,
               "eval_history": [[0, 0.0, 0.1], [1000, 60.0, 0.9]]}
    rows = [recipes.card(name, recipes.RECIPES[name], [recipes.run_record(seed, summary, jobs=jobs) for seed in range(3)])
            for name, jobs in (("ppo_reach", 1), ("ppo_push", 2))]
    args = recipes.argparse.Namespace(jobs=2, seeds=None, max_minutes=None)
    table = [line for line in recipes.markdown(rows, args, {}) if line.startswith("| ppo_")]
    assert [line.split(" | ")[3] for line in table] == ["1", "2"]


def test_a_recipe_card_names_the_machine_each_row_trained_on(study, monkeypatch) -> None:
    """A page that grows over calls holds rows trained on other machines than the one writing it: each row names
    the CPU its seeds trained on (— where a run did not record it), the hardware line names each in full, and a row
    trained with runs side by side is reproduced with as many."""
    monkeypatch.setattr(sys, "argv", ["bench/recipes.py"])
    import recipes

    summary = {"success_rate": 0.9, "best_success_rate": 0.9, "env_steps": 1000, "wall_time_s": 60.0,
               "eval_history": [[0, 0.0, 0.1], [1000, 60.0, 0.9]]}
    amd, intel = "AMD EPYC, 2 cores, 24 GiB, no GPU", "Intel(R) Xeon(R) Processor, 2 cores, 24 GiB, no GPU"
    rows = [recipes.card(name, recipes.RECIPES[name], [recipes.run_record(seed, summary, jobs=jobs, **machine)
                                                       for seed in range(3)])
            for name, jobs, machine in (("ppo_reach", 1, {"hardware": amd}), ("ppo_push", 2, {"hardware": intel}),
                                        ("ppo_pickplace", 1, {}))]
    args = recipes.argparse.Namespace(jobs=1, seeds=None, max_minutes=None)
    lines = recipes.markdown(rows, args, {})
    table = [line for line in lines if line.startswith("| ppo_")]
    assert [line.split(" | ")[2] for line in table] == ["AMD EPYC", "Intel Xeon Processor", "—"]
    assert recipes.machines_line(rows) == (f"each row's `machine`: AMD EPYC = {amd}; Intel Xeon Processor = {intel}; "
                                           "— = not recorded")
    assert "- ppo_push: `python bench/recipes.py --recipes ppo_push --jobs=2`" in lines
    assert "- ppo_reach: `python bench/recipes.py --recipes ppo_reach`" in lines
    assert recipes.machine("AMD EPYC, 16 cores, 128 GiB, NVIDIA H200") == "AMD EPYC + NVIDIA H200"


def test_a_baseline_row_is_said_to_be_one(study, monkeypatch) -> None:
    """A sparse-reward baseline fails its reward machine's bar by design: the page names it as a baseline."""
    monkeypatch.setattr(sys, "argv", ["bench/recipes.py"])
    import recipes

    summary = {"success_rate": 0.0, "best_success_rate": 0.0, "env_steps": 1000, "wall_time_s": 60.0,
               "eval_history": [[0, 0.0, 0.0], [1000, 60.0, 0.0]]}
    args = recipes.argparse.Namespace(jobs=1, seeds=None, max_minutes=None)
    rows = [recipes.card(name, recipes.RECIPES[name], [recipes.run_record(0, summary, jobs=1)])
            for name in ("rm_sequence", "ppo_sequence_sparse")]
    notes = [line for line in recipes.markdown(rows, args, {}) if line.startswith("Baselines")]
    assert len(notes) == 1 and "ppo_sequence_sparse (against rm_sequence)" in notes[0]
    assert "rm_sequence (against" not in notes[0]

def test_a_prerequisite_trained_again_to_the_same_weights_has_the_same_fingerprint(study, monkeypatch, tmp_path) -> None:
    """Seeds measured in different calls share a card only where their start's weights are equal: the fingerprint
    reads the weights, not the run folder, wall time or config a checkpoint also holds."""
    monkeypatch.setattr(sys, "argv", ["bench/recipes.py"])
    import recipes

    from roborl.checkpoint import save_checkpoint

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    save_checkpoint(tmp_path / "a.safetensors", net, None, {"train": {"run_dir": "/one"}}, {"wall_time_s": 1.0})
    save_checkpoint(tmp_path / "b.safetensors", net, None, {"train": {"run_dir": "/two"}}, {"wall_time_s": 2.0})
    with torch.no_grad():
        net[1].bias[0] += 1e-6
    save_checkpoint(tmp_path / "c.safetensors", net, None, {"train": {"run_dir": "/one"}}, {"wall_time_s": 1.0})
    a, b, c = (recipes.weights_fingerprint(tmp_path / f"{n}.safetensors") for n in "abc")
    assert a == b != c


def test_a_card_measured_in_parts_joins_seeds_that_started_alike(study, monkeypatch, tmp_path) -> None:
    """--only-seeds: the row of seeds 0 and 1 says which seed is still to run and how; seed 2, measured later from
    the same start, completes it; seeds from another start are refused in one line."""
    monkeypatch.setattr(sys, "argv", ["bench/recipes.py"])
    import recipes

    name, recipe = "grpo_flow_vla_fewshot", recipes.RECIPES["grpo_flow_vla_fewshot"]
    start = {"config_sha256": "c", "start": {"sft_flow_vla_fewshot": "w"}}

    def run(seed: int, success: float, jobs: int) -> dict:
        summary = {"success_rate": success, "best_success_rate": success, "env_steps": 1000, "wall_time_s": 60.0,
                   "eval_history": [[0, 0.0, 0.4], [1000, 60.0, success]]}
        return recipes.run_record(seed, summary, origin=start, measured=f"2026-12-0{seed + 1}", jobs=jobs)

    part = recipes.card(name, recipe, [run(0, 0.5, 2), run(1, 0.6, 2)])
    assert part["seeds"] == [0, 1] and part["missing_seeds"] == [2]
    args = recipes.argparse.Namespace(jobs=2, seeds=None, max_minutes=None)
    lines = recipes.markdown([part], args, {})
    assert [line.split(" | ")[4] for line in lines if line.startswith(f"| {name}")] == ["2 of 3"]
    assert any(f"--recipes {name} --only-seeds 2`" in line for line in lines if line.startswith("Not all seeds"))
    (tmp_path / "recipes.json").write_text(json.dumps({"rows": [part]}))

    kept = recipes.earlier_runs(name, start, [0, 1], results=tmp_path)
    whole = recipes.card(name, recipe, kept + [run(2, 0.7, 1)])
    assert whole["seeds"] == [0, 1, 2] and whole["missing_seeds"] == []
    assert whole["final_success"] == [0.5, 0.6, 0.7] and whole["measured"] == "2026-12-03"
    assert whole["jobs"] == "2, 2, 1"
    assert not any(line.startswith("Not all seeds") for line in recipes.markdown([whole], args, {}))
    with pytest.raises(SystemExit, match=rf"seed\(s\) 0, 1 of {name} did not start from the prerequisite weights "
                       r"and config this call starts from \(sft_flow_vla_fewshot w… then, 0123abcd… now\)"):
        recipes.earlier_runs(name, {**start, "start": {"sft_flow_vla_fewshot": "0123abcdef"}}, [0, 1], results=tmp_path)
    with pytest.raises(SystemExit, match=r"\(another config\)"):
        recipes.earlier_runs(name, {**start, "config_sha256": "d"}, [0, 1], results=tmp_path)


def test_a_stage_trained_apart_for_two_cards_is_listed_with_each_cards_start(study, monkeypatch) -> None:
    """Cards measured in different calls may start from the same stage trained to different evals: the page says
    which recipes started from which."""
    monkeypatch.setattr(sys, "argv", ["bench/recipes.py"])
    import recipes

    summary = {"success_rate": 0.6, "best_success_rate": 0.6, "env_steps": 1000, "wall_time_s": 60.0,
               "eval_history": [[0, 0.0, 0.4], [1000, 60.0, 0.6]]}
    rows = [{**recipes.card(name, recipes.RECIPES[name], [recipes.run_record(0, summary, jobs=1)]),
             "prerequisites": {"sft_flow_vla": best}}
            for name, best in (("ppo_flow_vla", 0.65), ("grpo_flow_vla", 0.65), ("grpo_flow_vla_fewshot", 0.73))]
    args = recipes.argparse.Namespace(jobs=1, seeds=None, max_minutes=None)
    [line] = [line for line in recipes.markdown(rows, args, {}) if line.startswith("Prerequisites")]
    assert "`sft_flow_vla` (best eval 0.65 for ppo_flow_vla, grpo_flow_vla; 0.73 for grpo_flow_vla_fewshot)" in line
    [line] = [line for line in recipes.markdown(rows[:2], args, {}) if line.startswith("Prerequisites")]
    assert "`sft_flow_vla` (best eval 0.65)" in line


def test_rsl_rl_trains_on_our_vecenv_through_the_benchmark_adapter(monkeypatch):
    """bench/throughput.py's peer: rsl_rl's own OnPolicyRunner iterates on our env through the thin adapter."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from peer_adapters import RslRlAdapter, rsl_rl_train_cfg
    from rsl_rl.runners import OnPolicyRunner

    from roborl import (
        sim,
        tasks,  # noqa: F401
    )

    env = RslRlAdapter(sim.make("mujoco/Push", 8))
    runner = OnPolicyRunner(env, rsl_rl_train_cfg([32, 32], "tanh", 0.6, 16, 2, 2, 1e-3, 0.9, 0.95), log_dir=None)
    before = [p.clone() for p in runner.alg.actor.parameters()]
    runner.learn(2)
    assert any(not torch.equal(a, b) for a, b in zip(before, runner.alg.actor.parameters()))
    assert env.episode_length_buf.max() <= env.max_episode_length
    env.close()


def test_vla_bench_refuses_an_unknown_family_or_algorithm_before_any_stage(tmp_path):
    """bench/vla.py checks every stage's config first: a typo in --algorithms must not cost the demos and SFT
    that run before the RL stages (nor write a run folder)."""
    for args in (["--families", "pi0_tabletopp"], ["--families", "pi0_tabletop", "--algorithms", "ppo", "none"]):
        out = subprocess.run([sys.executable, str(ROOT / "bench/vla.py"), "--run-dir", str(tmp_path / "runs"),
                              *args], capture_output=True, text=True)
        assert out.returncode != 0
        assert out.stderr.strip().count("\n") == 0 and "there is no configs/" in out.stderr, out.stderr
        assert not (tmp_path / "runs").exists()


def test_vla_page_keeps_the_rows_an_earlier_call_measured(monkeypatch, tmp_path):
    """bench/vla.py grows its page a family at a time: a call replaces the rows it measured, keeps the others with
    the command, date and machine that measured them, and drops those measured with another number of eval
    episodes."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("bench_vla", ROOT / "bench/vla.py")
    vla = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vla)
    earlier = json.loads((ROOT / "docs/results/vla.json").read_text())
    (tmp_path / "vla.json").write_text(json.dumps(earlier))
    monkeypatch.setattr(vla, "RESULTS", tmp_path)
    first = earlier["rows"][0]
    new = {**first, "measured": {"command": "python bench/vla.py --families x", "date": "2027-01-01 00:00 UTC",
                                 "episodes": vla.EPISODES, "hardware": "Intel(R) Xeon(R) Processor, 2 cores"}}
    rows = vla.merged_with_earlier([new], vla.EPISODES)
    assert len(rows) == len(earlier["rows"])
    assert rows[0] is new
    assert all(row["measured"]["command"] == earlier["meta"]["command"] for row in rows[1:])
    assert all(row["measured"]["hardware"] == earlier["meta"]["hardware"] for row in rows[1:])
    page = vla.markdown(rows, vla.EPISODES)
    assert "`python bench/vla.py --families x` (on Intel(R) Xeon(R) Processor, 2 cores)" in page
    assert f"`{earlier['meta']['command']}` (on {earlier['meta']['hardware']})" in page
    assert vla.merged_with_earlier([new], vla.EPISODES + 1) == [new]


def test_a_card_lists_each_prerequisite_after_the_stage_it_was_trained_from(study, monkeypatch, tmp_path) -> None:
    """The prerequisites on a row come in the order the bench trained them, each once: a few-shot SFT after the SFT
    it starts from, as `prerequisite` recorded the chain while it walked it."""
    monkeypatch.setattr(sys, "argv", ["bench/recipes.py"])
    import recipes

    monkeypatch.setattr(recipes, "demos_for", lambda cfg, runs: runs / "demos")
    for stage in ("sft_flow_vla", "sft_flow_vla_fewshot"):
        (tmp_path / stage).mkdir()
        (tmp_path / stage / "summary.json").write_text(json.dumps({"finished": True, "best_success_rate": 0.5}))
    cfg = recipes.load_config(recipes.ROOT / "configs" / "grpo_flow_vla_fewshot.yaml", [])
    trained: dict[str, dict] = {}
    start = recipes.start_from(cfg, tmp_path, True, [], trained)
    assert start == [f"policy.init={tmp_path}/sft_flow_vla_fewshot/checkpoints/best.safetensors"]
    assert trained["sft_flow_vla_fewshot"]["starts_from"] == ["sft_flow_vla"]
    for stages in (["sft_flow_vla_fewshot"], ["sft_flow_vla_fewshot", "sft_flow_vla"]):
        assert recipes.with_own_prerequisites(stages, trained) == ["sft_flow_vla", "sft_flow_vla_fewshot"]


def test_a_reused_run_keeps_how_it_was_trained(study, monkeypatch, tmp_path) -> None:
    """--reuse takes a finished run as it is: its runs side by side, software and machine are the ones that trained it (beside
    the run, or on the page for a run trained before that), not the reusing call's."""
    monkeypatch.setattr(sys, "argv", ["bench/recipes.py"])
    import recipes

    run = recipes.SeedRun("ppo_push", 1, 20, [])
    (tmp_path / "recipes.json").write_text(json.dumps({"rows": [{"recipe": "ppo_push", "runs": [
        {"seed": 1, "measured": "2026-12-03", "jobs": 1, "software": "roborl abc1234", "hardware": "AMD EPYC"},
        {"seed": 2, "measured": "2026-12-04", "jobs": 2, "software": "roborl def5678"}]}]}))
    assert recipes.trained_with(tmp_path, run, "2026-12-03", tmp_path) == {"jobs": 1, "software": "roborl abc1234",
                                                                          "hardware": "AMD EPYC"}
    assert recipes.trained_with(tmp_path, run, "2026-12-05", tmp_path) == {}  # trained again since: not that record
    (tmp_path / run.name).mkdir()
    (tmp_path / run.name / recipes.TRAINED_WITH).write_text(json.dumps({"jobs": 2, "software": "roborl 0123abc"}))
    assert recipes.trained_with(tmp_path, run, "2026-12-03", tmp_path) == {"jobs": 2, "software": "roborl 0123abc"}


def test_a_bench_run_records_how_it_was_trained_and_is_reused_as_it_is(study, tmp_path) -> None:
    """study.train_runs trains each run in its own `roborl train` process and writes, beside its summary, the runs
    side by side and the software; a second call with reuse reads the finished run back instead of training it."""
    run = ("reach", ["configs/ppo_reach.yaml", "env.num_envs=8", "train.rollout_steps=10", "train.total_steps=160",
                     "train.eval_episodes=8", "train.video=false"])
    [summary] = study.train_runs([run], tmp_path, reuse=False, jobs=2)
    assert summary["finished"] and summary["env_steps"] == 160
    assert (tmp_path / "reach.log").is_file()
    recorded = json.loads((tmp_path / "reach" / study.TRAINED_WITH).read_text())
    assert recorded == {"jobs": 2, "software": study.software(), "hardware": study.hardware()}
    finished = (tmp_path / "reach" / "summary.json").stat().st_mtime_ns
    assert study.train_runs([run], tmp_path, reuse=True, jobs=1) == [summary]
    assert (tmp_path / "reach" / "summary.json").stat().st_mtime_ns == finished
    assert json.loads((tmp_path / "reach" / study.TRAINED_WITH).read_text()) == recorded


def test_rescoring_a_card_counts_its_stored_runs_against_the_bar_stated_now(study, monkeypatch, tmp_path) -> None:
    """A bar stated after a card's seeds ran: --rescore scores the runs the page's JSON holds against it (seeds
    reaching it, steps and minutes to it), trains nothing, keeps each row's prerequisites, and refuses a recipe the
    page holds no runs of."""
    monkeypatch.setattr(sys, "argv", ["bench/recipes.py"])
    import recipes

    name = "grpo_token_vla_fewshot"
    histories = [[[0, 0.0, 0.4], [1000, 60.0, 0.56], [2000, 120.0, 0.58]],
                 [[0, 0.0, 0.38], [1000, 60.0, 0.46], [2000, 120.0, 0.52]]]
    runs = [recipes.run_record(seed, {"success_rate": h[-1][2], "best_success_rate": max(e[2] for e in h),
                                      "env_steps": 2000, "wall_time_s": 120.0, "eval_history": h}, jobs=2)
            for seed, h in enumerate(histories)]
    unstated = {**recipes.card(name, recipes.Recipe(3, None, 120), runs), "prerequisites": {"sft_token_vla_fewshot": 0.42}}
    assert unstated["reached"] is None and unstated["missing_seeds"] == [2]
    (tmp_path / "recipes.json").write_text(json.dumps({"rows": [unstated]}))
    monkeypatch.setitem(recipes.RECIPES, name, recipes.Recipe(3, 0.50, 120))
    [row] = recipes.rescored([name], tmp_path)
    assert row["threshold"] == 0.50 and row["reached"] == 2
    assert [run["env_steps_to_threshold"] for run in row["runs"]] == [1000, 2000]
    assert row["median_env_steps_to_threshold"] == 1500 and row["final_success"] == [0.58, 0.52]
    assert row["prerequisites"] == {"sft_token_vla_fewshot": 0.42} and row["missing_seeds"] == [2]
    monkeypatch.setitem(recipes.RECIPES, name, recipes.Recipe(3, 0.55, 120))
    assert recipes.rescored([name], tmp_path)[0]["reached"] == 1
    with pytest.raises(SystemExit, match="holds no runs of ppo_push: measure them first"):
        recipes.rescored(["ppo_push"], tmp_path)
