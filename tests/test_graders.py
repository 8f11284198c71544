"""Table-driven tests of the answer extractors and graders: (gold, completion, expected) rows."""
from __future__ import annotations

import threading
import time

import pytest

from anchored_reasoning.errors import DataError
from anchored_reasoning.tasks import get_task
from anchored_reasoning.tasks.extract import (
    choice_letter,
    gsm8k_strict,
    last_number,
    math_final,
    normalize_number,
    prosqa_concept,
    true_false,
)
from anchored_reasoning.tasks.mathcheck import check_math, close_workers
from anchored_reasoning.types import Example


def _ex(answer: str, **kw) -> Example:
    return Example(id="x", question="q", answer=answer, **kw)


# ----------------------------------------------------------------------------- GSM8K

GSM8K_ROWS = [
    # gold, completion, headline (correct), strict, flexible
    ("18", "She makes 9 * 2 = $18.\n#### 18", True, True, True),
    ("18", "#### 18.", True, True, True),
    ("18", "#### $18", True, True, True),
    ("18", "#### 18.00", True, True, True),
    ("1000", "#### 1,000", True, True, True),
    ("1000", "The answer is $1,000.", True, True, True),
    ("1000", "The final answer is 1000", True, True, True),
    ("1000", "Answer: 1000", True, True, True),
    ("-3", "#### -3", True, True, True),
    ("18", "so the total is \\boxed{18}.", True, True, True),
    ("18", "\\boxed{\\$18}", True, True, True),
    ("18", "#### 17\nWait, that is wrong. #### 18", True, True, True),  # last marker wins
    ("18", "#### 18\nThe answer is 17", False, False, False),
    # no marker: the headline takes the stated result, flexible the last number (3)
    ("18", "She has 18 eggs left over, 3 more than yesterday.", True, False, False),
    ("18", "3 eggs + 15 eggs = 18 eggs", True, False, True),  # no marker: strict fails
    ("18", "The answer is eighteen.", False, False, False),
    ("18", "", False, False, False),
    ("18", "I don't know.", False, False, False),
    ("18", "#### 81", False, False, False),
    ("0.5", "#### 0.50", True, True, True),
    ("2125", "It costs $2,125 in total.\n#### 2,125", True, True, True),
    ("7", "#### 7\n\n\nQuestion: next one has 12 apples", True, True, False),
    ("5", "step 1: 2+3=5\n#### 5 apples", True, True, True),
    # the answer sentence holds an expression: its value, not the first operand
    ("800", "The answer is 20 * $40 = $800.", True, True, True),
    ("20", "The final answer is 20 candles * $2.00 = $40.", False, False, False),
]


@pytest.mark.parametrize("gold,completion,headline,strict,flexible", GSM8K_ROWS)
def test_gsm8k_grader(gold, completion, headline, strict, flexible):
    task = get_task("gsm8k")
    grade = task.grade(completion, _ex(gold))
    assert grade.correct is headline
    assert grade.details["strict"] is strict
    assert grade.details["flexible"] is flexible
    assert grade.details["strict_extracted"] == gsm8k_strict(completion)
    if grade.details["answer_rule"] == "none":
        assert grade.extracted is None and not headline


@pytest.mark.parametrize(
    "text,expected",
    [("$1,000.", "1000"), ("-3.50", "-3.50"), (" 18 ", "18"), ("abc", None), ("1.2.3", None), ("", None)],
)
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


@pytest.mark.parametrize(
    "completion,expected",
    [
        ("a 12 b 3.5", "3.5"),
        ("costs $1,234,567 total", "1234567"),
        ("x2 and y3", None),
        ("the result: -7.", "-7"),
        ("16-3-4=9", "9"),
        ("no digits here", None),
        ("", None),
    ],
)
def test_last_number(completion, expected):
    assert last_number(completion) == expected


# ----------------------------------------------------------------------------- AIME / math

AIME_ROWS = [
    # gold, completion, correct, extracted
    ("25", "so \\boxed{25}", True, "25"),
    ("25", "\\boxed{025}", True, "025"),
    ("25", "first \\boxed{7}, then final \\boxed{25}", True, "25"),
    ("25", "\\boxed{\\frac{50}{2}}", True, "\\frac{50}{2}"),
    ("25", "\\boxed{\\text{25}}", True, "25"),
    ("25", "The answer is 25.", True, "25"),
    ("25", "Answer: $25$", True, "25"),
    ("25", "\\boxed{24}", False, "24"),
    ("25", "\\boxed{25.5}", False, "25.5"),
    ("0", "\\boxed{0}", True, "0"),
    ("999", "\\boxed{999}", True, "999"),
    ("25", "\\boxed{1025}", False, "1025"),  # out of range
    ("25", "the sum is 25", False, None),  # no final-answer marker
    ("25", "", False, None),
    ("25", "\\boxed{}", False, None),
    ("25", "\\boxed{x+1}", False, "x+1"),
]


