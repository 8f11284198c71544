"""Gold answers grade correct through task.grade on the full benchmark files.

Needs the real data: ``ANCHORED_REASONING_DATA`` pointing at a folder laid out like the
project's shared/data (CI sets it). GPQA questions are never printed: assertions report ids only.
"""
from __future__ import annotations

import os

import pytest

from anchored_reasoning.tasks import get_task

pytestmark = pytest.mark.data

DATA = os.environ.get("ANCHORED_REASONING_DATA")
needs_data = pytest.mark.skipif(
    not DATA, reason="ANCHORED_REASONING_DATA is not set (point it at the benchmark data folder, e.g. ../shared/data)"
)


def _failures(task, completions, examples):
    grades = [task.grade(c, e) for c, e in zip(completions, examples)]
    return [e.id for e, g in zip(examples, grades) if not g.correct], grades


@needs_data
def test_gsm8k_test_gold_solutions_strict():
    task = get_task("gsm8k")
    examples = task.load("test")
    assert len(examples) == 1319
    failed, grades = _failures(task, [e.meta["solution"] for e in examples], examples)
    assert failed == []
    assert all(g.details["strict"] and g.details["flexible"] for g in grades)


@needs_data
def test_gsm8k_wrong_answers_are_graded_wrong():
    task = get_task("gsm8k")
    examples = task.load("test", limit=200)
    wrong = [f"{e.meta['solution'].rpartition('####')[0]}#### {int(e.answer) + 1}" for e in examples]
    grades = [task.grade(c, e) for c, e in zip(wrong, examples)]
    assert not any(g.correct for g in grades)


@needs_data
@pytest.mark.parametrize("name", ["aime24", "aime25"])
def test_aime_gold(name):
    task = get_task(name)
    examples = task.load("test")
    assert len(examples) == 30
    # zero-padded boxed answers and "The answer is N." both count
    completions = [
        f"Thus the answer is \\boxed{{{e.answer.zfill(3)}}}." if i % 2 else f"The answer is {e.answer}."
        for i, e in enumerate(examples)
    ]
    failed, _ = _failures(task, completions, examples)
    assert failed == []
    off_by_one = [f"\\boxed{{{(int(e.answer) + 1) % 1000}}}" for e in examples]
    assert not any(task.grade(c, e).correct for c, e in zip(off_by_one, examples))


GPQA_SHAPES = [
    "Answer: {L}",
    "The answer is ({L}).",
    "After weighing the options, **{L}**",
    "{L}. is the right option",
    "So the correct answer is {L}",
    "Final: \\boxed{{{L}}}",
]


@needs_data
def test_gpqa_diamond_gold_letters():
    task = get_task("gpqa_diamond")
    examples = task.load("test")
    assert len(examples) == 198
    assert all(e.choices is not None and len(e.choices) == 4 for e in examples)
    assert len({e.answer for e in examples}) == 4  # shuffled: the gold letter varies
    completions = [GPQA_SHAPES[i % len(GPQA_SHAPES)].format(L=e.answer) for i, e in enumerate(examples)]
    failed, _ = _failures(task, completions, examples)
    assert failed == []
    wrong = [f"Answer: {'B' if e.answer == 'A' else 'A'}" for e in examples]
    assert not any(task.grade(c, e).correct for c, e in zip(wrong, examples))


@needs_data
def test_prosqa_test_gold_sentences():
    task = get_task("prosqa")
    examples = task.load("test")
    assert len(examples) == 500
    failed, _ = _failures(task, [e.answer for e in examples], examples)
    assert failed == []
    with_steps = [" ".join(e.steps) + " " + e.answer for e in examples]
    assert _failures(task, with_steps, examples)[0] == []
    negative = [f"{e.meta['entity']} is a {e.meta['neg_concept']}." for e in examples]
    assert not any(task.grade(c, e).correct for c, e in zip(negative, examples))


@needs_data
def test_prontoqa_test_gold():
    task = get_task("prontoqa")
    examples = task.load("test")
    assert len(examples) == 800
    failed, _ = _failures(task, [" ".join(e.steps) + " ### " + e.answer for e in examples], examples)
    assert failed == []
    flipped = ["False" if e.answer == "True" else "True" for e in examples]
    assert not any(task.grade(c, e).correct for c, e in zip(flipped, examples))


@needs_data
@pytest.mark.slow
def test_humaneval_canonical_solutions_pass():
    task = get_task("humaneval")
    examples = task.load("test")
    assert len(examples) == 164
    grades = task.grade_batch([e.meta["canonical_solution"] for e in examples], examples)
    assert [e.id for e, g in zip(examples, grades) if not g.correct] == []


@needs_data
@pytest.mark.slow
def test_humaneval_pass_body_fails_everywhere():
    task = get_task("humaneval")
    examples = task.load("test")
    grades = task.grade_batch(["    pass\n"] * len(examples), examples)
    assert [e.id for e, g in zip(examples, grades) if g.correct] == []
