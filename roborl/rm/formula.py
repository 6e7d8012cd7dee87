"""Propositional formulas over label names: `a & !b | (c & ~d)`, `true`, `false`.

`!` and `~` negate, `&` binds tighter than `|`. Parsed once into a small tree and evaluated on the set
of labels that hold. The reward-machine text format, the Python builder and LTLf-compiled automata all
write their guards in this syntax.
"""
from __future__ import annotations

import re

TOKEN = re.compile(r"\s*(?:(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>[!~&|()]))")

Formula = tuple  # ("var", name) | ("const", bool) | ("not", f) | ("and", f, g) | ("or", f, g)


class FormulaError(ValueError):
    pass


def parse(text: str) -> Formula:
    tokens: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise FormulaError(f"formula '{text}': unexpected character at position {pos}: {text[pos:pos + 10]!r}")
        tokens.append(m.group("name") or m.group("op"))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    if not tokens:
        raise FormulaError("empty formula (use 'true' for an unconditional edge)")
    tree, rest = _or(tokens, text)
    if rest:
        raise FormulaError(f"formula '{text}': unexpected '{rest[0]}'")
    return tree


def _or(tokens: list[str], text: str) -> tuple[Formula, list[str]]:
    return _chain(tokens, text, "|", "or", _and)


def _and(tokens: list[str], text: str) -> tuple[Formula, list[str]]:
    return _chain(tokens, text, "&", "and", _unary)


def _chain(tokens: list[str], text: str, symbol: str, kind: str, operand) -> tuple[Formula, list[str]]:
    """operand (symbol operand)*, left-associative."""
    left, tokens = operand(tokens, text)
    while tokens and tokens[0] == symbol:
        right, tokens = operand(tokens[1:], text)
        left = (kind, left, right)
    return left, tokens


def _unary(tokens: list[str], text: str) -> tuple[Formula, list[str]]:
    if not tokens:
        raise FormulaError(f"formula '{text}' ends too early")
    head, rest = tokens[0], tokens[1:]
    if head in ("!", "~"):
        inner, rest = _unary(rest, text)
        return ("not", inner), rest
    if head == "(":
        inner, rest = _or(rest, text)
        if not rest or rest[0] != ")":
            raise FormulaError(f"formula '{text}': missing ')'")
        return inner, rest[1:]
    if head in ("&", "|", ")"):
        raise FormulaError(f"formula '{text}': unexpected '{head}'")
    if head.lower() in ("true", "false"):
        return ("const", head.lower() == "true"), rest
    return ("var", head), rest


def evaluate(tree: Formula, true_labels: set[str] | frozenset[str]) -> bool:
    kind = tree[0]
    if kind == "var":
        return tree[1] in true_labels
    if kind == "const":
        return tree[1]
    if kind == "not":
        return not evaluate(tree[1], true_labels)
    if kind == "and":
        return evaluate(tree[1], true_labels) and evaluate(tree[2], true_labels)
    return evaluate(tree[1], true_labels) or evaluate(tree[2], true_labels)


def variables(tree: Formula) -> set[str]:
    if tree[0] == "var":
        return {tree[1]}
    if tree[0] == "const":
        return set()
    return set().union(*(variables(t) for t in tree[1:]))
