"""benchmarks/prontoqa_mirror.py's summary: methods over seeds, each paired with CoT on the same problems."""
from __future__ import annotations

import pytest
from benchmarks import prontoqa_mirror as mirror

IDS = [f"m{i}" for i in range(10)]


def entry(method: str, seed: int, right: int, hops: int = 2) -> dict:
    """``right`` of the ten problems correct (the first ones)."""
    return {"method": method, "hops": hops, "train_steps": 100, "seed": seed, "accuracy": right / 10, "tokens": 5.0 + seed,
            "_correct": {i: int(k < right) for k, i in enumerate(IDS)}}


def test_summary_averages_seeds_and_pairs_every_method_with_cot():
    results = {"a": entry("cot", 0, 4), "b": entry("anchor_chain", 0, 9), "c": entry("anchor_chain", 1, 7),
               "d": entry("nocot", 0, 5), "e": entry("cot", 0, 10, hops=3), "old": {"method": "cot", "hops": 2}}
    s = mirror.summarize(results)
    assert set(s) == {"h2_100", "h3_100"}
    ac = s["h2_100"]["anchor_chain"]
    assert ac["seeds"] == [0, 1] and ac["per_seed"] == [0.9, 0.7] and ac["accuracy"] == pytest.approx(0.8)
    assert ac["tokens"] == pytest.approx(5.5) and ac["n"] == 10
    pair = ac["minus_cot"]
    assert pair["diff"] == pytest.approx(0.5) and pair["seeds_paired"] == [0]  # seed 0 only: 0.9 - 0.4
    assert (pair["only_this_right"], pair["only_cot_right"]) == (5, 0) and pair["mcnemar_p"] == pytest.approx(0.0625)
    assert s["h2_100"]["nocot"]["minus_cot"]["diff"] == pytest.approx(0.1)
    results["f"] = entry("cot", 1, 0)  # CoT's seed 1 pairs with anchor_chain's seed 1 only
    pair = mirror.summarize(results)["h2_100"]["anchor_chain"]["minus_cot"]
    assert pair["seeds_paired"] == [0, 1] and pair["diff"] == pytest.approx((0.5 + 0.7) / 2)
    assert (pair["only_this_right"], pair["only_cot_right"]) == (12, 0)
    assert mirror.summarize(results)["h2_100"]["nocot"]["minus_cot"]["seeds_paired"] == [0]
    assert "minus_cot" not in s["h2_100"]["cot"] and "minus_cot" not in s["h3_100"]["cot"]


def test_real_test_grades_are_summarised_and_paired_like_the_mirrored_ones():
    results = {"a": entry("cot", 0, 4), "b": entry("anchor_chain", 0, 9), "c": entry("anchor_chain", 1, 7)}
    results["b"]["real_test"] = {**entry("anchor_chain", 0, 8), "_correct": {i: int(k < 8) for k, i in enumerate(IDS)}}
    results["a"]["real_test"] = {**entry("cot", 0, 5), "_correct": {i: int(k >= 5) for k, i in enumerate(IDS)}}
    s = mirror.summarize(results)["h2_100"]
    real = s["anchor_chain"]["real_test"]
    assert real["seeds"] == [0] and real["accuracy"] == pytest.approx(0.8)  # seed 1 was not graded on it
    pair = real["minus_cot"]  # anchor_chain right on m0-m7, CoT on m5-m9
    assert pair["diff"] == pytest.approx(0.3) and (pair["only_this_right"], pair["only_cot_right"]) == (5, 2)
    assert s["cot"]["real_test"]["accuracy"] == pytest.approx(0.5) and "minus_cot" not in s["cot"]["real_test"]
    assert s["anchor_chain"]["accuracy"] == pytest.approx(0.8)  # the mirrored grades are untouched
    del results["a"]["real_test"]
    assert "minus_cot" not in mirror.summarize(results)["h2_100"]["anchor_chain"]["real_test"]


def test_runs_trained_on_a_mix_of_depths_are_their_own_group():
    pure, mixed = entry("anchor_chain", 0, 3, hops=5), entry("anchor_chain", 0, 9, hops=5)
    mixed["train_hops"] = [2, 3, 4, 5]
    assert mirror.group_name(pure) == "h5_100" and mirror.group_name({**pure, "train_hops": [5]}) == "h5_100"
    s = mirror.summarize({"a": pure, "b": mixed})
    assert s["h5_100"]["anchor_chain"]["accuracy"] == pytest.approx(0.3)
    assert s["h5_100_train2-3-4-5"]["anchor_chain"]["accuracy"] == pytest.approx(0.9)


def test_learning_curves_follow_one_run_over_its_step_budgets():
    results = {"a": entry("anchor_chain", 0, 5), "b": {**entry("anchor_chain", 0, 8), "train_steps": 300},
               "c": {**entry("anchor_chain", 0, 9), "train_steps": 200, "chains": {"exact_chains": 7},
                     "polarity_probe": {"flip_rate": 0.9}, "real_test": {"accuracy": 0.75}},
               "d": {**entry("cot", 0, 4), "chains": {"exact_proofs": 3}}, "d2": {**entry("cot", 0, 6), "train_steps": 50},
               "e": {**entry("anchor_chain", 0, 6), "train_hops": [2, 3]},
               "summary": {"h2_100": {}}}
    curves = mirror.learning_curves(results)
    assert list(curves) == ["anchor_chain_h2_s0", "cot_h2_s0"]  # the mix was graded after one budget only
    assert [(p["steps"], p["exact_chains"]) for p in curves["cot_h2_s0"]] == [(50, None), (100, 3)]  # a CoT's proofs
    points = curves["anchor_chain_h2_s0"]
    assert [p["steps"] for p in points] == [100, 200, 300] and [p["accuracy"] for p in points] == [0.5, 0.9, 0.8]
    assert points[1]["exact_chains"] == 7 and points[1]["flip_rate"] == 0.9 and points[1]["real_test"] == 0.75
    assert "real_test" not in points[0] and points[0]["exact_chains"] is None


def test_runs_with_problems_of_the_published_construction_are_their_own_group():
    mixed = {**entry("anchor_chain", 0, 9, hops=5), "train_hops": [2, 3, 4, 5], "train_standard": 1800}
    assert mirror.group_name(mixed) == "h5_100_train2-3-4-5_std1800"
    assert mirror.mix_suffix(5, [5], 1800) == "_std1800" and mirror.mix_suffix(5, [5]) == ""
    s = mirror.summarize({"a": mixed, "b": {**mixed, "train_standard": 0}})
    assert set(s) == {"h5_100_train2-3-4-5_std1800", "h5_100_train2-3-4-5"}
