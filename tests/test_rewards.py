"""GRPO rewards (train/rewards.py): tables of (completion, expected reward) per task and reward, the gold
check at data load, bad completions scored 0 with the reason logged, and HumanEval tests counted in the
sandbox (a hanging program killed on its deadline)."""
from __future__ import annotations

import dataclasses
import logging
import time

import pytest

from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.tasks import get_task
from anchored_reasoning.train.data.collate import example_to_row
from anchored_reasoning.train.rewards import (
    AnchorCoverageReward,
    CorrectnessReward,
    FormatReward,
    CodeTestsReward,
    build_rewards,
    check_gold,
    instrument_tests,
    passed_share,
)
from anchored_reasoning.types import Example

GSM = Example(id="g1", question="Tom has 3 apples and buys 4 more. How many?", answer="7",
              steps=["3 + 4 = 7"], meta={"task": "gsm8k", "calculations": [["3+4=7"]]})
PROSQA = Example(id="p1", question="Every wumpus is a lempus. Tom is a wumpus. Is Tom a lempus or gorpus?",
                 answer="Tom is a lempus.", steps=["Tom is a wumpus.", "Every wumpus is a lempus."],
                 meta={"task": "prosqa", "answer_concept": "lempus", "neg_concept": "gorpus"})
PRONTO = Example(id="t1", question="Every cat is a feline. Rex is a cat. True or false: Rex is a feline.",
                 answer="True", steps=["Rex is a cat.", "Rex is a feline."], meta={"task": "prontoqa"})
HUMANEVAL = Example(
    id="HE/x", question="def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n", answer="",
    meta={"prompt": "def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n", "entry_point": "add",
          "test": "def check(candidate):\n    assert candidate(1, 1) == 2\n    assert candidate(0, 0) == 0\n"
                  "    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"})


def call(reward, completions, example):
    rows = [example_to_row(example)["example"]] * len(completions)
    return reward(prompts=[""] * len(completions), completions=completions, example=rows)


CORRECTNESS = [
    ("gsm8k", GSM, "3 + 4 = 7[EoR]\n#### 7", 1.0),
    ("gsm8k", GSM, "#### 7.0", 1.0),
    ("gsm8k", GSM, "#### 8", 0.0),
    ("gsm8k", GSM, "no number at all", 0.0),
    ("prosqa", PROSQA, "Tom is a wumpus.\n### Tom is a lempus.", 1.0),
    ("prosqa", PROSQA, "### Tom is a gorpus.", 0.0),
    ("prontoqa", PRONTO, "### True", 1.0),
    ("prontoqa", PRONTO, "### False", 0.0),
]


@pytest.mark.parametrize("task_name,example,completion,expected", CORRECTNESS)
def test_correctness_is_the_task_grade(task_name, example, completion, expected):
    task = get_task(task_name)
    assert call(CorrectnessReward(task), [completion], example) == [expected]
    assert float(task.grade(completion, example).correct) == expected  # the evals' own verdict


FORMAT = [
    ("gsm8k", GSM, "trained", "3 + 4 = 7\n#### 7", 1.0),
    ("gsm8k", GSM, "trained", "#### 7\nand some trailing words", 0.0),
    ("gsm8k", GSM, "trained", "The answer is 7", 0.0),
    ("gsm8k", GSM, "instruct", "The answer is 7.", 1.0),
    ("gsm8k", GSM, "instruct", "I think it is about 7", 0.0),
    ("prosqa", PROSQA, "trained", "### Tom is a gorpus.", 1.0),  # wrong answer, right form
    ("prosqa", PROSQA, "trained", "Tom is a lempus.", 0.0),
    ("prontoqa", PRONTO, "trained", "### False", 1.0),
]


@pytest.mark.parametrize("task_name,example,style,completion,expected", FORMAT)
def test_format_reward(task_name, example, style, completion, expected):
    assert call(FormatReward(get_task(task_name), style), [completion], example) == [expected]


def test_anchor_coverage_counts_gold_anchors_in_the_reasoning():
    reward = AnchorCoverageReward(get_task("prosqa"))
    full, half, answer_only = call(reward, ["Tom is a wumpus.\nEvery wumpus is a lempus.\n### Tom is a lempus.",
                                            "Tom is a wumpus.\n### Tom is a lempus.",
                                            "### Tom is a lempus."], PROSQA)
    assert full == 1.0 and 0.0 < half < 1.0 and answer_only == 0.0  # the answer line itself does not count
    assert call(reward, ["x"], dataclasses.replace(PROSQA, steps=[])) == [None]  # no anchors: not applicable


