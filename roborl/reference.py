"""The reference pages of the documentation, generated from the code so that they cannot drift from it:
`docs/reference/config.md` from the config dataclasses (type, default, allowed values from each field's
metadata, meaning from the comments written beside or above the field) and `docs/reference/cli.md` from the
`roborl` argument parser.

`python -m roborl.reference` rewrites both; `python -m roborl.reference --check` exits 1 when a page is not
what the code says (the test suite runs it) or a config key has no comment saying what it means.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import json
import sys
import textwrap
import tokenize
from pathlib import Path
from typing import Any

from roborl.cli import make_parser
from roborl.config import Config
from roborl.config_rules import allowed

PAGES = Path(__file__).resolve().parents[1] / "docs" / "reference"
TABLE = ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]


def field_comments(cls: type) -> dict[str, tuple[str, str]]:
    """Each field's (heading, meaning): the comment lines right above it and the comment at the end of its line(s)
    are its meaning, unless it has both: then the lines above head the group of fields it starts."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    body = ast.parse(source).body[0].body
    out, previous_end = {}, 1
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above = []
            line = node.lineno - 1
            while line > previous_end and line in comments:
                above.insert(0, comments[line])
                line -= 1
            trailing = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments]
            out[node.target.id] = (" ".join(above), " ".join(trailing)) if above and trailing else \
                ("", " ".join(above + trailing))
        previous_end = node.end_lineno
    return out


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def show(value: Any) -> str:
    """A default as it would be written in YAML."""
    if value is dataclasses.MISSING:
        return "required"
    return json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value or '""'


def config_rows(cls: type, prefix: str, sections: list[tuple[str, type]]) -> list[tuple[str, ...]]:
    """(heading, key, type, default, allowed, meaning) for every scalar field; nested sections are queued in
    `sections`."""
    comments = field_comments(cls)
    rows = []
    for f in dataclasses.fields(cls):
        default = default_of(f)
        if dataclasses.is_dataclass(default):
            sections.append((f"{prefix}{f.name}", type(default)))
            continue
        rules = dict(f.metadata)
        limits = ", ".join(filter(None, [" · ".join(rules.pop("choices", ())), allowed(rules) if rules else ""]))
        kind = f.type.__name__ if isinstance(f.type, type) else str(f.type)
        heading, meaning = comments.get(f.name, ("", ""))
        rows.append((heading, f"{prefix}{f.name}", kind, show(default), limits, meaning))
    return rows


def config_page() -> tuple[str, list[str]]:
    """The config reference and the keys that have no meaning written beside them."""
    lines = ["# Config reference", "",
             "Every key a run's YAML may set, and every `section.key=value` a command line may override. "
             "Generated from the dataclasses in `roborl/config.py` (and the policy and randomization configs they "
             "hold) by `python -m roborl.reference`; do not edit by hand.", "",
             "Keys that the chosen `train.algorithm` or `policy.kind` does not read are refused when set "
             "(see [Concepts](../architecture.md#configuration-roborlconfigpy-roborlconfig_rulespy)).", ""]
    missing: list[str] = []
    sections: list[tuple[str, type]] = [(f.name, type(default_of(f))) for f in dataclasses.fields(Config)]
    while sections:
        name, cls = sections.pop(0)
        nested: list[tuple[str, type]] = []
        rows = config_rows(cls, f"{name}.", nested)
        sections[:0] = nested
        doc = inspect.getdoc(cls) if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "(") else ""
        lines += [f"## `{name}`", ""] + ([doc.splitlines()[0], ""] if doc else [])
        started = False
        for heading, key, kind, default, limits, meaning in rows:
            if heading or not started:  # a group of keys with a heading starts a table of its own
                lines += ([""] if started else []) + ([sentence(heading), ""] if heading else []) + TABLE
                started = True
            missing += [key] if not meaning else []
            cells = [f"`{key}`", f"`{kind}`", f"`{default}`", limits, meaning]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        lines.append("")
    return "\n".join(lines), missing


def sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def cli_page() -> str:
    parser = make_parser()
    lines = ["# Command-line reference", "",
             "Every `roborl` command and its options. Generated from `roborl/cli.py` by `python -m roborl.reference`; "
             "do not edit by hand. Every command exits with 2 and one line on standard error when its input is wrong.",
             ""]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in sub._choices_actions}
    for name, command in sub.choices.items():
        lines += [f"## `roborl {name}`", "", sentence(helps.get(name) or ""), "", "```text",
                  command.format_usage().strip().removeprefix("usage: "), "```", "",
                  "| argument | default | meaning |", "|---|---|---|"]
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            label = ", ".join(action.option_strings) or action.dest
            if action.choices:
                label += " {" + ",".join(action.choices) + "}"
            optional = action.nargs in ("?", "*") or not action.required
            shown = not (action.default is None or action.default is False or action.default == []
                         or action.default == argparse.SUPPRESS)  # a default of 0 is shown (0 == False)
            default = "required" if not optional else f"`{action.default}`" if shown else ""
            lines.append(f"| `{label}` | {default} | {(action.help or '').replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines)


def pages() -> tuple[dict[Path, str], list[str]]:
    config, missing = config_page()
    return {PAGES / "config.md": config, PAGES / "cli.md": cli_page() + "\n"}, missing


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write docs/reference/{config,cli}.md from the code.")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page differs from the code")
    args = p.parse_args(argv)
    written, missing = pages()
    if missing:
        print(f"config keys without a comment saying what they mean: {', '.join(missing)}", file=sys.stderr)
        return 1
    stale = [path for path, text in written.items() if not path.is_file() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path} is not what the code says: run `python -m roborl.reference` and commit it", file=sys.stderr)
        return 1 if stale else 0
    PAGES.mkdir(parents=True, exist_ok=True)
    for path in stale:
        path.write_text(written[path])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
