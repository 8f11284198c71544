"""Metrics: bootstrap intervals, unbiased pass@k, paired differences, and run summaries."""
from __future__ import annotations

import math

import numpy as np
import pytest

from anchored_reasoning.eval.metrics import (
    bootstrap_ci,
    mean_ci,
    paired_bootstrap_diff,
    per_problem_over_seeds,
    pass_at_k,
    pass_at_k_per_problem,
    sensible_ks,
)
from anchored_reasoning.eval.report import markdown_table, render_markdown, summarize


@pytest.mark.parametrize(
    "n,c,k,expected",
    [
        (5, 2, 1, 0.4),  # c/n
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (5, 0, 3, 0.0),
        (5, 4, 2, 1.0),  # n - c < k: some correct sample is always drawn
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (1, 1, 1, 1.0),
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_combinatorial_formula():
    for n in range(1, 15):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12), (n, c, k)


def test_pass_at_k_rejects_bad_arguments():
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)
    assert list(pass_at_k_per_problem([4, 4], [0, 4], 2)) == [0.0, 1.0]
    assert sensible_ks(1) == [1]
    assert sensible_ks(7) == [1, 5, 7]
    assert sensible_ks(20) == [1, 5, 10, 20]


def test_bootstrap_two_points_hand_computed():
    # Resampling [0, 1] twice gives means 0 (p=1/4), 0.5 (1/2), 1 (1/4): the 95% interval is [0, 1].
    assert bootstrap_ci([0.0, 1.0], seed=3) == (0.0, 1.0)
    # A constant sample has a degenerate interval; one value gives (v, v); none gives nan.
    assert bootstrap_ci([1.0] * 10) == (1.0, 1.0)
    assert bootstrap_ci([0.25]) == (0.25, 0.25)
    assert all(math.isnan(v) for v in bootstrap_ci([]))


def test_bootstrap_is_seeded_and_close_to_normal_theory():
    rng = np.random.default_rng(0)
    x = (rng.random(400) < 0.5).astype(float)
    a = bootstrap_ci(x, seed=1)
    assert a == bootstrap_ci(x, seed=1)
    assert a != bootstrap_ci(x, seed=2)
    m = x.mean()
    half = 1.96 * math.sqrt(m * (1 - m) / len(x))  # ~0.049
    assert a[0] < m < a[1]
    assert (a[1] - a[0]) / 2 == pytest.approx(half, rel=0.15)
    stats = mean_ci(x)
    assert stats["mean"] == pytest.approx(m) and stats["n"] == 400


def test_paired_diff():
    a = [1, 1, 1, 0, 1, 1, 1, 1]
    b = [0, 1, 0, 0, 0, 1, 0, 1]
    d = paired_bootstrap_diff(a, b, seed=0)
    assert d["diff"] == pytest.approx(0.5)
    assert 0 < d["ci_low"] <= 0.5 <= d["ci_high"] <= 1
    assert d["p_le_0"] < 0.05
    with pytest.raises(ValueError):
        paired_bootstrap_diff([1, 0], [1])


def test_per_problem_over_seeds_averages_on_the_problems_every_seed_graded():
    seeds = [{"q1": 1, "q2": 0, "q3": 1}, {"q1": 0, "q2": 0, "q3": 1, "q4": 1}]
    assert per_problem_over_seeds(seeds) == {"q1": 0.5, "q2": 0.0, "q3": 1.0}  # q4: one seed only
    assert per_problem_over_seeds(seeds[:1]) == {"q1": 1.0, "q2": 0.0, "q3": 1.0}
    with pytest.raises(ValueError, match="no seeds"):
        per_problem_over_seeds([])


def _rec(i, s, correct, **details):
    return {"id": f"q{i}", "sample": s, "correct": correct, "extracted": "1" if correct else None,
            "tokens": 10, "seconds": 0.5, "details": details, "finish_reason": "stop"}


def test_summarize_strict_flexible_and_counts():
    records = [
        _rec(0, 0, True, strict=True, flexible=True),
        _rec(1, 0, True, strict=False, flexible=True),
        _rec(2, 0, False, strict=False, flexible=False),
        _rec(3, 0, False, strict=False, flexible=True),
        _rec(99, 0, True),  # not among the asked ids: ignored
    ]
    s = summarize(records, metrics=["accuracy", "strict", "flexible"], ids=["q0", "q1", "q2", "q3", "q4"])
    assert s["accuracy"]["mean"] == pytest.approx(0.5)
    assert s["metrics"]["strict"]["mean"] == pytest.approx(0.25)
    assert s["metrics"]["flexible"]["mean"] == pytest.approx(0.75)
    assert s["counts"]["missing"] == 1 and s["counts"]["samples"] == 4 and s["counts"]["no_answer"] == 2
    assert s["tokens"]["mean"] == 10 and s["tokens"]["tokens_per_second"] == pytest.approx(20.0)
    assert "pass_at_k" not in s


def test_summarize_pass_at_k_per_problem():
    # problem 0: 2 of 4 correct, problem 1: 0 of 4, problem 2: 4 of 4
    records = [_rec(0, s, s < 2) for s in range(4)] + [_rec(1, s, False) for s in range(4)] + [_rec(2, s, True) for s in range(4)]
    s = summarize(records, metrics=["pass@k"], is_code=True, n=4)
    assert set(s["pass_at_k"]) == {"pass@1", "pass@4"}
    assert s["pass_at_k"]["pass@1"]["mean"] == pytest.approx((0.5 + 0 + 1) / 3)
    p2 = 1 - math.comb(2, 2) / math.comb(4, 2)
    assert s["pass_at_k"]["pass@4"]["mean"] == pytest.approx((1 + 0 + 1) / 3)
    assert pass_at_k(4, 2, 2) == pytest.approx(p2)
    assert s["accuracy"]["mean"] == pytest.approx(0.5)


def test_markdown_table_has_one_row_per_summary():
    s1 = summarize([_rec(0, 0, True, strict=True)], metrics=["accuracy", "strict"], meta={"task": "gsm8k", "method": "cot", "model": "m"})
    s2 = summarize([_rec(0, 0, False)], meta={"task": "gsm8k", "method": "nocot", "model": "m"})
    table = markdown_table([s1, s2])
    lines = table.strip().splitlines()
    assert len(lines) == 4 and "strict %" in lines[0]
    assert "| cot |" in lines[2] and "100.0" in lines[2]
    assert "| nocot |" in lines[3] and lines[3].count("| - |") >= 1  # nocot has no strict column value
    assert render_markdown(s1).startswith("# gsm8k / cot / m")