@pytest.mark.parametrize("gold,completion,correct,extracted", AIME_ROWS)
def test_aime_grader(gold, completion, correct, extracted):
    grade = get_task("aime24").grade(completion, _ex(gold))
    assert grade.correct is correct
    assert grade.extracted == extracted


def test_aime_prediction_out_of_range_or_not_integer_is_wrong():
    grade = get_task("aime24").grade("\\boxed{1025}", _ex("25"))
    assert grade.correct is False and "0-999" in grade.details["error"]
    grade = get_task("aime24").grade("\\boxed{\\frac{1}{2}}", _ex("25"))
    assert grade.correct is False and "0-999" in grade.details["error"]


@pytest.mark.parametrize("gold", ["1000", "-1", "2.5", "abc", ""])
def test_aime_gold_outside_0_999_is_a_data_error(gold):
    with pytest.raises(DataError, match="0-999"):
        get_task("aime24").grade("\\boxed{5}", _ex(gold))


@pytest.mark.parametrize(
    "completion,expected",
    [
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{{a}{b}}", "{a}{b}"),
        ("The answer is 204.", "204"),
        ("#### 12", "12"),
        ("\\boxed{3", None),  # unbalanced
        ("nothing", None),
    ],
)
def test_math_final(completion, expected):
    assert math_final(completion) == expected


MATH_EQ_ROWS = [
    ("18", "18.0", True),
    ("0.5", "\\frac{1}{2}", True),
    ("0.5", "1/2", True),
    ("1000", "1,000", True),
    ("25", "025", True),
    ("3", "\\sqrt{9}", True),
    ("18", "19", False),
    ("18", "abc", False),
    ("-2", "2", False),
]


@pytest.mark.parametrize("gold,pred,equal", MATH_EQ_ROWS)
def test_check_math_table(gold, pred, equal):
    assert check_math(gold, pred).equal is equal


def test_unparseable_gold_is_an_error_not_a_free_pass():
    with pytest.raises(DataError, match="cannot be parsed"):
        check_math("", "18")
    with pytest.raises(DataError):
        get_task("aime24").grade("\\boxed{5}", _ex("not a number !!"))


SLOW = "9^{9^{9^{9}}}"  # math-verify spends seconds comparing this power tower with 1


def test_timeout_main_thread_is_graded_wrong():
    start = time.monotonic()
    result = check_math("1", SLOW, timeout=0.3)
    assert result.error == "timeout" and result.equal is False
    assert time.monotonic() - start < 3


def test_timeout_from_a_worker_thread_does_not_hang():
    out = []
    thread = threading.Thread(target=lambda: out.append(check_math("1", SLOW, timeout=0.3)))
    start = time.monotonic()
    thread.start()
    thread.join(60)
    try:
        assert not thread.is_alive()
        assert out[0].error == "timeout"
        assert time.monotonic() - start < 30
        # the pool recovers: the next comparison from a thread works
        out.clear()
        thread = threading.Thread(target=lambda: out.append(check_math("0.5", "\\frac{1}{2}", timeout=5)))
        thread.start()
        thread.join(60)
        assert out[0].equal is True and out[0].error is None
    finally:
        close_workers()


def test_grader_timeout_gives_error_detail():
    from anchored_reasoning.tasks import graders

    grade = graders.grade_math(f"\\boxed{{{SLOW}}}", _ex("1"), math_final, timeout=0.3, integer_range=[0, 999])
    assert grade.correct is False and grade.details["error"] == "timeout"
    assert grade.extracted == SLOW


def test_process_mode_has_a_hard_deadline():
    try:
        result = check_math("1", SLOW, timeout=0.3, mode="process")
        assert result.error == "timeout"
        assert check_math("2", "2", mode="process").equal is True
    finally:
        close_workers()


# ----------------------------------------------------------------------------- GPQA letters

GPQA_ROWS = [
    ("Answer: C", "C"),
    ("answer: c", "C"),
    ("The answer is (C).", "C"),
    ("The correct answer is C", "C"),
    ("the answer is **C**", "C"),
    ("**C**", "C"),
    ("**(B)**", "B"),
    ("I pick (D)", "D"),
    ("C. the third option", "C"),
    ("B) foo", "B"),
    ("C", "C"),
    ("C.", "C"),
    ("\\boxed{C}", "C"),
    ("\\boxed{\\text{B}}", "B"),
    ("\\boxed{(A)}", "A"),
    ("(A) is wrong, (B) is wrong, so the answer is D.", "D"),  # answer phrase beats parentheses
    ("Answer: B\nOn reflection the answer is D.", "D"),  # last within the same tier
    ("Answer: B. Final: \\boxed{A}", "A"),  # boxed beats phrases
    ("The answer is A bit tricky; **B**", "B"),  # "A bit" is the article
    ("The answer is A", "A"),
    ("Option E", "E"),  # only A-D exist: a committed answer outside the options, graded wrong
    ("The answer is E.", "E"),
    ("\\boxed{E}", "E"),
    ("Answer: (C) ... wait, \\boxed{F}", "F"),  # the last boxed letter is the final commitment
    ("The answer is I think", None),  # "I" is the pronoun, not a letter
    ("(E) looks odd; I pick (B)", "B"),
    ("I am not sure.", None),
    ("", None),
    ("a", None),  # lower-case letters only after "Answer:"
]


