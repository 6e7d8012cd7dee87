"""Writing a file or a folder so that nobody ever sees half of it.

Every writer in roborl (checkpoints, exports, demos, datasets, results, plots) writes to a temporary name beside
its target and renames it over the target at the end, which POSIX makes atomic. `atomic_write` is that pattern,
once: a reader, a crash or a kill leaves either the old target or the new one, and a failed write leaves
nothing behind, not even the folders it made. Temporary names are `.<name>.tmp-<pid>…`, the pattern that
`run_dir.claim` sweeps from a run directory a kill interrupted.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_write(path: str | Path, suffix: str = "", sync: bool = False) -> Iterator[Path]:
    """A temporary path beside `path` for the block to write a file or a folder to, renamed over `path` when the
    block ends; removed, with the parent folders made for it, when the block raises. `suffix` ends the temporary
    name (for writers that pick their format by it: `.png`, `.npz`); `sync` flushes a file to disk before the
    rename (a checkpoint must survive a power cut). A folder replaces only a missing or empty `path`."""
    path = Path(path)
    made, parent = [], path.parent
    while not parent.exists():
        made.append(parent)
        parent = parent.parent
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}{suffix}")
    try:
        yield tmp
        if sync:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        for folder in made:
            if folder.exists() and not any(folder.iterdir()):
                folder.rmdir()
        raise


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def unwritable(path: str | Path, folder: bool = False) -> str | None:
    """Why a file (a folder with `folder`) cannot be written at `path`, or None: a command checks its outputs
    before its work, so that a typo in a path does not fail it at the end."""
    path = Path(path).expanduser()
    if path.exists() and path.is_dir() != folder:
        return f"'{path}' is a {'file' if folder else 'folder'}; give a {'folder' if folder else 'file'}"
    nearest = next(p for p in (path, *path.parents) if p.exists())
    if not nearest.is_dir():
        return f"'{nearest}' is a file, so nothing can be written under it"
    if not os.access(nearest, os.W_OK | os.X_OK):
        return f"'{nearest}' is not writable by this user"
    return None
