"""Reading benchmark rows (local files or the Hugging Face Hub) and turning them into Examples.

Longer than ~400 lines on purpose: the readers and the table of small per-task row hooks are
the module's content; each hook is a few lines and reads best beside its siblings.

Two layers:

* **readers** yield ``(where, row)`` pairs from a file: ``.jsonl``/``.jsonl.gz`` (one JSON
  object per line), ``.json``/``.json.gz`` (a JSON list of objects), ``.csv``/``.csv.gz``.
  ``where`` names the file and the line (row index), and goes into every error message.
* **row hooks** (``ROW_HOOKS``, referenced by name from a task YAML's ``data.loader``, or
  as ``"package.module:function"``) turn one row dict into an :class:`Example`. They raise
  :class:`RowError` on a malformed row; :func:`load_examples` re-raises it as
  :class:`~anchored_reasoning.errors.DataError` prefixed with the file and line.

Every row is validated, including the gold answer: an unparseable gold is an error.
GPQA question text is never put into an error message or a log line (licence terms).
"""
from __future__ import annotations

import csv
import gzip
import hashlib
import importlib
import io
import json
import logging
import os
import random
import re
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.types import Example

logger = logging.getLogger(__name__)

LETTERS = "ABCDEFGHIJ"


class RowError(ValueError):
    """A malformed row; the loader adds the file and line to the message."""


@dataclass
class RowContext:
    """What a row hook knows besides the row: its position, the split and the task options."""

    index: int
    split: str
    options: dict[str, Any] = field(default_factory=dict)


RowHook = Callable[[dict[str, Any], RowContext], Example]

# ----------------------------------------------------------------------------- field helpers