@pytest.mark.parametrize("completion,expected", GPQA_ROWS)
def test_choice_letter(completion, expected):
    example = _ex("C", choices=["w", "x", "y", "z"])
    assert choice_letter(completion, example) == expected
    grade = get_task("gpqa_diamond").grade(completion, example)
    assert grade.extracted == expected
    assert grade.correct is (expected == "C")


# ----------------------------------------------------------------------------- ProntoQA


@pytest.mark.parametrize(
    "completion,extracted",
    [
        ("True", "True"),
        ("false", "False"),
        ("Stella is floral. ### False", "False"),
        ("It is true that Stella is a wumpus. The answer is False.", "False"),
        ("TRUE.", "True"),
        ("untrue", None),
        ("", None),
        ("I cannot tell", None),
    ],
)
def test_prontoqa(completion, extracted):
    assert true_false(completion) == extracted
    grade = get_task("prontoqa").grade(completion, _ex("False"))
    assert grade.extracted == extracted
    assert grade.correct is (extracted == "False")


# ----------------------------------------------------------------------------- ProsQA

PROSQA_EX = _ex(
    "Sally is a sterpus.",
    meta={"answer_concept": "sterpus", "neg_concept": "hilpus", "entity": "Sally"},
)


@pytest.mark.parametrize(
    "completion,extracted",
    [
        ("Sally is a sterpus.", "sterpus"),
        ("Sally is a scrompus. Every scrompus is a rempus. Sally is a rempus. Sally is a sterpus.", "sterpus"),
        ("Sally is a hilpus.", "hilpus"),
        ("### Sally is a Sterpus.", "sterpus"),
        ("sterpus", "sterpus"),
        ("Sally is not a hilpus, so she is a sterpus", "sterpus"),
        ("Sally is not a hilpus.", None),
        ("Sally is a sterpus. Wait, no: Sally is a hilpus.", "hilpus"),
        ("Sally is a rempus.", "rempus"),  # neither option: a wrong answer, not "no answer"
        ("", None),
    ],
)
def test_prosqa(completion, extracted):
    assert prosqa_concept(completion, PROSQA_EX) == extracted
    grade = get_task("prosqa").grade(completion, PROSQA_EX)
    assert grade.extracted == extracted
    assert grade.correct is (extracted == "sterpus")


def test_grade_rejects_non_string():
    with pytest.raises(TypeError):
        get_task("gsm8k").grade(None, _ex("1"))  # type: ignore[arg-type]


def test_grade_batch_maps_for_non_code_tasks():
    task = get_task("prontoqa")
    grades = task.grade_batch(["True", "no idea", "false"], [_ex("True"), _ex("True"), _ex("False")])
    assert [g.correct for g in grades] == [True, False, True]
    assert grades[1].extracted is None
    with pytest.raises(ValueError):
        task.grade_batch(["True"], [])


# ----------------------------------------------------------------------------- junk never crashes

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_PIECES = list("0123456789 .,$-+*/=()[]{}\\#:abcxyzABCD\n") + [
    "\\boxed{", "answer is ", "#### ", "**", "True", "Sally is a ", "sterpus", "\\frac{",
]
_JUNK = st.lists(st.sampled_from(_PIECES), max_size=40).map("".join)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(completion=_JUNK)
def test_junk_completions_grade_without_errors(completion):
    cases = [
        ("gsm8k", _ex("18")),
        ("aime24", _ex("25")),
        ("gpqa_diamond", _ex("C", choices=["w", "x", "y", "z"])),
        ("prontoqa", _ex("True")),
        ("prosqa", PROSQA_EX),
    ]
    for name, example in cases:
        grade = get_task(name).grade(completion, example)
        assert isinstance(grade.correct, bool)
        assert grade.extracted is None or isinstance(grade.extracted, str)
        if grade.extracted is None:
            assert grade.correct is False


HOSTILE = [
    "answer" + " " * 20000 + "!",
    "The answer is" + " " * 20000 + "x",
    "#### " + " " * 20000,
    "** " * 10000,
    "\n" * 20000 + "x",
    "\\boxed{" * 10000,
    "\\boxed{" * 10000 + "}" * 10000,
    "answer is " * 5000,
    "Sally is a " * 5000,
]


@pytest.mark.parametrize("index", range(len(HOSTILE)))
def test_extractors_stay_fast_on_hostile_text(index):
    from anchored_reasoning.tasks.extract import EXTRACTORS

    text = HOSTILE[index]
    start = time.monotonic()
    for extractor in EXTRACTORS.values():
        extractor(text, PROSQA_EX)
    # linear-time patterns take milliseconds here; backtracking ones took minutes
    assert time.monotonic() - start < 5
