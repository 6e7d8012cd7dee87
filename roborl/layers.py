"""The import graph of roborl and the rules it must keep: the layers point down and nothing imports in a circle.

    roborl.wire, roborl.files  <-  roborl.sim  <-  roborl.tasks  <-  roborl.policies  <-  the rest of roborl

`roborl.sim` knows no task, policy or trainer; `roborl.tasks` knows simulators only; `roborl.policies` knows
no simulator or task (it sees observation dicts). Every import counts, also one inside a function or under
`TYPE_CHECKING` (as import-linter counts them): a lazy import still ties two modules together.

`python -m roborl.layers` prints the violations (exit 1) or "ok" (exit 0); the test suite runs it.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parent
# bottom first; everything else in roborl is on top. roborl.wire (the msgpack codec) and roborl.files (atomic
# writes) import nothing of roborl.
LAYERS = ("roborl.wire", "roborl.files", "roborl.sim", "roborl.tasks", "roborl.policies")
GENERIC = ("sim", "tasks", "policies")  # old top-level names: importable from nowhere


def module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, name: str, modules: set[str]) -> set[str]:
    """The modules of the tree that `path` (module `name`) imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found.update(targets)
    return found


def import_graph(package: Path = PACKAGE) -> nx.DiGraph:
    """Modules of the package (nodes) and who imports whom (edges), plus imports of the generic names."""
    files = {module_name(p, package): p for p in sorted(package.rglob("*.py"))}
    modules = set(files)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in files.items():
        for target in imports_of(path, name, modules):
            top = target.split(".")[0]
            if target in modules or top in GENERIC:
                graph.add_edge(name, target)
    return graph


def layer_of(module: str) -> int:
    for i, layer in enumerate(LAYERS):
        if module == layer or module.startswith(layer + "."):
            return i
    return len(LAYERS)


def violations(package: Path = PACKAGE) -> list[str]:
    """One line per broken rule: an upward import, an import of a generic top-level name, a cycle."""
    graph = import_graph(package)
    out = []
    for a, b in sorted(graph.edges):
        if b.split(".")[0] in GENERIC:
            out.append(f"{a} imports '{b}': import it as roborl.{b}")
        elif layer_of(b) > layer_of(a):
            out.append(f"{a} imports {b}, a higher layer (layers, bottom up: {', '.join(LAYERS)}, roborl)")
    for cycle in sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1):
        loop = nx.find_cycle(graph.subgraph(cycle))
        out.append("import cycle: " + " -> ".join([a for a, _ in loop] + [loop[0][0]]))
    return out


def main() -> int:
    found = violations()
    print("\n".join(found) if found else "ok: layers point down, no import cycles")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