def field_str(row: dict[str, Any], key: str, *, allow_empty: bool = False) -> str:
    if key not in row:
        raise RowError(f"missing key {key!r} (row has: {', '.join(sorted(map(str, row)))})")
    value = row[key]
    if not isinstance(value, str):
        raise RowError(f"key {key!r} must be a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise RowError(f"key {key!r} is empty")
    return value


def field_list_of_str(row: dict[str, Any], key: str) -> list[str]:
    if key not in row:
        raise RowError(f"missing key {key!r} (row has: {', '.join(sorted(map(str, row)))})")
    value = row[key]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RowError(f"key {key!r} must be a list of strings, got {type(value).__name__}")
    return list(value)


def field_int(row: dict[str, Any], key: str) -> int:
    if key not in row:
        raise RowError(f"missing key {key!r} (row has: {', '.join(sorted(map(str, row)))})")
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise RowError(f"key {key!r} must be an integer, got {type(value).__name__}")
    return value


def row_id(value: Any, ctx: "RowContext") -> str:
    """The row's own id when it has one, else ``<split>-<index>``."""
    return str(value) if value not in (None, "") else f"{ctx.split}-{ctx.index}"


def text_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def first_present(row: dict[str, Any], keys: list[str]) -> str:
    for key in keys:
        if key in row:
            return key
    raise RowError(f"missing key: none of {keys} present (row has: {', '.join(sorted(map(str, row)))})")


# ----------------------------------------------------------------------------- GSM8K

_CALC = re.compile(r"<<([^<>]*)>>")
_GSM8K_GOLD = re.compile(r"^\s*-?\d[\d,]*(\.\d+)?\s*$")


def gsm8k_row(row: dict[str, Any], ctx: RowContext) -> Example:
    """``{"question", "answer"}``; the answer is the solution text, ending ``#### N``.

    ``steps`` are the solution lines *without* the ``<<a*b=c>>`` calculator annotations
    (the text a reader sees); the annotations are kept per step in
    ``meta["calculations"]`` (e.g. ``[["16-3-4=9"], ["9*2=18"]]``) and the untouched text
    in ``meta["solution"]``. ``answer`` is the number after ``####`` with commas removed.
    """
    question = field_str(row, "question")
    solution = field_str(row, "answer")
    body, sep, final = solution.rpartition("####")
    if not sep:
        raise RowError("gold solution has no '#### <answer>' line")
    final = final.strip()
    if not _GSM8K_GOLD.match(final):
        raise RowError(f"gold answer after '####' is not a number: {final[:40]!r}")
    lines = text_lines(body)
    steps = [_CALC.sub("", line).strip() for line in lines]
    calculations = [_CALC.findall(line) for line in lines]
    return Example(
        id=f"{ctx.split}-{ctx.index}",
        question=question.strip(),
        answer=final.replace(",", ""),
        steps=steps,
        meta={"solution": solution, "calculations": calculations},
    )


# ----------------------------------------------------------------------------- AIME


def aime_gold(value: Any) -> str:
    """An AIME answer: an integer 0..999, given as int or (possibly zero-padded) string."""
    if isinstance(value, bool):
        raise RowError(f"AIME answer must be an integer 0-999, got {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"\s*\d{1,4}\s*", value):
        number = int(value)
    else:
        raise RowError(f"AIME answer must be an integer 0-999, got {str(value)[:40]!r}")
    if not 0 <= number <= 999:
        raise RowError(f"AIME answer must be an integer 0-999, got {number}")
    return str(number)


def aime_row(row: dict[str, Any], ctx: RowContext) -> Example:
    """Rows with ``problem`` (or ``question``) and ``answer``; optional ``id``, ``solution``, ``url``."""
    question = field_str(row, first_present(row, ["problem", "question", "Problem"]))
    answer_key = first_present(row, ["answer", "Answer"])
    answer = aime_gold(row[answer_key])
    rid = row.get("id", row.get("ID"))
    solution = row.get("solution") if isinstance(row.get("solution"), str) else None
    meta = {k: row[k] for k in ("url", "year") if k in row and row[k] is not None}
    if solution:
        meta["solution"] = solution
    steps = text_lines(solution) if solution else []
    return Example(id=row_id(rid, ctx), question=question.strip(), answer=answer, steps=steps, meta=meta)


# ----------------------------------------------------------------------------- GPQA


def gpqa_row(row: dict[str, Any], ctx: RowContext) -> Example:
    """The GPQA CSV: ``Question``, ``Correct Answer``, ``Incorrect Answer 1..3``, ``Record ID``.

    The four options are shuffled with ``random.Random(f"{seed}:{record_id}")`` (seed from
    the YAML's ``data.options.shuffle_seed``, default 0), so the order of one question does
    not depend on which other rows were loaded; ``answer`` is the correct letter.
    """
    seed = ctx.options.get("shuffle_seed", 0)
    question = field_str(row, "Question")
    correct = field_str(row, "Correct Answer").strip()
    wrong = [field_str(row, f"Incorrect Answer {i}").strip() for i in (1, 2, 3)]
    record_id = str(row.get("Record ID") or f"{ctx.split}-{ctx.index}")
    if correct in wrong:
        raise RowError("the correct answer is identical to an incorrect one")
    options = [correct, *wrong]
    random.Random(f"{seed}:{record_id}").shuffle(options)
    letter = LETTERS[options.index(correct)]
    meta = {"record_id": record_id, "shuffle_seed": seed}
    for key, name in (("Subdomain", "subdomain"), ("High-level domain", "domain")):
        if row.get(key):
            meta[name] = row[key]
    return Example(id=record_id, question=question.strip(), answer=letter, choices=options, meta=meta)


# ----------------------------------------------------------------------------- HumanEval


def humaneval_row(row: dict[str, Any], ctx: RowContext) -> Example:
    """``task_id, prompt, entry_point, canonical_solution, test``; the question is the prompt."""
    task_id = field_str(row, "task_id")
    prompt = field_str(row, "prompt")
    entry_point = field_str(row, "entry_point")
    solution = field_str(row, "canonical_solution")
    test = field_str(row, "test")
    if f"def {entry_point}" not in prompt:
        raise RowError(f"entry_point {entry_point!r} is not defined in the prompt")
    if "def check" not in test:
        raise RowError("test has no 'def check(candidate)'")
    return Example(
        id=task_id,
        question=prompt,
        answer=solution,
        meta={
            "task_id": task_id,
            "prompt": prompt,
            "entry_point": entry_point,
            "canonical_solution": solution,
            "test": test,
        },
    )


# ----------------------------------------------------------------------------- ProntoQA / ProsQA


def prontoqa_row(row: dict[str, Any], ctx: RowContext) -> Example:
    """Coconut format ``{"question", "steps", "answer"}``; answer "True" or "False"."""
    question = field_str(row, "question")
    steps = field_list_of_str(row, "steps")
    answer = field_str(row, "answer").strip()
    if answer not in ("True", "False"):
        raise RowError(f"answer must be 'True' or 'False', got {answer[:20]!r}")
    return Example(id=f"{ctx.split}-{ctx.index}", question=question.strip(), answer=answer, steps=steps)


_PROSQA_ANSWER = re.compile(r"^\s*(\S+) is an? (\S+?)\.?\s*$")


def prosqa_row(row: dict[str, Any], ctx: RowContext) -> Example:
    """Coconut ProsQA: ``question, answer, steps, idx_to_symbol, edges, root, target, neg_target``.

    ``answer`` stays the sentence ("Tom is a lempus."); the concept graded is
    ``meta["answer_concept"]`` (= ``idx_to_symbol[target]``), the wrong option
    ``meta["neg_concept"]``, the entity ``meta["entity"]``. The graph fields are kept in meta.
    """
    question = field_str(row, "question")
    answer = field_str(row, "answer")
    steps = field_list_of_str(row, "steps")
    symbols = field_list_of_str(row, "idx_to_symbol")
    edges = row.get("edges")
    if not isinstance(edges, list) or not all(
        isinstance(e, list) and len(e) == 2 and all(isinstance(i, int) for i in e) for e in edges
    ):
        raise RowError("key 'edges' must be a list of [int, int] pairs")
    root, target, neg = (field_int(row, k) for k in ("root", "target", "neg_target"))
    for key, value in (("root", root), ("target", target), ("neg_target", neg)):
        if not 0 <= value < len(symbols):
            raise RowError(f"{key}={value} is outside idx_to_symbol (length {len(symbols)})")
    match = _PROSQA_ANSWER.match(answer)
    if not match:
        raise RowError(f"answer is not of the form '<entity> is a <concept>.': {answer[:60]!r}")
    entity, concept = match.group(1), match.group(2)
    if concept != symbols[target] or entity != symbols[root]:
        raise RowError(
            f"answer {answer!r} disagrees with idx_to_symbol[root/target] = {symbols[root]!r}/{symbols[target]!r}"
        )
    return Example(
        id=f"{ctx.split}-{ctx.index}",
        question=question.strip(),
        answer=answer.strip(),
        steps=steps,
        meta={
            "answer_concept": concept,
            "neg_concept": symbols[neg],
            "entity": entity,
            "idx_to_symbol": symbols,
            "edges": edges,
            "root": root,
            "target": target,
            "neg_target": neg,
        },
    )


# ----------------------------------------------------------------------------- generic


def fields_row(row: dict[str, Any], ctx: RowContext) -> Example:
    """A generic hook for user tasks: map columns with ``data.options``.

    Options: ``question`` (column, default "question"), ``answer`` (default "answer"),
    ``id`` (optional column), ``steps`` (optional column: list of strings, or a string split
    into lines), ``choices`` (optional column: list of strings), ``strip_answer`` (default true).
    """
    opts = ctx.options
    question = field_str(row, opts.get("question", "question"))
    answer_key = opts.get("answer", "answer")
    if answer_key not in row:
        raise RowError(f"missing key {answer_key!r} (row has: {', '.join(sorted(map(str, row)))})")
    raw = row[answer_key]
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise RowError(f"key {answer_key!r} must be a string or number, got {type(raw).__name__}")
    answer = str(raw).strip() if opts.get("strip_answer", True) else str(raw)
    if not answer:
        raise RowError(f"key {answer_key!r} is empty")
    steps: list[str] = []
    if opts.get("steps"):
        value = row.get(opts["steps"])
        if isinstance(value, str):
            steps = text_lines(value)
        elif value is not None:
            steps = field_list_of_str(row, opts["steps"])
    choices = field_list_of_str(row, opts["choices"]) if opts.get("choices") else None
    rid = row.get(opts["id"]) if opts.get("id") else None
    return Example(id=row_id(rid, ctx), question=question.strip(), answer=answer, steps=steps, choices=choices)


ROW_HOOKS: dict[str, RowHook] = {
    "gsm8k": gsm8k_row,
    "aime": aime_row,
    "gpqa": gpqa_row,
    "humaneval": humaneval_row,
    "prontoqa": prontoqa_row,
    "prosqa": prosqa_row,
    "fields": fields_row,
}


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


# ----------------------------------------------------------------------------- readers


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


# ----------------------------------------------------------------------------- remote sources


def _cache_root() -> Path:
    base = os.environ.get("ANCHORED_REASONING_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "anchored_reasoning"
    )
    return Path(base) / "downloads"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download_url(url: str, sha256: str | None = None) -> Path:
    """Download ``url`` once into the cache; check its SHA-256 when one is pinned."""
    key = hashlib.sha256(url.encode()).hexdigest()[:16]
    target = _cache_root() / key / url.rsplit("/", 1)[-1]
    if not target.is_file() or (sha256 and _sha256(target) != sha256):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".part")
        logger.info("downloading %s", url)
        try:
            request = urllib.request.Request(url, headers={"User-Agent": "anchored-reasoning"})
            with urllib.request.urlopen(request, timeout=60) as response, open(tmp, "wb") as out:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
        except OSError as exc:
            raise DataError(
                f"cannot download {url}: {exc}. Without network, set $ANCHORED_REASONING_DATA "
                "(or pass data_dir=) to a folder of local copies"
            ) from exc
        tmp.replace(target)
    if sha256 and _sha256(target) != sha256:
        raise DataError(f"{url}: SHA-256 {_sha256(target)} differs from the pinned {sha256}; the source changed")
    return target


def _hub_hint(task: str) -> str:
    return (
        f"loading task {task!r} from the Hugging Face Hub failed. Without network, set "
        "$ANCHORED_REASONING_DATA (or pass data_dir=) to a folder laid out like the project's "
        "shared/data; for gated data sets (GPQA) accept the terms on the Hub and run `hf auth login`"
    )


def hub_rows(task: str, hub: dict[str, Any], split: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Rows of ``split`` from the task's remote source (``data.hub`` in the YAML).

    ``kind: datasets``  -> ``datasets.load_dataset(path, name, split=..., revision=...)``;
    ``kind: hub_files`` -> ``huggingface_hub.hf_hub_download`` of data-set files at a revision;
    ``kind: urls``      -> plain downloads (e.g. raw GitHub files at a commit), SHA-256 checked;
    ``kind: none``      -> no public source; the YAML's ``message`` says how to get the data.
    """
    kind = hub.get("kind", "datasets")
    if kind == "none":
        raise DataError(f"task {task!r} has no remote source: {hub.get('message', 'use local files (data_dir)')}")
    splits = hub.get("splits") or {}
    if split not in splits:
        raise DataError(f"task {task!r}: split {split!r} is not available from the Hub source (has: {', '.join(splits)})")
    spec = splits[split]
    revision = hub.get("revision")
    if kind == "datasets":
        try:
            import datasets
        except ImportError as exc:  # pragma: no cover - datasets is a dependency
            raise DataError("the 'datasets' package is needed to load from the Hub") from exc
        try:
            dataset = datasets.load_dataset(hub["path"], hub.get("name"), split=spec, revision=revision)
        except Exception as exc:  # network, auth, missing revision: all end here
            raise DataError(f"{_hub_hint(task)} ({hub['path']}@{revision}: {type(exc).__name__}: {exc})") from exc
        label = f"{hub['path']}@{(revision or 'main')[:12]} split {spec}"
        for index, row in enumerate(dataset):
            yield f"{label} row {index}", dict(row)
        return
    files = [spec] if isinstance(spec, str) else list(spec)
    for entry in files:
        if kind == "hub_files":
            try:
                from huggingface_hub import hf_hub_download

                local = Path(hf_hub_download(repo_id=hub["path"], filename=entry, repo_type="dataset", revision=revision))
            except Exception as exc:
                raise DataError(f"{_hub_hint(task)} ({hub['path']}/{entry}@{revision}: {type(exc).__name__}: {exc})") from exc
        elif kind == "urls":
            url, sha = (entry["url"], entry.get("sha256")) if isinstance(entry, dict) else (entry, None)
            local = download_url(url, sha)
        else:
            raise ConfigError(f"task {task!r}: data.hub.kind {kind!r} is not one of datasets, hub_files, urls, none")
        yield from read_rows(local)


# ----------------------------------------------------------------------------- the loader


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
