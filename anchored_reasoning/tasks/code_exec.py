"""HumanEval grading by execution: build the check program from a completion, run it in the sandbox.

Which code is run (also in docs/sandbox.md):

1. **Fenced program.** If the completion holds a Markdown code fence (```` ```python ````,
   ```` ```py ````, ```` ```python3 ```` or a bare ```` ``` ````; an unclosed last fence runs to
   the end) whose code defines the entry point at top level (``def <entry_point>(``), the LAST
   such block is the candidate. The program is the prompt's header (everything before
   ``def <entry_point>``: its imports and helper functions, which the model may not repeat) +
   the block + the tests.
2. **Continuation** (HumanEval's own convention) otherwise: the program is
   ``prompt + completion + "\\n" + test + "\\n" + "check(<entry_point>)"``. A line that starts
   with ```` ``` ```` ends the continuation (the model closed the code block it was writing in);
   a completion that starts with a fence (the rest of the function, fenced) continues the
   prompt with that first block.
   A completion that repeats the whole function unfenced also works: the later ``def`` wins.

A whitespace-only completion is not run: ``extracted`` is None and the grade is wrong.

The program runs with ``__name__ == "humaneval_program"`` (the reference harness execs it in a
fresh dict, where ``__name__`` is not ``"__main__"`` either), so a model's
``if __name__ == "__main__":`` block with demos or ``input()`` does not run.

The program passes only when the sandbox confirms it ran to its very end (after
``check(...)`` returned) and exited 0: early ``sys.exit(0)``/``os._exit(0)`` are failures.
``Grade.details``: ``status`` ("passed", "failed", "early_exit", "timeout", "killed",
``output_limit``, "error", "no_code"), ``stderr_tail``, ``mode`` ("fenced_program" or
"continuation"), ``layer``, ``seconds``, ``returncode``.

Where the sandbox cannot isolate programs (no namespaces; root with no way to an unprivileged uid),
grading raises ``UnisolatedCodeError`` before the first program runs, unless the user opted in
(``SandboxConfig(allow_unisolated=True)``, ``$ANCHORED_REASONING_ALLOW_UNISOLATED_CODE=1`` or
``anchored-reasoning eval --confirm-run-unsafe-code``). :func:`preflight` checks that up front, before
a model generates anything: the eval runner and GRPO's code rewards call it.
"""
from __future__ import annotations

import logging
import re
from dataclasses import replace
from typing import Sequence

from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning import sandbox
from anchored_reasoning.sandbox import ExecResult, SandboxConfig, run_programs
from anchored_reasoning.types import Example, Grade

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
# module_name: like the reference harness (exec in a fresh dict), `if __name__ == "__main__":` blocks
# a model adds for demos or input() do not run.
DEFAULT_CONFIG = SandboxConfig(timeout_s=DEFAULT_TIMEOUT_S, memory_mb=1024, max_output_bytes=256 * 1024,
                               module_name="humaneval_program")
_STDERR_TAIL = 2000

_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:^[ \t]*```|\Z)", re.S | re.M)
_PY_LANGS = {"", "python", "py", "python3", "py3"}
_STATUS = {"ok": "passed"}


def _meta(example: Example, key: str) -> str:
    value = example.meta.get(key)
    if key == "prompt" and value is None:
        value = example.question
    if not isinstance(value, str):
        raise DataError(
            f"HumanEval example {example.id!r} has no string meta[{key!r}]; build it with the humaneval "
            "task loader (needs prompt, test, entry_point)"
        )
    return value


def fenced_blocks(text: str) -> list[str]:
    """The Python code of every Markdown fence in ``text`` (an unclosed last fence runs to the end)."""
    return [m.group(2) for m in _FENCE.finditer(text) if m.group(1).lower() in _PY_LANGS]


def _defines(code: str, entry_point: str) -> bool:
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.M) is not None


def prompt_header(prompt: str, entry_point: str) -> str:
    """The part of the prompt before ``def <entry_point>``: imports and helper functions."""
    m = re.search(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", prompt, re.M)
    return prompt[: m.start()] if m else ""


def candidate_code(completion: str, example: Example) -> tuple[str | None, str]:
    """(candidate code, mode): the fenced program or the continuation, per the rules above."""
    entry_point = _meta(example, "entry_point")
    if not completion.strip():
        return None, "continuation"
    blocks = fenced_blocks(completion)
    programs = [b for b in blocks if _defines(b, entry_point)]
    if programs:
        return programs[-1], "fenced_program"
    if blocks and completion.lstrip().startswith("```"):
        return blocks[0], "continuation"  # only the rest of the function, fenced
    lines = completion.split("\n")
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            return "".join(kept + "\n" for kept in lines[:i]), "continuation"
    return completion, "continuation"


