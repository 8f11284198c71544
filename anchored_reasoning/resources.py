"""Where the built-in YAML folders (tasks/, train/, eval/) are found.

In a source checkout (editable install) they are the top-level folders of the repository;
in an installed wheel the same files are package data under ``anchored_reasoning/_builtin/`` (setup.py
maps the folders there; nothing copies them).
``ANCHORED_REASONING_<NAME>_DIR`` (e.g. ``ANCHORED_REASONING_TASKS_DIR``) adds a user folder
that is searched first.
"""
from __future__ import annotations

import os
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def builtin_dir(name: str) -> Path:
    """The built-in folder ``name`` ("tasks", "train" or "eval")."""
    checkout = _PKG.parent / name
    if checkout.is_dir() and (_PKG.parent / "pyproject.toml").is_file():
        return checkout
    return _PKG / "_builtin" / name


def search_dirs(name: str) -> list[Path]:
    """User folder from the environment first, then the built-in one."""
    dirs = []
    extra = os.environ.get(f"ANCHORED_REASONING_{name.upper()}_DIR")
    if extra:
        dirs.extend(Path(p) for p in extra.split(os.pathsep) if p)
    dirs.append(builtin_dir(name))
    return dirs


def data_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """The local data folder: ``explicit`` if given, else ``$ANCHORED_REASONING_DATA``, else None (use the Hub)."""
    value = explicit if explicit is not None else os.environ.get("ANCHORED_REASONING_DATA")
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        from anchored_reasoning.errors import DataError

        raise DataError(f"data directory {path} does not exist (from {'data_dir' if explicit else '$ANCHORED_REASONING_DATA'})")
    return path
