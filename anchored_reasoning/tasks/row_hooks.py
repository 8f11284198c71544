"""Per-task row hooks: one row dict of a benchmark file in, one validated :class:`Example` out.

``ROW_HOOKS`` maps the names a task YAML's ``data.loader`` uses to the hooks; a YAML may also
name its own hook as ``"package.module:function"`` (resolved by
:func:`anchored_reasoning.tasks.loaders.resolve_hook`). A hook raises :class:`RowError` on a
malformed row; :func:`~anchored_reasoning.tasks.loaders.load_examples` re-raises it as a
:class:`~anchored_reasoning.errors.DataError` prefixed with the file and line.

Every row is validated, including the gold answer: an unparseable gold is an error.
GPQA question text is never put into an error message or a log line (licence terms).
"""
from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from anchored_reasoning.types import Example

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
