"""Grading a run's completions: every completion gets a grade, and a grader that fails grades it wrong
(with the error in ``details``) instead of stopping the run. Used by the runner and by ``regrade``."""
from __future__ import annotations

import logging
from typing import Any

from anchored_reasoning.eval.records import jsonable
from anchored_reasoning.tasks.graders import accepts_keyword
from anchored_reasoning.types import Example, Grade

log = logging.getLogger(__name__)


def grade_all(
    task: Any, texts: list[str], examples: list[Example], finish_reasons: list[str | None] | None = None
) -> list[Grade]:
    """Grade with ``task.grade_batch`` (or ``task.grade``); an exception becomes a graded-wrong
    result carrying the error, never a crash. ``finish_reasons`` reach a task whose grading
    takes them (GSM8K gives no credit for the number a token-capped loop ends on)."""
    reasons = list(finish_reasons) if finish_reasons is not None else [None] * len(texts)
    if hasattr(task, "grade_batch"):
        try:
            if finish_reasons is not None and accepts_keyword(task.grade_batch, "finish_reasons"):
                grades = list(task.grade_batch(texts, examples, finish_reasons=reasons))
            else:
                grades = list(task.grade_batch(texts, examples))
            if len(grades) == len(texts):
                return grades
            log.warning("grade_batch returned %d grades for %d completions; grading one by one", len(grades), len(texts))
        except Exception as exc:  # noqa: BLE001 - grading must never crash the run
            log.warning("grade_batch failed (%s: %s); grading one by one", type(exc).__name__, exc)
    out = []
    with_reason = finish_reasons is not None and accepts_keyword(task.grade, "finish_reason")
    for text, ex, reason in zip(texts, examples, reasons):
        try:
            out.append(task.grade(text, ex, finish_reason=reason) if with_reason else task.grade(text, ex))
        except Exception as exc:  # noqa: BLE001
            log.warning("grading %s failed: %s: %s", ex.id, type(exc).__name__, exc)
            out.append(Grade(False, None, {"grading_error": f"{type(exc).__name__}: {exc}"}))
    return out


def gold_of(task: Any, example: Example) -> Any:
    """The record's ``gold``: ``task.gold(example)`` (the registry's tasks: what the grader compares
    with, None for code tasks), else the example's answer."""
    gold = getattr(task, "gold", None)
    return jsonable(gold(example) if callable(gold) else example.answer)
