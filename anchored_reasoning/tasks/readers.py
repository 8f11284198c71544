"""Reading local benchmark files: each reader yields ``(where, row)`` pairs.

Formats: ``.jsonl``/``.jsonl.gz`` (one JSON object per line), ``.json``/``.json.gz`` (a JSON list
of objects), ``.csv``/``.csv.gz``. ``where`` names the file and the line (row index) and goes into
every error message; a file that cannot be read or parsed is a
:class:`~anchored_reasoning.errors.DataError` naming it.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from anchored_reasoning.errors import DataError


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def _format_of(path: Path | str) -> str:
    name = str(path).lower()
    if name.endswith(".gz"):
        name = name[:-3]
    for fmt in ("jsonl", "json", "csv"):
        if name.endswith("." + fmt):
            return fmt
    raise DataError(f"{path}: unknown data file format (expected .jsonl, .json or .csv, optionally .gz)")


def read_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(where, row)`` for each row of a local file; ``where`` names file and line."""
    fmt = _format_of(path)
    if not path.is_file():
        raise DataError(f"data file {path} not found")
    try:
        if fmt == "jsonl":
            yield from _read_jsonl(path)
        elif fmt == "json":
            yield from _read_json(path)
        else:
            yield from _read_csv(path)
    except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile) as exc:
        raise DataError(f"{path}: cannot read file: {exc}") from exc


def _read_jsonl(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    with _open_text(path) as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
            yield where, row


def _read_json(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    with _open_text(path) as handle:
        try:
            data = json.load(handle)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of objects, got {type(data).__name__}")
    for index, row in enumerate(data):
        where = f"{path}: item {index}"
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
        yield where, row


def _read_csv(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    with _open_text(path) as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames:
            raise DataError(f"{path}: empty CSV (no header line)")
        start = reader.line_num + 1
        try:
            for index, row in enumerate(reader):
                where = f"{path}: row {index} (line {start})"
                start = reader.line_num + 1
                if None in row:
                    raise DataError(f"{where}: more fields than the header has")
                missing = [k for k, v in row.items() if v is None]
                if missing:
                    raise DataError(f"{where}: missing fields {missing[:5]} (row is shorter than the header)")
                yield where, row
        except csv.Error as exc:
            raise DataError(f"{path}: line {reader.line_num}: malformed CSV ({exc})") from None
