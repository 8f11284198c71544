"""GRPO reward functions built from a task's own grader, so reward and eval accuracy cannot disagree.

Every reward is a plain callable with TRL's signature ``f(prompts, completions, **columns) -> list[float]``;
the dataset column ``example`` (one serialized :class:`~anchored_reasoning.types.Example` per row, as
:func:`anchored_reasoning.train.data.collate.example_to_row` writes it) carries the gold::

    rewards = build_rewards({"correctness": 1.0, "format": 0.1}, task=get_task("prosqa"), style="trained")
    GRPOTrainer(model, reward_funcs=rewards.funcs, args=GRPOConfig(reward_weights=rewards.weights), ...)

* ``correctness``  1.0 when ``task.grade(completion, example).correct`` -- the very call the evals make
  (HumanEval: every test passes, run in the sandbox by the task's grader).
* ``format``       1.0 when the completion ends in the answer form the model is prompted for: the trained
  format's answer line (``#### 18`` / ``### Tom is a lempus.``) or, for instruct prompting, an answer the
  task's extractor finds (``#### 18``, ``The answer is True``); for code tasks, a candidate program.
* ``tests_passed`` HumanEval: the share of the ``check`` function's asserts that pass, counted inside the
  sandbox (:mod:`anchored_reasoning.sandbox`), never in this process; a hanging program is killed on its
  deadline and scores 0.
* ``anchor_coverage`` (process reward) the share of the example's gold anchors (key numbers, path nodes;
  :func:`anchored_reasoning.anchors.extract_anchors`) that the reasoning before the answer line contains.
  None (not applicable, TRL leaves it out of the sum) for an example without anchors.

**Bad input.** A sample whose scoring raises (a malformed completion, a grader bug) gets 0.0; the reason
is logged and counted in ``reward.failures`` -- the run never crashes on it. A gold answer that the
task's grader cannot read is caught before training by :func:`check_gold` (naming the row), so no row is
ever rewarded for free.
"""
from __future__ import annotations

import ast
import json
import logging
import math
import re
import secrets
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.types import Example

logger = logging.getLogger(__name__)


