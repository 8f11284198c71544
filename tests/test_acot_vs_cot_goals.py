"""benchmarks/acot_vs_cot.py: the goals compare methods problem by problem (paired), on the problems both scored."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import acot_vs_cot  # noqa: E402


def test_goals_pair_methods_on_shared_problems():
    cot = {"accuracy": 0.75, "per_problem": {f"p{i}": 1.0 for i in range(40)} | {"only_cot": 0.0}}
    nocot = {"accuracy": 0.5, "per_problem": {f"p{i}": float(i % 2) for i in range(40)}}
    g = acot_vs_cot.goals({"prontoqa": {"cot": cot, "nocot": nocot}}, None)
    d = g["prontoqa_cot_minus_nocot"]
    assert d["n"] == 40 and d["diff"] == pytest.approx(0.5) and d["ci_low"] > 0
    assert "prontoqa_anchor_chain_minus_cot" not in g  # a pair runs only when both methods ran
    # an entry from before per-problem records were kept is skipped, not an error
    assert "prosqa_cot_minus_nocot" not in acot_vs_cot.goals({"prosqa": {"cot": {"accuracy": 0.5}, "nocot": nocot}}, None)
