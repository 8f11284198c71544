"""benchmarks/prontoqa_real_runs.py: a finished recipe run graded from its validation records and paired."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import prontoqa_real_runs  # noqa: E402


def _run(tmp_path: Path, right: int, n: int = 800) -> Path:
    run = tmp_path / "run"
    (run / "validation" / "step-0002000").mkdir(parents=True)
    (run / "run_config.json").write_text(json.dumps({"recipe": {"method": {"name": "pause"}, "seed": 0,
                                                                 "model": {"name": "logic-gpt2-shift"}},
                                                     "completed_step": 2000}))
    rows = [{"id": f"t{i}", "sample": 0, "correct": i < right, "extracted": "True" if i % 2 else "False", "tokens": 9}
            for i in range(n)]
    (run / "validation" / "step-0002000" / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_a_run_is_graded_and_paired_with_the_same_seeds_anchor_chain(tmp_path):
    mirror = {"anchor_chain_h5_2000_train2-3-4-5_std1800_s0": {"real_test": {"_correct": {f"t{i}": 1 for i in range(800)}}}}
    entry = prontoqa_real_runs.grade_run(_run(tmp_path, right=400), mirror)
    assert entry["real_test"]["accuracy"] == 0.5 and entry["real_test"]["n"] == 800
    assert entry["real_test"]["answers"] == {"False": 400, "True": 400} and entry["real_test"]["no_answer"] == 0
    (pair,) = entry["paired"].values()
    assert pair["diff"] == -0.5 and pair["only_second_right"] == 400 and pair["only_this_right"] == 0
    assert pair["mcnemar_p"] < 1e-6


def test_an_unfinished_run_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="not the 800"):
        prontoqa_real_runs.grade_run(_run(tmp_path, right=10, n=100), {})