def build_program(completion: str, example: Example) -> tuple[str | None, str, str | None]:
    """(program to run or None, mode, extracted candidate code or None)."""
    code, mode = candidate_code(completion, example)
    if code is None:
        return None, mode, None
    prompt = _meta(example, "prompt")
    entry_point = _meta(example, "entry_point")
    test = _meta(example, "test")
    if mode == "fenced_program":
        body = prompt_header(prompt, entry_point) + "\n" + code
    else:
        body = prompt + code
    program = f"{body}\n\n{test}\n\ncheck({entry_point})\n"
    return program, mode, code


def _grade(result: ExecResult | None, mode: str, extracted: str | None) -> Grade:
    if result is None:
        return Grade(correct=False, extracted=None,
                     details={"status": "no_code", "stderr_tail": "", "mode": mode})
    return Grade(
        correct=result.ok,
        extracted=extracted,
        details={
            "status": _STATUS.get(result.status, result.status),
            "stderr_tail": result.stderr_tail(_STDERR_TAIL),
            "mode": mode,
            "layer": result.layer,
            "seconds": round(result.duration_s, 4),
            "returncode": result.returncode,
        },
    )


def preflight(config: SandboxConfig | None = None) -> dict:
    """Refuse (UnisolatedCodeError, saying what is missing and how to opt in) before any generation when the
    programs graded here would not run isolated; else run one known program and return the sandbox's
    description (``anchored_reasoning.sandbox.preflight``)."""
    return sandbox.preflight(config or DEFAULT_CONFIG)


def _config(timeout: float | None, config: SandboxConfig | None) -> SandboxConfig:
    cfg = config or DEFAULT_CONFIG
    return replace(cfg, timeout_s=timeout) if timeout is not None else cfg


def grade_humaneval(completion: str, example: Example, timeout: float | None = None, *,
                    config: SandboxConfig | None = None) -> Grade:
    """Run ``completion`` against the example's tests in the sandbox; correct iff every test passed."""
    return grade_humaneval_batch([completion], [example], workers=1, timeout=timeout, config=config)[0]


def grade_humaneval_batch(completions: list[str], examples: list[Example], workers: int | None = None, *,
                          timeout: float | None = None, config: SandboxConfig | None = None) -> list[Grade]:
    """Grade many completions in parallel sandboxes (``workers`` defaults to the CPU count)."""
    if len(completions) != len(examples):
        raise ConfigError(
            f"grade_humaneval_batch got {len(completions)} completions for {len(examples)} examples; "
            "pass one example per completion (repeat an example for several samples)"
        )
    cfg = _config(timeout, config)
    built = [build_program(c, e) for c, e in zip(completions, examples)]
    to_run = [i for i, (program, _, _) in enumerate(built) if program is not None]
    results = run_programs([built[i][0] for i in to_run], cfg, workers=workers) if to_run else []
    by_index: dict[int, ExecResult] = dict(zip(to_run, results))
    return [_grade(by_index.get(i), mode, code) for i, (_, mode, code) in enumerate(built)]


def load_humaneval_jsonl(path: str) -> list[Example]:
    """Examples from a HumanEval ``.jsonl`` / ``.jsonl.gz`` file (for tests and benchmarks).

    The task registry's loader (``get_task("humaneval")``) is the main entry point; this reads the
    same fields so the sandbox can be checked without it.
    """
    import gzip
    import json

    opener = gzip.open if str(path).endswith(".gz") else open
    examples = []
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                meta = {k: row[k] for k in ("task_id", "prompt", "entry_point", "canonical_solution", "test")}
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise DataError(f"{path}:{lineno}: not a HumanEval row ({exc})") from exc
            examples.append(Example(id=row["task_id"], question=row["prompt"],
                                    answer=row["canonical_solution"], meta=meta))
    return examples


__all__: Sequence[str] = (
    "DEFAULT_CONFIG", "build_program", "candidate_code", "fenced_blocks", "grade_humaneval",
    "grade_humaneval_batch", "load_humaneval_jsonl", "preflight", "prompt_header",
)
