"""The documentation: the site builds with `mkdocs build --strict`, the reference pages are what the code says,
and no markdown file or config refers to the project's development history or to a run directory that
nothing in the repository creates."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from roborl import reference
from roborl.config import load_config

ROOT = Path(__file__).resolve().parents[1]
HISTORY = re.compile(r"\bstops? \d+|\bsessions? \d+|\bruns/s\d+\b", re.IGNORECASE)
RUN_DIR = re.compile(r"\bruns/([A-Za-z0-9_.\-]+)")
DEFAULT_NAME = r"(mujoco|gym|maniskill|libero|isaaclab)_[A-Za-z0-9\-]+_(\d{8}-\d{6})?"  # env id and start time


def documents() -> list[Path]:
    """Every markdown file and config of the repository (not the virtual environments or a built site)."""
    found = [ROOT / "README.md", *sorted((ROOT / "configs").glob("*.yaml"))]
    for folder in ("docs", "roborl", "bench", "scripts", "tests"):
        found += sorted((ROOT / folder).rglob("*.md"))
    return found


def created_run_names() -> set[str]:
    """Run names the repository's recipes and benchmarks create: each config's `train.name` and each
    benchmark's default `runs/...` directory."""
    names = set()
    for config in (ROOT / "configs").glob("*.yaml"):
        name = (yaml.safe_load(config.read_text()) or {}).get("train", {}).get("name")
        names.update([name] if name else [])
    for bench in (ROOT / "bench").glob("*.py"):
        names.update(RUN_DIR.findall(bench.read_text()))
    return names


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """Broken links, missing pages and pages left out of the navigation fail the build."""
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    for page in ("index.html", "getting-started/index.html", "reference/config/index.html", "results/index.html"):
        assert (tmp_path / "site" / page).is_file(), page


def test_the_reference_pages_are_what_the_code_says() -> None:
    assert reference.main(["--check"]) == 0, "run `python -m roborl.reference` and commit docs/reference/"


def test_every_config_key_has_a_meaning_in_the_reference() -> None:
    page, missing = reference.config_page()
    assert not missing
    assert "| `algo.clip` | `float` | `0.2` | in (0, 1) |" in page
    assert "<class" not in page  # a type written as a class is shown by its name
    # comments above a key that also has its own head the group of keys it starts, in a table of their own
    vla = page.split("## `policy.vla`")[1]
    assert "Tiny backbone built from scratch.\n\n| key |" in vla
    assert "| `policy.vla.image_size` | `int` | `64` |  | the vision encoder's input; env images are resized to it |" in vla


def test_a_default_of_zero_is_shown_in_the_command_reference() -> None:
    assert "| `--seed` | `0` | seed of the first episode's initial state |" in reference.cli_page()


def test_nothing_refers_to_the_development_history() -> None:
    hits = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in documents()
            for n, line in enumerate(path.read_text().splitlines(), 1) if HISTORY.search(line)]
    assert not hits, "\n".join(hits)


def name_pattern(name: str) -> str:
    """A run name as written in a command, as a regex: shell variables (`push_s$s`) match any word."""
    return re.sub(r"\\\$(\\\{)?\w+(\\\})?", r"\\w*", re.escape(name))


def test_run_directories_mentioned_are_created_by_something_shown() -> None:
    """A `runs/NAME` in a page or config is made by a recipe or benchmark of the repository, by a command on
    the same page that names it (`train.name=NAME`, `--out runs/NAME`), or is the name a run gets by default
    (`mujoco_Push_<date-time>`); NAME in capitals is a placeholder."""
    known = [re.escape(name) for name in created_run_names()] + [DEFAULT_NAME, r"[A-Z_]+"]
    hits = []
    for path in documents():
        text = path.read_text()
        named = re.findall(r"train\.name[=:]\s*([A-Za-z0-9_.\-${}]+)", text)
        named += re.findall(r"(?:--run-dir|run_dir=|--out)[= ]runs/([A-Za-z0-9_.\-${}]+)", text)
        patterns = known + [name_pattern(name) for name in named]
        for n, line in enumerate(text.splitlines(), 1):
            for name in RUN_DIR.findall(line):
                if not any(re.fullmatch(pattern, name) for pattern in patterns):
                    hits.append(f"{path.relative_to(ROOT)}:{n}: runs/{name}")
    assert not hits, "run directories nothing here creates:\n" + "\n".join(hits)


def test_config_headers_are_one_to_three_lines() -> None:
    long = []
    for config in sorted((ROOT / "configs").glob("*.yaml")):
        lines = config.read_text().splitlines()
        header = next(i for i, line in enumerate(lines) if not line.startswith("#"))
        if not 1 <= header <= 3:
            long.append(f"{config.name}: {header} header lines")
    assert not long, "\n".join(long)


def test_the_readme_is_short_and_its_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    missing = [t for t in targets if not t.startswith("http") and not (ROOT / t).exists()]
    assert targets and not missing, missing


def recipes_bench():
    """bench/recipes.py as a module (bench/ on the path only while it imports)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import recipes
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return recipes


def test_every_shipped_config_is_a_recipe_card_or_says_why_not() -> None:
    """bench/recipes.py trains every shipped recipe over seeds: a new config is a card, a prerequisite (bc_*,
    sft_*) or named with the reason it is not."""
    recipes = recipes_bench()
    configs = {p.stem for p in (ROOT / "configs").glob("*.yaml") if not p.stem.startswith(("bc_", "sft_"))}
    assert configs - set(recipes.RECIPES) - set(recipes.NOT_CARDS) == set()
    assert set(recipes.RECIPES) | set(recipes.NOT_CARDS) <= configs


def test_every_card_starts_from_a_stage_the_bench_can_train() -> None:
    """A card whose `policy.init` or `residual.base` is a path under runs/ names the BC / SFT config that
    bench/recipes.py trains (and exports, for `runs/<stage>/pretrained`) before its seeds."""
    recipes = recipes_bench()
    starts = {}
    for name in recipes.RECIPES:
        cfg = load_config(ROOT / "configs" / f"{name}.yaml", [])
        for value in (cfg.policy.init, cfg.residual.base):
            if value and value.startswith("runs/"):
                starts[value] = recipes.pretraining_stage(value)
    assert starts["runs/bc_act_pickplace/pretrained"] == "bc_act_pickplace"
    assert not [value for value, stage in starts.items() if not (stage and (ROOT / f"configs/{stage}.yaml").is_file())]
