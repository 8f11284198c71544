"""benchmarks/lm_eval_vs_harness at the smallest setting (not a timing): lm-eval's ``hf`` model on the local task
``anchored_gsm8k_cot`` (benchmarks/lm_eval_tasks, offline) sees the prompts the library's runner sends, and the
result JSON carries both sides' runs, identical-text shares and both gradings."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("lm_eval")

from anchored_reasoning.testing import make_tiny_causal_lm  # noqa: E402
from benchmarks import lm_eval_vs_harness  # noqa: E402

ROWS = [("Tom has 3 apples and buys 4 more. How many apples does he have?", "3+4=<<3+4=7>>7\n#### 7"),
        ("A box holds 12 eggs. How many eggs are in 2 boxes?", "12*2=<<12*2=24>>24\n#### 24"),
        ("Sara reads 5 pages a day for 6 days. How many pages?", "5*6=<<5*6=30>>30\n#### 30")]


@pytest.mark.parametrize("one_chunk", [True, False])
def test_dry_run_writes_both_sides(tmp_path, monkeypatch, one_chunk):
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    (data / "test.jsonl").write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in ROWS))
    monkeypatch.setenv("ANCHORED_REASONING_DATA", str(tmp_path / "data"))
    model = make_tiny_causal_lm(tmp_path / "tiny")
    out = tmp_path / "result.json"
    assert lm_eval_vs_harness.main(["--model", str(model), "--problems", "3", "--max-new-tokens", "4",
                                    "--batch-size", "2", "--repeats", "2", "--threads", "1",
                                    "--work", str(tmp_path / "work"), "--out", str(out)]
                                   + ([] if one_chunk else ["--no-one-chunk"])) == 0
    result = json.loads(out.read_text())
    assert result["same_prompt_text"] == "3/3"  # lm-eval built the prompts the library sends
    libraries = ["library", "library_one_chunk"] if one_chunk else ["library"]
    assert set(result["runs"]) == {*libraries, "lm_eval"}
    assert all(len(r) == 2 and all(x["text_tokens"] > 0 for x in r) for r in result["runs"].values())
    assert result["identical_texts_vs_lm_eval"] == {side: "3/3" for side in libraries}
    assert result["lm_eval_metric_reproduced"] == {"strict-match": True, "flexible-extract": True}
    for side in ("library", "lm_eval"):
        grading = result["grading"][side]
        assert set(grading["lm_eval_metric"]) == {"strict-match", "flexible-extract"}
        assert set(grading["library_grader"]) == {"accuracy", "strict", "flexible"}
    assert result["setting"]["max_new_tokens"] == 4 and result["setting"]["batch_size"] == 2
    assert {"threads", "loadavg_1min_before_after", "lm_eval"} <= set(result["machine"])


def test_lm_eval_scores_follow_lm_evals_gsm8k_filters():
    texts = ["So the answer is:\n#### 1,000", "The total is 24 eggs.", "#### 7\nthen 8"]
    scores = lm_eval_vs_harness.lm_eval_scores(texts, ["1000", "24", "8"])
    assert scores == {"strict-match": [1, 0, 0], "flexible-extract": [1, 1, 1]}
