"""Batched trees: the one set of helpers for (nested) dicts whose leaves are tensors with a leading batch
dimension, or lists with one item per row (instructions). Observations, infos, rollouts and minibatches are
all such trees; every part of roborl selects, joins and moves them with these functions."""
from __future__ import annotations

from typing import Any

import torch

Tree = Any  # a tensor, a list (one item per row), a dict of trees, or anything else (kept as it is)


def take(tree: Tree, index: torch.Tensor) -> Tree:
    """The rows `index` (long indices, or a boolean mask over the leading dimension(s)) of every leaf."""
    if isinstance(tree, torch.Tensor):
        return tree[index.to(tree.device)]
    if isinstance(tree, dict):
        return {k: take(v, index) for k, v in tree.items()}
    if isinstance(tree, list):
        rows = index.nonzero().flatten() if index.dtype == torch.bool else index
        return [tree[i] for i in rows.tolist()]
    return tree


def concat(parts: list[Tree], dim: int = 0) -> Tree:
    """The trees joined along `dim` (lists end to end); leaves that are neither come from the first."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts, dim=dim)
    if isinstance(first, dict):
        return {k: concat([p[k] for p in parts], dim) for k in first}
    if isinstance(first, list):
        return [x for p in parts for x in p]
    return first


def stack(parts: list[Tree]) -> Tree:
    """The trees stacked along a new leading dimension (e.g. the steps of a rollout: T×N)."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(parts)
    if isinstance(first, dict):
        return {k: stack([p[k] for p in parts]) for k in first}
    return first


def clone(tree: Tree) -> Tree:
    if isinstance(tree, torch.Tensor):
        return tree.clone()
    if isinstance(tree, dict):
        return {k: clone(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return list(tree)
    return tree


def merge_rows(dst: dict, src: dict, mask: torch.Tensor) -> None:
    """dst[mask] = src[mask] for every key, in place."""
    for key, value in src.items():
        if isinstance(value, torch.Tensor):
            dst[key][mask] = value[mask]
        elif isinstance(value, dict):
            merge_rows(dst[key], value, mask)
        else:
            for i in mask.nonzero().flatten().tolist():
                dst[key][i] = value[i]


def zeros_like_rows(example: Tree, n: int) -> Tree:
    """A tree shaped like `example` with `n` rows of zeros (False, empty strings)."""
    if isinstance(example, torch.Tensor):
        return torch.zeros((n, *example.shape[1:]), dtype=example.dtype, device=example.device)
    if isinstance(example, dict):
        return {k: zeros_like_rows(v, n) for k, v in example.items()}
    if isinstance(example, list):
        return [""] * n
    return example


def to_device(tree: Tree, device: torch.device | str) -> Tree:
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, dict):
        return {k: to_device(v, device) for k, v in tree.items()}
    return tree