def test_chat_completions_are_read_from_the_last_message():
    reward = CorrectnessReward(get_task("gsm8k"))
    assert call(reward, [[{"role": "assistant", "content": "#### 7"}]], GSM) == [1.0]


def test_a_reward_that_raises_scores_zero_and_logs_why(caplog):
    reward = CorrectnessReward(get_task("gsm8k"))
    with caplog.at_level(logging.WARNING, logger="anchored_reasoning.train.rewards"):
        out = call(reward, ["#### 7", 12345, None, "#### 7"], GSM)  # malformed completions in the batch
    assert out == [1.0, 0.0, 0.0, 1.0]
    assert reward.failures == 2 and "TypeError" in reward.last_error
    assert "scored 0" in caplog.text

    class Exploding(CorrectnessReward):
        def score(self, text, example):
            raise RuntimeError("grader bug")

    boom = Exploding(get_task("gsm8k"))
    assert call(boom, ["#### 7"], GSM) == [0.0] and "grader bug" in boom.last_error


def test_gold_check_names_the_bad_row():
    gsm = get_task("gsm8k")
    check_gold([GSM], gsm)
    with pytest.raises(DataError, match=r"row 1 \(id 'bad'\).*'twelve'"):
        check_gold([GSM, dataclasses.replace(GSM, id="bad", answer="twelve")], gsm)
    prosqa = get_task("prosqa")
    check_gold([PROSQA], prosqa)
    with pytest.raises(DataError, match="row 0"):  # the gold concept is missing: never a free reward
        check_gold([dataclasses.replace(PROSQA, meta={"task": "prosqa"})], prosqa)
    with pytest.raises(DataError, match="check"):
        check_gold([dataclasses.replace(HUMANEVAL, meta={**HUMANEVAL.meta, "test": "assert True"})],
                   get_task("humaneval"))


def test_build_rewards_validates_names_and_weights():
    rs = build_rewards({"correctness": 1.0, "format": 0.0, "anchor_coverage": 0.5}, get_task("prosqa"))
    assert [f.name for f in rs.funcs] == ["correctness", "anchor_coverage"] and rs.weights == [1.0, 0.5]
    with pytest.raises(ConfigError, match="unknown reward 'corectness'"):
        build_rewards({"corectness": 1.0}, get_task("prosqa"))
    with pytest.raises(ConfigError, match="no reward"):
        build_rewards({"correctness": 0}, get_task("prosqa"))
    with pytest.raises(ConfigError, match="code task"):
        build_rewards({"tests_passed": 1.0}, get_task("gsm8k"))


def test_instrumented_check_counts_each_assert():
    code, total = instrument_tests(HUMANEVAL.meta["test"], "tag1")
    assert total == 4 and "_ar_passed_tag1" in code
    assert passed_share("noise\ntag1 3 4\n", "tag1") == 0.75
    assert passed_share("tag2 4 4\n", "tag1") is None  # another run's tag never counts


def test_tests_passed_runs_in_the_sandbox_and_kills_a_hang():
    task = get_task("humaneval")
    reward = CodeTestsReward(task, timeout_s=3.0)
    completions = [
        "    return a + b\n",                       # all 4 tests
        "    return a * b if a != 1 else 2\n",      # (1,1)=2, (0,0)=0 pass; (2,3), (-1,1) fail
        "    while True:\n        pass\n",          # hangs: killed on its deadline, 0
        "    print('tag 4 4')\n    return 0\n",      # a fake count does not help: (0,0), (-1,1) pass
    ]
    t0 = time.monotonic()
    out = call(reward, completions + ["    return (\n", "no code at all, just words"], HUMANEVAL)
    assert out == [1.0, 0.5, 0.0, 0.5, 0.0, 0.0]  # a syntax error or no code: 0, like a wrong answer
    assert reward.timeouts == 1 and reward.failures == 0  # the hang was killed on its deadline...
    assert time.monotonic() - t0 < 60  # ...not waited out
