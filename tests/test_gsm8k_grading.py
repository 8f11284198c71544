"""GSM8K grading on real-looking model output, one table per rule (docs/tasks.md, "GSM8K"):

1. an answer that holds an expression commits to the expression's value, never its first operand;
2. a completion that ends in a plain sentence stating the result is graded on that number in the
   headline, with strict (markers only) and flexible (the last number) reported beside it;
3. a completion cut by the token cap in a repetition loop gets no credit from the number that
   happens to end it.

The rows are SmolLM2- and Qwen-style completions (several copied from the committed SmolLM2-135M
run in benchmarks/results/smollm2-gsm8k), plus regrading a run and the runner passing the
finish reason through.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from anchored_reasoning.eval.regrade import regrade_run
from anchored_reasoning.eval.runner import run_eval
from anchored_reasoning.methods.prompting import NoCoT
from anchored_reasoning.tasks import get_task
from anchored_reasoning.tasks.extract import gsm8k_answer, gsm8k_answer_rule, gsm8k_strict, last_number
from anchored_reasoning.tasks.numeric import chain_value, committed_prefix, repetition_loop, result_sentence_value
from anchored_reasoning.types import Completion, Example


def _ex(answer: str, i: int = 0) -> Example:
    return Example(id=f"test-{i}", question="q", answer=answer)


def _grade(completion: str, gold: str, finish_reason: str | None = "stop"):
    return get_task("gsm8k").grade(completion, _ex(gold), finish_reason=finish_reason)


# ----------------------------------------------------------------------------- 1. expressions

EXPRESSION_ROWS = [
    # gold, completion, committed answer
    ("800", "He buys 20 ties at $40 each.\nThe answer is 20 * $40 = $800.", "800"),
    ("800", "The answer is 20 * $40.", "800"),
    # SmolLM2-135M, gsm8k-cot test-44: revenue, not the profit; the old grader took the operand 20
    ("20", "So, 10 * $2.00 = $20. \nThe final answer is 20 candles * $2.00 = $40.", "40"),
    ("40", "So, the final answer is 120 / 3.", "40"),
    ("9", "#### 16 - 3 - 4 = 9", "9"),
    ("18", "Answer: 3 x 6 = 18 eggs", "18"),
    ("14", "The answer is (3 + 4) * 2 = 14.", "14"),
    ("1500", "The answer is $1,200 + $300 = $1,500.", "1500"),
    ("2.6", "The final answer is 1.3% + 1.3% = 2.6%.", "2.6"),
    # the stated result, not our arithmetic: 2 * 1.5 is 3, the model says 2
    ("3", "The answer is 2 * 1.5 = 2 bolts.", "2"),
    # a unit after "/" is not a divisor
    ("6", "So, the answer is 12 miles / hour.", "12"),
    # the chain ends with its clause: 15 is the answer, the rest is another step
    ("15", "The answer is 15 apples, and 15 - 3 = 12 are left over.", "15"),
    ("800", "Therefore the total is $\\boxed{20 \\times 40 = 800}$.", "800"),
    ("40", "**Final Answer**\n\\[\n\\boxed{5 \\cdot 8}\n\\]", "40"),
    ("0.75", "The fraction left is \\(\\boxed{\\frac{3}{4}}\\).", "0.75"),
    ("1000", "\\boxed{1{,}000 \\text{ dollars}}", "1000"),
    ("72", "Natalia sold 48 + 24 = 72 clips.\n#### 72", "72"),
    ("18", "So the answer is \\( 9 \\times 2 = 18 \\).", "18"),
    ("18", "## Step 3: Multiply\n9 * 2 = 18\n\n**Final Answer:** $18", "18"),
    ("18", "#### $18.00", "18"),
    ("1000", "#### 1,000", "1000"),
]


@pytest.mark.parametrize("gold,completion,answer", EXPRESSION_ROWS)
def test_an_answer_holding_an_expression_commits_to_its_value(gold, completion, answer):
    assert gsm8k_strict(completion) == answer
    grade = _grade(completion, gold)
    assert grade.extracted == answer
    assert grade.details["answer_rule"] == "marker"
    assert grade.correct is (answer == gold or float(answer) == float(gold))
    assert grade.details["strict"] is grade.correct


@pytest.mark.parametrize(
    "text,value",
    [
        ("20 * $40 = $800", "800"),
        ("4 hours * 30mph = 120 miles", "120"),
        ("10 / 3", "10/3"),
        ("2.5 * 2", "5"),
        ("1/2", "0.5"),
        ("-3", "-3"),
        ("5 * 4 = ", "20"),  # a dangling "=": the last stated side stands
        ("5 / 0", None),
        ("eighteen", None),
        ("", None),
    ],
)
def test_chain_value(text, value):
    assert chain_value(text) == value


# ----------------------------------------------------------------------------- 2. plain sentences

SENTENCE_ROWS = [
    # gold, completion, headline answer, flexible (last number)
    (
        "18",
        "Janet's ducks lay 16 eggs. She uses 3 + 4 = 7 of them, so 16 - 7 = 9 are left.\n"
        "She sells each for $2: 9 * $2 = $18.\nSo Janet makes $18 every day.",
        "18",
        "18",
    ),
    # SmolLM2-135M, gsm8k-cot test-27 (its numbers; the gold here is the stated result)
    ("900", "Cynthia buys 15 * $60 = $900.\n\nSo, Cynthia will spend $900 on ice cream after 60 days.", "900", "60"),
    # SmolLM2-135M, gsm8k-cot test-12: the result sentence is followed by one without a number
    ("9", "So, Carlos will have 9 lemons after 1 year. This is the answer.", "9", "1"),
    ("38", "In 4 weeks, Claire will have 38 eggs.", "38", "38"),
    ("18", "Janet sells 9 eggs at $2 each, so she makes $18 every day.", "18", "18"),
    ("540", "So, James runs a week at a rate of 180 meters per session, which is 540 meters.", "540", "540"),
    ("24", "Now, we can add these two total costs together: $18 + $16 = $24.", "24", "24"),
    ("20", "He gets 3 + 2 = 5 points per round, so after 4 rounds he has 20 points.", "20", "20"),
    ("70000", "So the house is now worth $200,000 and he made a profit of $70,000.", "70000", "70000"),
    ("72", "Adding these gives \\( 48 + 24 = 72 \\).\n\nNatalia sold 72 clips altogether in April and May.", "72", "72"),
    ("25", "He will be 25 in 5 years.\n\nI hope this helps!", "25", "5"),
    ("18", "\\[\n9 \\times 2 = 18\n\\]\nThus, Janet makes \\( 18 \\) dollars every day.", "18", "18"),
    ("18", "I don't know.", None, None),
]


@pytest.mark.parametrize("gold,completion,answer,flexible", SENTENCE_ROWS)
def test_a_plain_result_sentence_is_the_headline_answer(gold, completion, answer, flexible):
    grade = _grade(completion, gold)
    assert grade.extracted == answer
    assert grade.details["answer_rule"] == ("sentence" if answer else "none")
    assert grade.correct is (answer == gold)
    # strict is markers only; flexible is the last number, both still reported
    assert grade.details["strict_extracted"] is None and grade.details["strict"] is False
    assert grade.details["flexible_extracted"] == flexible
    assert grade.details["flexible"] is (flexible == gold)


def test_a_marker_outranks_a_later_sentence():
    completion = "The answer is 17.\n\nSo Janet makes $18 every day."
    assert gsm8k_answer(completion) == "17"
    assert result_sentence_value(completion) == "18"


# ----------------------------------------------------------------------------- 3. the token cap

_LOOP_UNIT = "The total number of days she lays eggs is 16 * 3 = 48 days.\n\nSo, Janet lays 48 eggs every day.\n\n"

CAPPED_ROWS = [
    # gold, completion (cut by the cap), headline answer; flexible credits the loop's last number
    ("48", "To solve this problem, we break it down.\n\n" + _LOOP_UNIT * 3 + "Now, we need to find", None),
    # SmolLM2-135M, gsm8k-cot test-5 / test-7: arithmetic loops cut mid-expression
    ("16", "So, 16 * 100% = " + "16 * 100 = 16 * 10 = " * 12 + "16 * ", None),
    ("1", "1. 200 GB / 2 = 100 GB / 2 = 50 GB / 2 = " + "1 GB / 2 = " * 20 + "1 GB /", None),
    # SmolLM2-135M, gsm8k-nocot test-3: "#### 1" may be "#### 180" cut by the cap
    ("1", "James runs 60 meters each sprint, so he runs 60 * 3 = 180 meters in a week.\n#### 1", None),
    # a result sentence before the cap is not a committed answer either
    ("18", "So she makes 9 * 2 = $18 every day.\nNow let us check: 9 eggs at $", None),
    # an answer committed before the loop still counts, the digits the cap cut do not
    ("18", "So she makes $18.\n#### 18\n\n" + "The answer is 18.\n\n" * 6 + "The answer is 1", "18"),
    # a counting loop: the first copy of the loop is what was committed
    ("5", "Let me count.\n" + "".join(f"The answer is {k}.\n" for k in range(5, 40)) + "The answer is 4", "5"),
    # SmolLM2-135M, gsm8k-nocot test-14: the complete marker, not the unfinished chain after it
    ("20", "#### 20%\n\nThe answer is 20% of 20% = 0.02 * 100 = ", "20"),
    # SmolLM2-135M, gsm8k-cot test-26 (gold ours): the cut "1" at the end is not the answer
    ("156", "So, the final answer is 78 + 78 = 156 pairs.\n\nThe final answer is 156.\n\nThe final answer is 1", "156"),
]


@pytest.mark.parametrize("gold,completion,answer", CAPPED_ROWS)
def test_a_capped_completion_gets_no_credit_from_the_number_ending_it(gold, completion, answer):
    grade = _grade(completion, gold, finish_reason="length")
    assert grade.extracted == answer
    assert grade.details["answer_rule"] == ("capped" if answer else "none")
    assert grade.correct is (answer == gold)
    assert grade.details["flexible_extracted"] == last_number(completion)


def test_the_same_text_unfinished_by_the_cap_is_graded_normally():
    completion = "James runs 60 meters each sprint, so he runs 60 * 3 = 180 meters in a week.\n#### 1"
    assert _grade(completion, "1", finish_reason="length").correct is False
    assert _grade(completion, "1", finish_reason="stop").correct is True
    assert _grade(completion, "1", finish_reason=None).correct is True
    # the diffusion backend's names for a window that ran out
    assert _grade(completion, "1", finish_reason="shrunk").correct is False
    assert _grade(completion, "1", finish_reason="truncated_prompt").correct is False
    # the flexible number credits the loop; the headline does not
    looped = "Start.\n" + _LOOP_UNIT * 3 + "Now"
    grade = _grade(looped, "48", finish_reason="length")
    assert grade.details["flexible"] is True and grade.correct is False


@pytest.mark.parametrize(
    "text,looped",
    [
        ("a normal answer. " * 1 + "#### 18", False),
        ("Step 1: add.\nStep 2: multiply.\nStep 3: done.", False),
        ("x" * 10, False),  # too short to call a loop
        ("intro. " + "1 GB / 2 = " * 10, True),
        ("Let me count.\n" + "".join(f"{k}, " for k in range(100, 200)), True),  # digits masked
    ],
)
def test_repetition_loop(text, looped):
    loop = repetition_loop(text)
    assert (loop is not None) is looped
    if loop is not None:
        start, unit_end = loop
        assert 0 <= start < unit_end <= len(text)


def test_committed_prefix_drops_the_unfinished_sentence():
    assert committed_prefix("It is 18.\nThe answer is 1") == "It is 18.\n"
    assert committed_prefix("no sentence ends here") == ""
    assert committed_prefix("The answer is 18.") == "The answer is 18."


HOSTILE = ["1 = " * 5000, "ab" * 10000, "7" * 16000, "answer is " * 5000, "The answer is 1.\n" * 3000, "(" * 5000 + "1"]


@pytest.mark.parametrize("index", range(len(HOSTILE)))
@pytest.mark.parametrize("finish_reason", ["length", "stop"])
def test_gsm8k_rules_stay_fast_on_hostile_text(index, finish_reason):
    start = time.monotonic()
    gsm8k_answer_rule(HOSTILE[index], finish_reason)
    assert time.monotonic() - start < 5


# ----------------------------------------------------------------------------- the runner and regrading


class _CappedBackend:
    """Returns one looping, capped completion per prompt."""

    name = "fake"
    batch_size = 4

    def describe(self):
        return {"backend": "fake", "model": "looper"}

    def generate(self, prompts, spec):
        text = "Start.\n" + _LOOP_UNIT * 3 + "Now"
        return [[Completion(text, spec.max_new_tokens, 0.01, "length")] for _ in prompts]


def test_the_runner_passes_the_finish_reason_to_the_grader(tmp_path):
    examples = [Example(id="q0", question="How many eggs?", answer="48")]
    summary = run_eval("gsm8k", _CappedBackend(), NoCoT(), out_dir=tmp_path, examples=examples, progress=False)
    record = json.loads((tmp_path / "records.jsonl").read_text())
    assert record["finish_reason"] == "length"
    assert record["correct"] is False and record["details"]["answer_rule"] == "none"
    assert record["details"]["flexible"] is True
    assert summary["accuracy"]["mean"] == 0.0 and summary["metrics"]["flexible"]["mean"] == 1.0


def _old_run(tmp_path: Path) -> Path:
    """A run folder graded by the old rules: strict was the headline, a first operand counted."""
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    rows = [
        {"question": "Q0", "answer": "x\n#### 20"},
        {"question": "Q1", "answer": "x\n#### 18"},
        {"question": "Q2", "answer": "x\n#### 48"},
    ]
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    run.mkdir()
    config = {"task": "gsm8k", "split": "test", "method": {"name": "cot", "style": "instruct"},
              "sampling": {"max_new_tokens": 64, "n": 1, "seed": 0}, "limit": None, "data_dir": str(tmp_path / "data")}
    (run / "config.json").write_text(json.dumps(config))
    texts = [
        ("The final answer is 20 candles * $2.00 = $40.", "stop", "20", True),
        ("So Janet makes $18 every day.", "stop", None, False),
        ("Start.\n" + _LOOP_UNIT * 3 + "Now", None, None, False),  # no finish reason, 64 tokens
    ]
    records = []
    for i, (text, reason, extracted, correct) in enumerate(texts):
        records.append({"id": f"test-{i}", "sample": 0, "prompt": "p", "completion": text, "extracted": extracted,
                        "correct": correct, "tokens": 64 if reason is None else 10, "seconds": 1.0,
                        "finish_reason": reason, "details": {"strict": correct}})
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "summary.json").write_text(json.dumps({"task": "gsm8k", "method": "cot", "model": "m", "wall_seconds": 3.0,
                                                  "accuracy": {"mean": 1 / 3}}))
    return run


def test_regrade_rewrites_grades_and_summary_and_keeps_the_generation(tmp_path):
    run = _old_run(tmp_path)
    before = [json.loads(l) for l in (run / "records.jsonl").read_text().splitlines()]
    result = regrade_run(run)
    assert result.graded == 3
    changed = {c["id"]: (c["old"]["correct"], c["new"]["correct"]) for c in result.changes}
    assert changed == {"test-0": (True, False), "test-1": (False, True)}  # the loop stays wrong
    after = [json.loads(l) for l in (run / "records.jsonl").read_text().splitlines()]
    for old, new in zip(before, after):
        for key in ("id", "sample", "prompt", "completion", "tokens", "seconds", "finish_reason"):
            assert new[key] == old[key]
    assert [r["extracted"] for r in after] == ["40", "18", None]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["accuracy"]["mean"] == pytest.approx(1 / 3)
    assert summary["counts"]["correct"] == 1 and summary["model"] == "m" and summary["wall_seconds"] == 3.0
    assert "strict" in summary["metrics"] and "flexible" in summary["metrics"]
    assert "gsm8k" in (run / "summary.md").read_text()
    assert not (run / ".lock").exists()
    # a second pass finds nothing to change
    assert regrade_run(run).changes == []


def test_regrade_refuses_what_is_not_a_run_or_records_of_other_data(tmp_path):
    from anchored_reasoning.errors import ConfigError, DataError

    with pytest.raises(ConfigError, match="not a run directory"):
        regrade_run(tmp_path)
    run = _old_run(tmp_path)
    with open(run / "records.jsonl", "a") as f:
        f.write(json.dumps({"id": "test-99", "sample": 0, "completion": "#### 1"}) + "\n")
    with pytest.raises(DataError, match="test-99"):
        regrade_run(run, write=False)


def test_grade_batch_takes_one_finish_reason_per_completion():
    task = get_task("gsm8k")
    text = "James runs 60 * 3 = 180 meters in a week.\n#### 1"
    grades = task.grade_batch([text, text], [_ex("1"), _ex("1")], finish_reasons=["stop", "length"])
    assert [g.correct for g in grades] == [True, False]
    with pytest.raises(ValueError, match="finish reasons"):
        task.grade_batch([text], [_ex("1")], finish_reasons=[])


COMMITTED = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "smollm2-gsm8k"


@pytest.mark.data
@pytest.mark.skipif(not os.environ.get("ANCHORED_REASONING_DATA"), reason="ANCHORED_REASONING_DATA is not set")
@pytest.mark.parametrize("run", ["gsm8k-nocot", "gsm8k-cot"])
def test_the_committed_smollm2_run_is_graded_by_the_current_rules(run):
    """The committed records say what the grader says today (else: regrade_run them)."""
    result = regrade_run(COMMITTED / run, data_dir=os.environ["ANCHORED_REASONING_DATA"], write=False)
    assert result.graded == 50
    assert result.changes == []
    if run == "gsm8k-cot":
        record = next(json.loads(l) for l in (COMMITTED / run / "records.jsonl").open() if '"test-44"' in l)
        assert record["extracted"] == "40" and record["correct"] is False