def completion_text(completion: Any) -> str:
    """The text of a TRL completion: a string, or a conversational list of messages (the last one's content)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content")
        if isinstance(content, str):
            return content
    raise TypeError(f"completion must be a str or a list of chat messages, got {type(completion).__name__}")


def example_of(row: Any) -> Example:
    """An Example from a dataset cell (the JSON string of ``example_to_row``) or an Example."""
    if isinstance(row, Example):
        return row
    from anchored_reasoning.train.data.collate import row_to_example

    return row_to_example({"example": row} if isinstance(row, str) else dict(row))


def gold_completion(example: Example, task: Any) -> str:
    """The gold answer written as the answer line a trained checkpoint emits (``#### 18``, ``### True``)."""
    from anchored_reasoning.methods.answers import answer_line

    return answer_line(example, getattr(task, "name", task))


def check_gold(examples: Sequence[Example], task: Any) -> None:
    """Fail (DataError naming the row) when a gold answer cannot be read by the task's grader, or when the
    gold, written as an answer, does not grade as correct against itself: such a row would reward nothing,
    or everything. Code tasks need the tests and the entry point the sandbox runs."""
    for i, ex in enumerate(examples):
        where = f"row {i} (id {ex.id!r})"
        if getattr(task, "is_code", False):
            test, entry = ex.meta.get("test"), ex.meta.get("entry_point")
            if not isinstance(test, str) or not isinstance(entry, str) or not entry:
                raise DataError(f"{where}: a code example needs string meta['test'] and meta['entry_point']")
            instrument_tests(test, "_probe")  # raises DataError when there is no check() to count
            continue
        try:
            grade = task.grade(gold_completion(ex, task), ex)
        except (DataError, ConfigError, ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{where}: the gold answer {ex.answer!r} does not parse for task "
                            f"{task.name!r}: {exc}") from None
        if not grade.correct:
            raise DataError(f"{where}: the gold answer {ex.answer!r}, written as {gold_completion(ex, task)!r}, "
                            f"does not grade as correct (extracted {grade.extracted!r}); fix or drop the row")


# ---------------------------------------------------------------------------------------------
# the reward callables

class Reward:
    """Base class: unpacks TRL's arguments, scores each sample with :meth:`score` and turns an exception
    into 0.0 with the reason logged (``failures`` counts them, ``last_error`` keeps the latest)."""

    name = "reward"

    def __init__(self, task: Any):
        self.task = task
        self.failures = 0
        self.last_error: str | None = None
        self.__name__ = self.name  # TRL logs rewards/<__name__>/mean

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], example: Sequence[Any] | None = None,
                 **_: Any) -> list[float | None]:
        if example is None:
            raise ConfigError(f"reward {self.name!r} needs the dataset column 'example' (see train/rewards.py)")
        rows = []
        for completion, row in zip(completions, example, strict=True):
            try:
                rows.append((completion_text(completion), example_of(row)))
            except Exception as exc:  # noqa: BLE001 -- one bad sample must not stop the run
                rows.append(exc)
        return self.score_batch(rows)

    def score_batch(self, rows: list[Any]) -> list[float | None]:
        return [self._safe(lambda r=r: self.score(*r), r) for r in rows]

    def _safe(self, fn: Callable[[], float | None], row: Any) -> float | None:
        try:
            if isinstance(row, Exception):
                raise row
            value = fn()
            if value is None:
                return None
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(f"non-finite reward {value}")
            return value
        except Exception as exc:  # noqa: BLE001 -- the sample scores 0, the reason is logged
            self.failures += 1
            ex_id = row[1].id if isinstance(row, tuple) else "?"
            self.last_error = f"{type(exc).__name__}: {exc}"
            logger.warning("reward %s: sample of example %s scored 0 (%s)", self.name, ex_id, self.last_error)
            return 0.0

    def score(self, text: str, example: Example) -> float | None:  # pragma: no cover - abstract
        raise NotImplementedError


class CorrectnessReward(Reward):
    """1.0 when the task's grader says correct (code tasks: graded in parallel sandboxes)."""

    name = "correctness"

    def score(self, text: str, example: Example) -> float:
        return 1.0 if self.task.grade(text, example).correct else 0.0

    def score_batch(self, rows: list[Any]) -> list[float | None]:
        if not getattr(self.task, "is_code", False):
            return super().score_batch(rows)
        good = [i for i, r in enumerate(rows) if not isinstance(r, Exception)]
        out: list[float | None] = [self._safe(lambda: None, r) if isinstance(r, Exception) else 0.0 for r in rows]
        try:
            grades = self.task.grade_batch([rows[i][0] for i in good], [rows[i][1] for i in good])
        except Exception as exc:  # noqa: BLE001 -- fall back to one sample at a time, each guarded
            logger.warning("reward correctness: batch grading failed (%s); grading one by one", exc)
            return super().score_batch(rows)
        for i, grade in zip(good, grades):
            out[i] = 1.0 if grade.correct else 0.0
        return out


def answer_prefix(example: Example, task: Any) -> str:
    """The answer-line prefix of the trained format for this example (``"#### "`` or ``"### "``)."""
    return gold_completion(example, task).split(" ", 1)[0] + " "


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


class FormatReward(Reward):
    """1.0 when the completion ends in the answer form it is prompted for (see the module docstring)."""

    name = "format"

    def __init__(self, task: Any, style: str = "trained"):
        if style not in ("trained", "instruct"):
            raise ConfigError(f"format reward: style must be 'trained' or 'instruct', got {style!r}")
        super().__init__(task)
        self.style = style

    def score(self, text: str, example: Example) -> float:
        if getattr(self.task, "is_code", False):
            from anchored_reasoning.tasks.code_exec import candidate_code

            return 1.0 if candidate_code(text, example)[0] is not None else 0.0
        if self.style == "trained":
            last = _last_line(text)
            if not last.startswith(answer_prefix(example, self.task).strip()):
                return 0.0
        return 1.0 if self._marker(text, example) is not None else 0.0

    def _marker(self, text: str, example: Example) -> str | None:
        """The task's strict extractor when it has one (GSM8K: an explicit answer marker), else its extractor."""
        name = (getattr(self.task, "grader_options", None) or {}).get("strict_extractor")
        if isinstance(name, str):
            from anchored_reasoning.tasks.extract import EXTRACTORS
            from anchored_reasoning.tasks.loaders import resolve_hook

            return resolve_hook(name, EXTRACTORS, "extractor")(text, example)
        return self.task.extract(text, example)


