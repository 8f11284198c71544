"""Validation by generation during training, through the evaluation path.

:class:`GenerationEvaluator` wraps the model being trained as an
:class:`~anchored_reasoning.backends.hf.HFBackend` (:meth:`HFBackend.from_loaded`) and runs
:func:`~anchored_reasoning.eval.runner.run_eval` on the validation examples: the prompts, stop
strings, greedy decoding, token counts and grading are those of ``anchored-reasoning eval``, so a
validation score is what evaluating the saved checkpoint would give.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from anchored_reasoning.types import Example, Grade

logger = logging.getLogger(__name__)


@dataclass
class GenerationResult:
    accuracy: float
    mean_generated_tokens: float
    n: int
    samples: list[dict[str, Any]] = field(default_factory=list)


class _GradeTask:
    """A task-shaped wrapper around a ``grade(text, example) -> bool`` function, for the runner."""

    metrics = ["accuracy"]
    generation: dict[str, Any] = {}

    def __init__(self, grade: Callable[[str, Example], bool], name: str = "validation") -> None:
        self._grade = grade
        self.name = name

    def grade(self, text: str, example: Example) -> Grade:
        return Grade(bool(self._grade(text, example)), None, {})


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", 0))


class GenerationEvaluator:
    """Greedy generation on a list of examples with the method's prompts, graded by the task,
    through the evaluation path (:class:`HFBackend` around the model in memory +
    :func:`run_eval`), so validation sees exactly what ``anchored-reasoning eval`` would.

    ``task`` is a Task or a task name; ``grade(text, example) -> bool`` replaces ``task.grade`` when given. With ``out_dir``, the
    records and summary of every evaluation are kept in ``out_dir/<name>/`` (process 0 only).
    """

    def __init__(
        self,
        tokenizer,
        examples: Sequence[Example],
        *,
        task: Any = None,
        grade: Callable[[str, Example], bool] | None = None,
        max_new_tokens: int = 128,
        batch_size: int = 32,
        keep_samples: int = 5,
        out_dir: str | os.PathLike | None = None,
    ) -> None:
        if isinstance(task, str):
            from anchored_reasoning.tasks import get_task

            task = get_task(task)
        if grade is None and (task is None or not hasattr(task, "grade")):
            raise ValueError("GenerationEvaluator needs a task with .grade or a grade function")
        self.tokenizer = tokenizer
        self.examples = list(examples)
        self.task = _GradeTask(grade, getattr(task, "name", "validation") or "validation") if grade else task
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.keep_samples = keep_samples
        self.out_dir = Path(out_dir) if out_dir is not None else None

    def evaluate(self, model, method, name: str = "validation") -> GenerationResult:
        from anchored_reasoning.backends.hf import HFBackend
        from anchored_reasoning.eval.records import RECORDS, SUMMARY_JSON, load_records
        from anchored_reasoning.eval.runner import run_eval

        backend = HFBackend.from_loaded(model, self.tokenizer, batch_size=self.batch_size)
        was_training = model.training
        model.eval()
        try:
            with tempfile.TemporaryDirectory(prefix="ar-validation-") as tmp:
                summary = run_eval(
                    self.task, backend, method, out_dir=tmp, split="validation", examples=self.examples,
                    max_new_tokens=self.max_new_tokens, temperature=0.0, top_p=1.0, progress=False,
                )
                records = load_records(Path(tmp) / RECORDS, repair=False)
                if self.out_dir is not None and _rank() == 0:
                    dest = self.out_dir / name
                    if dest.exists():
                        shutil.rmtree(dest)
                    dest.mkdir(parents=True)
                    for fname in (RECORDS, SUMMARY_JSON):
                        shutil.copy2(Path(tmp) / fname, dest / fname)
        finally:
            model.train(was_training)
        n = len(records)
        correct = sum(bool(r["correct"]) for r in records)
        tokens = sum(int(r["tokens"]) for r in records)
        samples = [
            {"id": r["id"], "prompt": r["prompt"], "completion": r["completion"], "correct": bool(r["correct"])}
            for r in records[: self.keep_samples]
        ]
        if summary.get("accuracy", {}).get("n") not in (None, n):
            logger.warning("validation summary counts %s examples, records %d", summary["accuracy"]["n"], n)
        return GenerationResult(correct / max(n, 1), tokens / max(n, 1), n, samples)
