"""HumanEval grading by execution: program building rules and the full-data gold checks.

Run: pytest tests/test_code_exec.py          (unit part: a few seconds)
     ANCHORED_REASONING_DATA=/work/shared/data pytest tests/test_code_exec.py -m data   (164-problem checks)
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.tasks.code_exec import (
    build_program,
    candidate_code,
    grade_humaneval,
    grade_humaneval_batch,
    load_humaneval_jsonl,
)
from anchored_reasoning.types import Example

PROMPT = '''from typing import List


def _helper(x: int) -> int:
    return x * 2


def double_all(xs: List[int]) -> List[int]:
    """Return every element doubled.
    >>> double_all([1, 2])
    [2, 4]
    """
'''
TEST = '''

METADATA = {}


def check(candidate):
    assert candidate([1, 2]) == [2, 4]
    assert candidate([]) == []
    assert candidate([-3]) == [-6]
'''
BODY = "    return [_helper(x) for x in xs]\n"


def make_example() -> Example:
    return Example(id="Toy/0", question=PROMPT, answer=BODY, meta={
        "task_id": "Toy/0", "prompt": PROMPT, "test": TEST, "entry_point": "double_all", "canonical_solution": BODY})


EX = make_example()


def grade(completion: str, **kw):
    return grade_humaneval(completion, EX, **kw)


def test_continuation_passes_and_reports_details():
    g = grade(BODY)
    assert g.correct and g.extracted == BODY
    assert g.details["status"] == "passed" and g.details["mode"] == "continuation"
    assert g.details["layer"] in ("bwrap", "unshare", "plain")


def test_wrong_body_fails_with_the_assertion_in_stderr():
    g = grade("    return xs\n")
    assert not g.correct and g.details["status"] == "failed"
    assert "AssertionError" in g.details["stderr_tail"]


def test_fenced_program_with_prose_is_understood():
    completion = ("Sure! Here is the function.\n\n```python\ndef double_all(xs):\n"
                  "    return [_helper(x) for x in xs]  # helper comes from the prompt header\n```\n"
                  "This doubles each element.")
    program, mode, code = build_program(completion, EX)
    assert mode == "fenced_program" and code.startswith("def double_all")
    assert "def _helper" in program and "Sure!" not in program
    assert grade(completion).correct


def test_last_defining_fence_wins():
    completion = ("```python\ndef double_all(xs):\n    return xs\n```\nOops, fixed:\n"
                  "```py\ndef double_all(xs):\n    return [2 * x for x in xs]\n```\n")
    assert candidate_code(completion, EX)[0].strip().endswith("[2 * x for x in xs]")
    assert grade(completion).correct


def test_unclosed_fence_runs_to_the_end():
    assert grade("```python\ndef double_all(xs):\n    return [2 * x for x in xs]\n").correct


def test_fenced_body_only_continues_the_prompt():
    g = grade("```python\n" + BODY + "```\n")
    assert g.correct and g.details["mode"] == "continuation"


def test_continuation_is_cut_at_a_closing_fence():
    g = grade(BODY + "```\n\nThis function doubles the list.\n")
    assert g.correct and g.extracted == BODY


def test_unfenced_full_function_repeat_works():
    assert grade("    pass\n\n\ndef double_all(xs):\n    return [2 * x for x in xs]\n").correct


def test_main_guard_demo_block_does_not_run():
    completion = ("```python\ndef double_all(xs):\n    return [2 * x for x in xs]\n\n"
                  "if __name__ == '__main__':\n    n = int(input())\n    print(double_all([n]))\n```")
    assert grade(completion).correct


def test_empty_completion_is_not_run():
    g = grade("  \n")
    assert not g.correct and g.extracted is None and g.details["status"] == "no_code"


@pytest.mark.parametrize("completion", [
    "    import sys\n    sys.exit(0)\n\nimport sys\nsys.exit(0)\n",
    "    return xs\n\nimport os\nos._exit(0)\n",
    "    return xs\n\nimport atexit, os\natexit.register(lambda: os._exit(0))\nraise SystemExit(0)\n",
    "    return xs\n\nprint('passed')\nimport os\nos._exit(0)\n",
    "```python\nimport sys\ndef double_all(xs):\n    return xs\nsys.exit(0)\n```",
])
def test_early_exit_completions_fail(completion):
    g = grade(completion)
    assert not g.correct and g.details["status"] == "early_exit"


def test_hostile_completions_fail():
    assert grade("    while True:\n        pass\n", timeout=1).details["status"] == "timeout"
    g = grade("    import os\n    os.kill(os.getppid(), 9)\n    return xs\n")
    assert not g.correct
    g = grade("    return [_helper(x) for x in xs]\n\nprint('x' * 10_000_000)\n")
    assert not g.correct and g.details["status"] == "output_limit"


def test_batch_keeps_order_and_checks_lengths():
    completions = [BODY, "    return xs\n", "", BODY]
    grades = grade_humaneval_batch(completions, [EX] * 4, workers=2)
    assert [g.correct for g in grades] == [True, False, False, True]
    with pytest.raises(ConfigError, match="3 completions for 2 examples"):
        grade_humaneval_batch(["a", "b", "c"], [EX, EX])


def test_missing_meta_is_a_data_error():
    bad = Example(id="x", question="def f():\n", answer="", meta={"prompt": "def f():\n"})
    with pytest.raises(DataError, match="entry_point"):
        grade_humaneval("    return 1\n", bad)


def test_loader_reports_file_and_line(tmp_path):
    path = tmp_path / "he.jsonl"
    path.write_text('{"task_id": "a"}\n')
    with pytest.raises(DataError, match=r"he\.jsonl:1"):
        load_humaneval_jsonl(str(path))


# ---------------------------------------------------------------------------------- full data

def _humaneval_file() -> Path:
    root = os.environ.get("ANCHORED_REASONING_DATA")
    if not root:
        pytest.skip("ANCHORED_REASONING_DATA is unset: the 164 HumanEval problems are read from "
                    "$ANCHORED_REASONING_DATA/humaneval/HumanEval.jsonl.gz")
    path = Path(root) / "humaneval" / "HumanEval.jsonl.gz"
    if not path.is_file():
        pytest.skip(f"{path} not found (ANCHORED_REASONING_DATA points to a folder without HumanEval)")
    return path


@pytest.fixture(scope="module")
def humaneval() -> list[Example]:
    examples = load_humaneval_jsonl(str(_humaneval_file()))
    assert len(examples) == 164
    return examples


@pytest.mark.data
@pytest.mark.slow
def test_canonical_solutions_all_pass(humaneval):
    grades = grade_humaneval_batch([e.meta["canonical_solution"] for e in humaneval], humaneval)
    failed = [(e.id, g.details) for e, g in zip(humaneval, grades) if not g.correct]
    assert not failed
    assert sum(g.correct for g in grades) == 164


@pytest.mark.data
@pytest.mark.slow
def test_pass_body_passes_nothing(humaneval):
    grades = grade_humaneval_batch(["    pass\n"] * len(humaneval), humaneval)
    assert sum(g.correct for g in grades) == 0
    assert {g.details["status"] for g in grades} <= {"failed"}


@pytest.mark.data
@pytest.mark.slow
def test_canonical_as_fenced_programs_pass_and_early_exits_fail(humaneval):
    subset = humaneval[::4]  # 41 problems: enough to exercise helpers and imports in headers
    fenced = [f"Here is my solution.\n```python\n{e.meta['prompt']}{e.meta['canonical_solution']}```\nDone."
              for e in subset]
    grades = grade_humaneval_batch(fenced, subset)
    assert [g.details["mode"] for g in grades] == ["fenced_program"] * len(subset)
    assert all(g.correct for g in grades), [(e.id, g.details) for e, g in zip(subset, grades) if not g.correct]
    exiting = [e.meta["canonical_solution"] + "\nimport sys\nsys.exit(0)\n" for e in subset]
    grades = grade_humaneval_batch(exiting, subset)
    assert sum(g.correct for g in grades) == 0