def reasoning_part(text: str, example: Example, task: Any) -> str:
    """The completion without its final answer line (what the model reasoned before answering)."""
    prefix = answer_prefix(example, task).strip()
    lines = text.rstrip().splitlines()
    if lines and lines[-1].strip().startswith(prefix):
        lines = lines[:-1]
    return "\n".join(lines)


class AnchorCoverageReward(Reward):
    """Share of the gold anchors (whole words, case-insensitive) found in the reasoning; None without anchors."""

    name = "anchor_coverage"

    def score(self, text: str, example: Example) -> float | None:
        from anchored_reasoning.anchors import extract_anchors

        anchors = [a for a in dict.fromkeys(extract_anchors(example, self.task.name, max_anchors=None)) if a.strip()]
        if not anchors:
            return None
        reasoning = reasoning_part(text, example, self.task).lower()
        found = sum(1 for a in anchors if re.search(r"(?<![\w.])" + re.escape(a.lower()) + r"(?![\w])", reasoning))
        return found / len(anchors)


# ---------------------------------------------------------------------------------------------
# HumanEval: share of tests passed, counted inside the sandbox

def instrument_tests(test_code: str, tag: str) -> tuple[str, int]:
    """Rewrite HumanEval's ``check(candidate)`` so that each top-level statement holding an ``assert``
    counts a pass instead of stopping the program, and the count is printed (``<tag> passed total``) when
    ``check`` returns. Returns (new test code, number of counted statements)."""
    try:
        tree = ast.parse(test_code)
    except SyntaxError as exc:
        raise DataError(f"the example's test code does not parse: {exc}") from None
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not checks:
        raise DataError("the example's test code has no top-level 'def check(candidate)' to count tests in")
    counter = f"_ar_passed_{tag}"
    check = checks[-1]
    body: list[ast.stmt] = []
    total = 0
    for stmt in check.body:
        if any(isinstance(node, ast.Assert) for node in ast.walk(stmt)):
            total += 1
            bump = ast.parse(f"{counter}[0] += 1").body
            handler = ast.ExceptHandler(type=ast.Name("Exception", ast.Load()), name=None, body=[ast.Pass()])
            body.append(ast.Try(body=[stmt, *bump], handlers=[handler], orelse=[], finalbody=[]))
        else:
            body.append(stmt)
    report = ast.parse(f"print({tag!r}, {counter}[0], {total}, flush=True)").body
    check.body = [ast.Try(body=body or [ast.Pass()], handlers=[], orelse=[], finalbody=report)]
    tree.body.insert(tree.body.index(check), ast.parse(f"{counter} = [0]").body[0])
    return ast.unparse(ast.fix_missing_locations(tree)), total


def passed_share(stdout: str, tag: str) -> float | None:
    """The share printed by an instrumented ``check`` (the last ``<tag> k n`` line), None when absent."""
    for line in reversed(stdout.splitlines()):
        parts = line.split()
        if len(parts) == 3 and parts[0] == tag:
            passed, total = int(parts[1]), int(parts[2])
            return passed / total if total else None
    return None


