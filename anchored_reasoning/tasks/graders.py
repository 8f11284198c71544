"""Graders: ``(completion, example, extract, **options) -> Grade``.

Registered in ``GRADERS`` and referenced by name from a task YAML (``grader:``), with
``grader_options`` passed as keyword arguments. ``extract`` is the task's extractor
(see :mod:`anchored_reasoning.tasks.extract`).

* ``gsm8k``: the headline answer (the task's extractor, ``gsm8k_answer``: markers, else the
  stated result, never the number a token-capped loop ends on), strict (markers only) and
  flexible (the last number) extraction, each compared to the gold number with math-verify.
  ``correct`` = the headline; ``details = {"strict", "flexible", "strict_extracted",
  "flexible_extracted", "answer_rule"}``. The completion's ``finish_reason`` reaches the
  extractor when it takes one (:func:`accepts_keyword`).
* ``math``: the extracted answer compared with math-verify; with ``integer_range: [lo, hi]``
  (AIME: [0, 999]) the answer must also be an integer in that range.
* ``exact``: the extracted string equals the gold (``gold_field`` in ``example.meta``, or
  ``example.answer``), optionally case-insensitive. Letters, True/False, concepts.
* ``humaneval``: execution in the sandbox, delegated to
  ``anchored_reasoning.tasks.code_exec.grade_humaneval`` (imported when first used).

No answer -> ``Grade(correct=False, extracted=None)``. A comparison that runs out of time ->
``Grade(correct=False, ..., details={"error": "timeout"})``. An unparseable gold answer
raises :class:`~anchored_reasoning.errors.DataError`.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from anchored_reasoning.errors import DataError
from anchored_reasoning.tasks.extract import (
    Extractor,
    gsm8k_answer,
    gsm8k_answer_rule,
    gsm8k_strict,
    last_number,
    normalize_number,
)
from anchored_reasoning.tasks.mathcheck import DEFAULT_TIMEOUT, check_math
from anchored_reasoning.types import Example, Grade

Grader = Callable[..., Grade]


def accepts_keyword(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` takes the keyword argument ``name`` (or ``**kwargs``): context such as a
    completion's finish reason goes only to the graders and extractors that ask for it."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.kind is p.VAR_KEYWORD or (p.name == name and p.kind is not p.POSITIONAL_ONLY) for p in params
    )


def grade_gsm8k(
    completion: str,
    example: Example,
    extract: Extractor,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    strict_extractor: Extractor = gsm8k_strict,
    flexible_extractor: Extractor = last_number,
    finish_reason: str | None = None,
) -> Grade:
    if normalize_number(example.answer) is None:
        raise DataError(f"example {example.id!r}: GSM8K gold answer {example.answer!r} is not a number")
    rule = None
    if extract is gsm8k_answer:
        answer, rule = gsm8k_answer_rule(completion, finish_reason)
    elif accepts_keyword(extract, "finish_reason"):
        answer = extract(completion, example, finish_reason=finish_reason)
    else:
        answer = extract(completion, example)
    strict_value = strict_extractor(completion, example)
    flexible_value = flexible_extractor(completion, example)
    details: dict[str, Any] = {"strict_extracted": strict_value, "flexible_extracted": flexible_value}
    if rule is not None:
        details["answer_rule"] = rule
    results: dict[str, bool] = {}
    cache: dict[str, bool] = {}
    for name, value in (("answer", answer), ("strict", strict_value), ("flexible", flexible_value)):
        if value is None:
            results[name] = False
            continue
        if value not in cache:
            check = check_math(example.answer, value, timeout=timeout)
            if check.error == "timeout":
                details.setdefault("error", "timeout")
            cache[value] = check.equal
        results[name] = cache[value]
    correct = results.pop("answer")
    details.update(results)
    return Grade(correct=correct, extracted=answer, details=details)


def grade_math(
    completion: str,
    example: Example,
    extract: Extractor,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    integer_range: list[int] | None = None,
) -> Grade:
    if integer_range is not None:
        lo, hi = integer_range
        gold = example.answer.strip()
        if not (gold.isdigit() or (gold.startswith("-") and gold[1:].isdigit())) or not lo <= int(gold) <= hi:
            raise DataError(f"example {example.id!r}: gold answer {gold!r} is not an integer in {lo}-{hi}")
    value = extract(completion, example)
    if value is None:
        return Grade(correct=False, extracted=None)
    check = check_math(example.answer, value, timeout=timeout, want_integer=integer_range is not None)
    details: dict[str, Any] = {}
    if check.error:
        details["error"] = check.error
    if check.value is not None:
        details["parsed"] = check.value
    correct = check.equal
    if integer_range is not None and check.error is None:
        lo, hi = integer_range
        in_range = bool(check.is_integer) and check.integer is not None and lo <= check.integer <= hi
        if not in_range:
            details["error"] = f"not an integer in {lo}-{hi}"
            correct = False
    return Grade(correct=correct, extracted=value, details=details)


def grade_exact(
    completion: str,
    example: Example,
    extract: Extractor,
    *,
    gold_field: str | None = None,
    case_insensitive: bool = False,
) -> Grade:
    if gold_field is not None:
        if gold_field not in example.meta:
            raise DataError(f"example {example.id!r} has no meta[{gold_field!r}] to grade against")
        gold = str(example.meta[gold_field])
    else:
        gold = example.answer
    if not gold.strip():
        raise DataError(f"example {example.id!r} has an empty gold answer")
    value = extract(completion, example)
    if value is None:
        return Grade(correct=False, extracted=None)
    if case_insensitive:
        correct = value.strip().lower() == gold.strip().lower()
    else:
        correct = value.strip() == gold.strip()
    return Grade(correct=correct, extracted=value)


def _code_exec():
    try:
        from anchored_reasoning.tasks import code_exec
    except ImportError as exc:
        raise ImportError(
            "HumanEval grading runs programs in the sandbox through anchored_reasoning.tasks.code_exec, "
            f"which could not be imported ({exc})"
        ) from exc
    return code_exec


def grade_humaneval(
    completion: str,
    example: Example,
    extract: Extractor | None = None,
    *,
    timeout: float | None = None,
) -> Grade:
    return _code_exec().grade_humaneval(completion, example, timeout=timeout)


def grade_humaneval_batch(
    completions: list[str],
    examples: list[Example],
    *,
    workers: int | None = None,
    **_: Any,
) -> list[Grade]:
    return _code_exec().grade_humaneval_batch(completions, examples, workers=workers)


GRADERS: dict[str, Grader] = {
    "gsm8k": grade_gsm8k,
    "math": grade_math,
    "exact": grade_exact,
    "humaneval": grade_humaneval,
}

# Graders with a parallel batch form: name -> (completions, examples, **options) -> grades.
BATCH_GRADERS: dict[str, Callable[..., list[Grade]]] = {
    "humaneval": grade_humaneval_batch,
}
