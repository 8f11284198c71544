"""Reading benchmark rows (local files or the Hugging Face Hub) and turning them into Examples.

Three pieces, one module each; this module joins them and keeps every name importable from here:

* **readers** (:mod:`anchored_reasoning.tasks.readers`) yield ``(where, row)`` pairs from a local
  file: ``.jsonl``/``.json``/``.csv``, optionally gzipped. ``where`` names the file and the line
  (row index), and goes into every error message.
* **remote sources** (:mod:`anchored_reasoning.tasks.remote`) yield the same pairs from a task's
  pinned Hub data set, Hub files or URLs (``data.hub`` in the YAML).
* **row hooks** (:mod:`anchored_reasoning.tasks.row_hooks`, ``ROW_HOOKS``, referenced by name from a
  task YAML's ``data.loader``, or as ``"package.module:function"``) turn one row dict into an
  :class:`Example`. They raise :class:`RowError` on a malformed row; :func:`load_examples` re-raises it
  as :class:`~anchored_reasoning.errors.DataError` prefixed with the file and line.

Every row is validated, including the gold answer: an unparseable gold is an error.
GPQA question text is never put into an error message or a log line (licence terms).
"""
from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.tasks.readers import read_rows
from anchored_reasoning.tasks.remote import download_url, hub_rows
from anchored_reasoning.tasks.row_hooks import (
    LETTERS,
    ROW_HOOKS,
    RowContext,
    RowError,
    RowHook,
    aime_gold,
    aime_row,
    field_int,
    field_list_of_str,
    field_str,
    fields_row,
    first_present,
    gpqa_row,
    gsm8k_row,
    humaneval_row,
    prontoqa_row,
    prosqa_row,
    row_id,
    text_lines,
)
from anchored_reasoning.types import Example

__all__ = [
    "LETTERS", "ROW_HOOKS", "RowContext", "RowError", "RowHook", "aime_gold", "aime_row", "download_url",
    "field_int", "field_list_of_str", "field_str", "fields_row", "first_present", "gpqa_row", "gsm8k_row",
    "hub_rows", "humaneval_row", "load_examples", "prontoqa_row", "prosqa_row", "read_rows", "resolve_hook",
    "row_id", "text_lines",
]


def resolve_hook(name: str, table: dict[str, Any], kind: str) -> Any:
    """A hook by registered name, or by import path ``"package.module:function"``."""
    if name in table:
        return table[name]
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            return getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"{kind} {name!r} cannot be imported: {exc}") from exc
    raise ConfigError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table))} (or 'package.module:function')")


def load_examples(
    task: str,
    rows: Iterator[tuple[str, dict[str, Any]]],
    hook: RowHook,
    split: str,
    options: dict[str, Any],
) -> list[Example]:
    """Convert and validate every row; ids must be unique within the split."""
    examples: list[Example] = []
    seen: dict[str, str] = {}
    for index, (where, row) in enumerate(rows):
        try:
            example = hook(row, RowContext(index=index, split=split, options=options))
        except RowError as exc:
            raise DataError(f"{where}: {exc} (task {task!r}, split {split!r})") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a user hook's own checks
            raise DataError(
                f"{where}: the row loader failed with {type(exc).__name__}: {exc} (task {task!r}, split {split!r})"
            ) from exc
        if not isinstance(example, Example):
            raise DataError(f"{where}: the row hook returned {type(example).__name__}, not an Example")
        if example.id in seen:
            raise DataError(f"{where}: duplicate example id {example.id!r} (first at {seen[example.id]})")
        seen[example.id] = where
        examples.append(example)
    if not examples:
        raise DataError(f"task {task!r}, split {split!r}: the data source has no rows")
    return examples
