"""research/diffusion/anchor_refresh.py's selection and pooling, on synthetic seeds (no model): the pick is the most
accurate confidence setting within K = 3's anchor budget, and the goal check reads the paired test and the
side-by-side speed ratio."""
from __future__ import annotations

import pytest

from research.diffusion import anchor_refresh as ar


def test_pick_is_the_most_accurate_setting_within_the_budget():
    sweep = {"k1": {"accuracy": 0.75, "refresh_fraction": 1.0}, "k3": {"accuracy": 0.62, "refresh_fraction": 0.375},
             "conf_k8_tau0.99": {"accuracy": 0.76, "refresh_fraction": 0.50},  # best, but over budget
             "conf_k8_tau0.95": {"accuracy": 0.74, "refresh_fraction": 0.30},
             "conf_k16_tau0.95": {"accuracy": 0.74, "refresh_fraction": 0.20},  # tie: the cheaper wins
             "conf_k16_tau0.5": {"accuracy": 0.60, "refresh_fraction": 0.07}}
    assert ar.pick(sweep, "k3") == "conf_k16_tau0.95"
    with pytest.raises(RuntimeError, match="no confidence setting is as cheap as k1"):
        ar.pick({"k1": {"accuracy": 0.7, "refresh_fraction": 0.01}, "conf_k4_tau0.9": {"accuracy": 0.7, "refresh_fraction": 0.3}}, "k1")


def seed(s: int, picked_right: list[bool], k1_right: list[bool], picked_tps: float) -> dict:
    rows = {name: {"correct": right, "accuracy": sum(right) / len(right), "tokens_per_s": tps, "refresh_fraction": frac}
            for name, right, tps, frac in (("mdlm:1", k1_right, 105.0, None), ("tadm_m:1", k1_right, 100.0, 1.0),
                                           ("tadm_m:3", [False] * len(k1_right), 150.0, 0.375),
                                           ("tadm_m:picked", picked_right, picked_tps, 0.2))}
    return {"seed": s, "held_out_ids": [f"p{i}" for i in range(len(k1_right))], "valid_ids": ["v0"], "rows": rows,
            "picked": "conf_k16_tau0.95", "sweep": {"k3": {"accuracy": 0.5, "refresh_fraction": 0.375}},
            "models": {}, "settings": {}, "command": "x", "date": "2026-12-03", "machine": "m"}


def test_aggregate_pools_seeds_and_checks_the_goal():
    right = [True, True, False, True]
    out = ar.aggregate([seed(0, right, right, 170.0), seed(1, right, right, 160.0)], 3, note="quiet")
    picked = out["goal_check"]["tadm_m:picked"]
    assert picked["speedup_vs_tadm_k1"] == pytest.approx(1.65) and picked["speed_met"]
    assert picked["accuracy_diff"] == pytest.approx(0.0) and picked["accuracy_within_1_point"]
    assert out["table"]["tadm_m:picked"]["speedup_vs_tadm_k1_per_seed"] == pytest.approx([1.7, 1.6])
    fixed = out["goal_check"]["tadm_m:3"]  # fast enough, but every answer lost
    assert fixed["speed_met"] and not fixed["accuracy_within_1_point"] and fixed["accuracy_diff"] == pytest.approx(-0.75)
    assert out["timing_note"] == "quiet" and out["seeds"] == [0, 1]
    with pytest.raises(ValueError, match="different problems"):
        other = seed(1, right, right, 160.0)
        other["held_out_ids"] = ["q0", "q1", "q2", "q3"]
        ar.aggregate([seed(0, right, right, 170.0), other], 3)
