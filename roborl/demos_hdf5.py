"""The HDF5 demos file of `roborl demos` (robomimic-style, layout in roborl/demos.py): where it is, opening it,
and its episodes, for every reader (BC windows, RLPD transitions, the reward classifier, the LeRobot writer)."""
from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import h5py

from roborl.errors import UserError


def demos_file(path: str | Path) -> Path:
    """`DIR` or `DIR/demos.hdf5` -> the HDF5 file; an existing file is itself, whatever its name."""
    path = Path(path)
    return path if path.is_file() or (path.suffix == ".hdf5" and not path.is_dir()) else path / "demos.hdf5"


@contextmanager
def open_demos(path: str | Path) -> Iterator[tuple[Path, h5py.Group]]:
    """The file of `path` (demos_file) and its `data` group, open for reading. A missing or unreadable file, or one
    without `data`, is one UserError that says how to record demos."""
    path = demos_file(path)
    if not path.is_file():
        raise UserError(f"demonstrations '{path}' do not exist; record them with: roborl demos TASK --episodes N --out DIR")
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise UserError(f"demonstrations '{path}' are not a readable HDF5 file ({exc})") from exc
    with f:
        if "data" not in f:
            raise UserError(f"demonstrations '{path}' have no 'data' group (not a robomimic-style file)")
        yield path, f["data"]


def episode_names(data: h5py.Group, path: Path, keys: Sequence[str] = ("actions", "obs/state")) -> list[str]:
    """The episodes of a demos file's `data` group in recorded order. A group not named demo_N, or an episode
    without one of `keys`, is one UserError: the file was not written by `roborl demos` (or was cut short)."""
    for name in data:
        if not re.fullmatch(r"demo_\d+", name):
            raise UserError(f"demonstrations '{path}' hold 'data/{name}', which is not an episode (demo_N): "
                            "record them with `roborl demos`")
        if missing := [key for key in keys if key not in data[name]]:
            raise UserError(f"demonstrations '{path}': episode '{name}' has no {', '.join(missing)}; record them "
                            "again with `roborl demos`")
    return sorted(data, key=lambda name: int(name.split("_")[1]))
