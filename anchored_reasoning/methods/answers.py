"""Answer lines and task names for the ``trained`` formats: what a target ends with, in the form each task's
grader reads (GSM8K ``#### 18``, ProsQA ``### Tom is a lempus.``, ProntoQA ``### True``, any other task
``### <answer>``), and which task an example belongs to where the caller does not say."""
from __future__ import annotations

import re
from typing import Any

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.types import Example

GSM8K_ANSWER_PREFIX = "#### "
ANSWER_PREFIX = "### "


def task_name_of(task: Any, example: Example | None = None) -> str | None:
    """The task name from a name, a Task object (``.name``) or, when ``task`` is None, a guess
    from the example's shape (ProsQA graph fields, a True/False answer, a numeric answer)."""
    if isinstance(task, str):
        return task
    if task is not None:
        name = getattr(task, "name", None)
        if isinstance(name, str):
            return name
    if example is None:
        return None
    meta = example.meta or {}
    if meta.get("task"):
        return str(meta["task"])
    if "idx_to_symbol" in meta or "edges" in meta or re.search(r"\bIs \w+ an? \w+ or \w+\?\s*$", example.question or ""):
        return "prosqa"
    if str(example.answer).strip() in ("True", "False") and "True or false" in (example.question or ""):
        return "prontoqa"
    if re.fullmatch(r"-?[\d,]+(\.\d+)?", str(example.answer).strip()):
        return "gsm8k"
    return None


def prosqa_answer_sentence(example: Example) -> str:
    """ProsQA's answer as the sentence of the real files (``"Tom is a lempus."``), whether the
    example stores the sentence or only the concept."""
    meta = example.meta or {}
    for key in ("answer_sentence", "answer_text", "raw_answer"):
        if isinstance(meta.get(key), str) and meta[key].strip():
            return meta[key].strip()
    answer = str(example.answer).strip()
    if " is " in answer:
        return answer if answer.endswith(".") else answer + "."
    match = re.search(r"\bIs (\w+) an? ", example.question or "")
    entity = match.group(1) if match else None
    if entity is None and isinstance(meta.get("idx_to_symbol"), list) and isinstance(meta.get("root"), int):
        entity = meta["idx_to_symbol"][meta["root"]]
    if entity is None:
        raise ConfigError(
            f"example {example.id}: cannot build the ProsQA answer sentence from answer {answer!r}; "
            "the question should end with 'Is <entity> a <concept> or <concept>?'"
        )
    return f"{entity} is a {answer}."


def answer_line(example: Example, task: Any = None) -> str:
    """The final line of a trained-style target, in the form the task's grader reads."""
    name = task_name_of(task, example)
    answer = str(example.answer).strip()
    if name == "gsm8k":
        return GSM8K_ANSWER_PREFIX + answer
    if name == "prosqa":
        return ANSWER_PREFIX + prosqa_answer_sentence(example)
    return ANSWER_PREFIX + answer


def require_prosqa_without_answer_line(method: str, name: str | None, what: str) -> None:
    """``answer_line: false`` ends a target at its last step, which is the answer only on ProsQA (every
    trace ends at the asked option); elsewhere the answer stands apart from the ``what`` (steps, chain)."""
    if name != "prosqa":
        raise ConfigError(f"method {method}: option answer_line: false needs ProsQA, whose {what} end at the answer; "
                          f"task {name!r} answers apart from its {what}")