class CodeTestsReward(Reward):
    """HumanEval: the share of the tests that pass (see :func:`instrument_tests`), run in parallel
    sandboxes with the task's sandbox limits; ``timeout_s`` is each program's deadline.

    A completion without code, or a program that dies before ``check`` returns (a syntax error, a crash),
    scores 0 like a wrong answer: that is the model's doing, not a reward failure. A program that hangs is
    killed on its deadline, scores 0 and is counted in ``timeouts`` (logged at INFO)."""

    name = "tests_passed"

    def __init__(self, task: Any, timeout_s: float | None = None, workers: int | None = None):
        if not getattr(task, "is_code", False):
            raise ConfigError(f"the tests_passed reward needs a code task; {getattr(task, 'name', task)!r} is not one")
        super().__init__(task)
        self.timeout_s = timeout_s
        self.workers = workers
        self.timeouts = 0

    def score_batch(self, rows: list[Any]) -> list[float | None]:
        from anchored_reasoning.sandbox import run_programs
        from anchored_reasoning.tasks.code_exec import DEFAULT_CONFIG, build_program

        tag = "ar_tests_" + secrets.token_hex(8)  # a model cannot print a count it does not know the tag of
        out: list[float | None] = [0.0] * len(rows)
        programs: list[tuple[int, str]] = []
        for i, row in enumerate(rows):
            def build(row=row, i=i):
                text, example = row
                test, _ = instrument_tests(example.meta["test"], tag)
                program, _, _ = build_program(text, replace(example, meta={**example.meta, "test": test}))
                if program is not None:
                    programs.append((i, program))
                return 0.0  # no code: a wrong answer
            out[i] = self._safe(build, row)
        if not programs:
            return out
        cfg = DEFAULT_CONFIG if self.timeout_s is None else replace(DEFAULT_CONFIG, timeout_s=float(self.timeout_s))
        results = run_programs([p for _, p in programs], cfg, workers=self.workers)
        for (i, _), result in zip(programs, results):
            if result.status == "timeout":
                self.timeouts += 1
                logger.info("reward tests_passed: the program of example %s was killed at its %.0f s deadline",
                            rows[i][1].id, cfg.timeout_s)
            out[i] = self._safe(lambda result=result: passed_share(result.stdout, tag) or 0.0, rows[i])
        return out


# ---------------------------------------------------------------------------------------------
# building the set a recipe asks for

REWARDS: dict[str, type[Reward]] = {
    cls.name: cls for cls in (CorrectnessReward, FormatReward, CodeTestsReward, AnchorCoverageReward)
}


@dataclass
class RewardSet:
    """The reward callables and their weights (``GRPOConfig.reward_weights``), in the same order."""

    funcs: list[Reward] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)

    def failures(self) -> dict[str, int]:
        return {f.name: f.failures for f in self.funcs}


def build_rewards(spec: Mapping[str, Any] | None, task: Any, style: str = "trained",
                  tests_timeout_s: float | None = None) -> RewardSet:
    """``spec`` maps reward names (:data:`REWARDS`) to weights; a weight of 0 leaves the reward out.
    Default: correctness 1.0 and format 0.1 (correctness 1.0 and tests_passed 0.5 for code tasks)."""
    if getattr(task, "is_code", False):  # refuse unisolated code execution before training starts
        from anchored_reasoning.tasks.code_exec import preflight

        preflight()
    if spec is None:
        spec = {"correctness": 1.0, "tests_passed": 0.5} if getattr(task, "is_code", False) else {"correctness": 1.0, "format": 0.1}
    out = RewardSet()
    for name, weight in spec.items():
        if name not in REWARDS:
            raise ConfigError(f"unknown reward {name!r} in recipe 'rewards'; known: {', '.join(sorted(REWARDS))}")
        try:
            weight = float(weight)
        except (TypeError, ValueError):
            raise ConfigError(f"reward {name!r}: weight must be a number, got {weight!r}") from None
        if weight == 0:
            continue
        if name == "format":
            func: Reward = FormatReward(task, style)
        elif name == "tests_passed":
            func = CodeTestsReward(task, timeout_s=tests_timeout_s)
        else:
            func = REWARDS[name](task)
        out.funcs.append(func)
        out.weights.append(weight)
    if not out.funcs:
        raise ConfigError(f"recipe 'rewards' {json.dumps(dict(spec))} leaves no reward with a non-zero weight")
    return out
