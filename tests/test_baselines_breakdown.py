"""benchmarks/vllm_baselines_breakdown.py: a cut-off sample is blamed on the model when it loops and on
the budget when it was still going; the other categories follow the record's grade and extraction."""
from __future__ import annotations

import json
import random
from benchmarks import vllm_baselines_breakdown as bd

WORDS = ("the sum of the two numbers is then divided by three so that each share is an integer and the "
         "remainder is carried over to the next step where we multiply by the base").split()


def varied_text(n_words: int = 400, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(n_words))


def looping_text() -> str:
    # a preamble, then one sentence repeated and cut in the middle, as a greedy loop ends at the budget
    return varied_text(120) + " The area of triangle ABD is equal to the area of triangle BCD." * 40 + " The area of"


def test_repeated_share_separates_a_loop_from_varied_text():
    assert bd.repeated_share(looping_text()) >= 0.9
    assert bd.repeated_share(varied_text()) < 0.05
    assert bd.repeated_share("") == 0.0 and bd.repeated_share("too short") == 0.0


def test_classify_each_category():
    cut = {"correct": False, "finish_reason": "length", "extracted": None}
    assert bd.classify({"correct": True, "finish_reason": "length", "completion": looping_text()}) == "correct"
    assert bd.classify({**cut, "completion": looping_text()}) == "truncated: looping"
    assert bd.classify({**cut, "completion": varied_text()}) == "truncated: still going"
    assert bd.classify({**cut, "completion": None}) == "truncated: still going"
    assert bd.classify({"correct": False, "finish_reason": "stop", "extracted": "7", "completion": "x"}) == "wrong answer"
    assert bd.classify({"correct": False, "finish_reason": "stop", "extracted": "", "completion": "x"}) == "no answer: format"


def test_breakdown_counts_a_run_and_main_writes_the_json(tmp_path):
    run = tmp_path / "aime-cot"
    run.mkdir()
    records = [
        {"correct": True, "finish_reason": "stop", "extracted": "5", "completion": "... 5", "tokens": 10},
        {"correct": False, "finish_reason": "length", "extracted": None, "completion": looping_text(), "tokens": 64},
        {"correct": False, "finish_reason": "length", "extracted": None, "completion": varied_text(), "tokens": 64},
        {"correct": False, "finish_reason": "stop", "extracted": "3", "completion": "... 3", "tokens": 20},
    ]
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "config.json").write_text(json.dumps({"sampling": {"max_new_tokens": 64}}))
    row = bd.breakdown(run)
    assert row["samples"] == 4 and row["budget"] == 64 and row["median_tokens"] == 64
    assert [row[k] for k in bd.CATEGORIES] == [1, 1, 1, 1, 0]
    assert bd.main(str(tmp_path)) == 0
    written = json.loads((tmp_path / "breakdown.json").read_text())
    assert written["runs"] == [row]
