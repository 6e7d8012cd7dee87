"""The package's shape: layers point down (sim <- tasks <- policies <- the rest), no import cycles, and the
three layers import as roborl.sim / roborl.tasks / roborl.policies from anywhere, never as generic names."""
import shutil
import subprocess
import sys

import jedi
from helpers import ROOT

from roborl import layers


def test_the_package_keeps_its_layers_and_has_no_cycles():
    assert layers.violations() == []


def test_a_cycle_and_an_upward_import_are_caught(tmp_path):
    package = tmp_path / "roborl"
    shutil.copytree(ROOT / "roborl", package, ignore=shutil.ignore_patterns("__pycache__"))
    assert layers.violations(package) == []
    (package / "sim" / "registry.py").write_text((package / "sim" / "registry.py").read_text()
                                                 + "\nfrom roborl.policies.act import Act  # noqa\n")
    (package / "config.py").write_text((package / "config.py").read_text() + "\nimport roborl.runner  # noqa\n")
    (package / "algos" / "lagrangian.py").write_text("import sim\n")
    found = layers.violations(package)
    assert "roborl.sim.registry imports roborl.policies.act, a higher layer (layers, bottom up: roborl.wire, roborl.files, " \
           "roborl.sim, roborl.tasks, roborl.policies, roborl)" in found
    assert "roborl.algos.lagrangian imports 'sim': import it as roborl.sim" in found
    cycles = [line for line in found if line.startswith("import cycle: ")]
    assert len(cycles) == 1 and "roborl.config" in cycles[0] and "roborl.runner" in cycles[0], found


def test_the_command_line_check(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "roborl.layers"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok: layers point down, no import cycles", proc.stderr


def test_layers_import_by_their_full_names_only(tmp_path):
    """Outside the repository (no checkout on sys.path) the installed package resolves roborl.sim and its
    siblings, and installs no top-level `sim`, `tasks` or `policies` (PyPI has packages of those names)."""
    code = ("import importlib.util as u, roborl.sim, roborl.tasks, roborl.policies; "
            "print([u.find_spec(n) is None for n in ('sim', 'tasks', 'policies')], roborl.sim.make.__module__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-800:]
    assert proc.stdout.split() == ["[True,", "True,", "True]", "roborl.sim.registry"]


def test_an_editor_resolves_the_layers(tmp_path):
    """Jedi (the completion engine of IPython and of many editors) finds the definitions statically."""
    project = jedi.Project(tmp_path, environment_path=sys.prefix)
    script = jedi.Script("from roborl.tasks.reach import ReachEnv\nReachEnv", path=tmp_path / "x.py", project=project)
    (name,) = script.goto(2, 3, follow_imports=True)
    assert name.full_name == "roborl.tasks.reach.ReachEnv" and name.module_path == ROOT / "roborl" / "tasks" / "reach.py"


def test_ruff_finds_nothing():
    """The lint rules of pyproject.toml ([tool.ruff]) hold on the whole tree."""
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:]
