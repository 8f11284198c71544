"""benchmarks/prontoqa_real_runs.py: a finished recipe run graded from its validation records and paired."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks import prontoqa_real_runs


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


def test_a_labelled_grid_is_keyed_apart_paired_within_and_summarised(tmp_path):
    def entry(method, seed, right, curriculum=False):
        run = tmp_path / f"{method}_{seed}"
        (run / "validation" / "step-0002000").mkdir(parents=True)
        recipe = {"method": {"name": method}, "seed": seed, "model": {"name": "m"}, "training": {"curriculum": curriculum}}
        (run / "run_config.json").write_text(json.dumps({"recipe": recipe, "completed_step": 2000}))
        rows = [{"id": f"t{i}", "sample": 0, "correct": i in right, "extracted": "True", "tokens": 9} for i in range(800)]
        (run / "validation" / "step-0002000" / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return prontoqa_real_runs.grade_run(run, {}, label="g")

    runs = [entry("cot", 0, set(range(400))), entry("cot", 1, set(range(500))),
            entry("pause", 0, set(range(300)), curriculum=True), entry("pause", 1, set(range(100, 400)), curriculum=True)]
    results = {prontoqa_real_runs.entry_key(e): e for e in runs}
    assert set(results) == {"cot_g_s0", "cot_g_s1", "pause_curriculum_g_s0", "pause_curriculum_g_s1"}
    assert prontoqa_real_runs.entry_key({"method": "pause", "seed": 0}) == "pause_s0"  # the recipe's plain run keeps its key
    summary = prontoqa_real_runs.pair_within(results, "g")
    assert summary["cot_g"]["per_seed"] == {"0": 0.5, "1": 0.625} and summary["cot_g"]["pooled"]["n"] == 1600
    pause = summary["pause_curriculum_g"]
    assert pause["pooled"]["accuracy"] == 0.375
    # seed 0: cot alone right on 100; seed 1: pause alone right on none, cot alone on 100 + 100
    assert pause["minus_cot"]["seeds_paired"] == [0, 1] and pause["minus_cot"]["only_cot_right"] == 300
    assert pause["minus_cot"]["only_this_right"] == 0 and pause["minus_cot"]["diff"] == -0.1875
    (pair,) = results["pause_curriculum_g_s1"]["paired"].values()  # with its seed's CoT; no anchor_chain in the grid
    assert pair["only_second_right"] == 200 and pair["seeds_paired"] == [1]
    assert "minus_cot" not in summary["cot_g"]


def test_a_run_is_paired_with_another_grids_runs_of_its_seed(tmp_path):
    grid = {"pause_curriculum_g_s0": {"method": "pause", "curriculum": True, "label": "g", "seed": 0,
                                      "_correct": {f"t{i}": int(i < 300) for i in range(800)}},
            "cot_g_s1": {"method": "cot", "label": "g", "seed": 1, "_correct": {f"t{i}": 1 for i in range(800)}},
            "summary": {"g": {}}}
    entry = prontoqa_real_runs.grade_run(_run(tmp_path, right=400), {})  # a pause run without a curriculum, seed 0
    assert prontoqa_real_runs.pair_with_grid(entry, grid, "g") == 1  # seed 1's CoT is not paired
    pair = entry["paired"]["pause - pause_curriculum_g (seed 0)"]
    assert pair["only_this_right"] == 100 and pair["only_second_right"] == 0 and pair["diff"] == 0.125
    assert prontoqa_real_runs.pair_with_grid(entry, grid, "other") == 0
    out = tmp_path / "out.json"
    out.write_text(json.dumps(grid))
    with pytest.raises(SystemExit, match="no run of that label has seed 0"):
        prontoqa_real_runs.main(["--run", str(tmp_path / "run"), "--out", str(out), "--pair-with", "nolabel"])
