"""research/ladder/trace_order.py: how many choices a proof makes forward and backward, along the example's own
proof, and two acot_vs_cot JSONs paired problem by problem."""
from __future__ import annotations

import pytest

from anchored_reasoning.generators.prontoqa import generate_dataset
from anchored_reasoning.types import Example
from research.ladder import trace_order


def test_trace_order_benchmark_counts_the_choices():
    rows = [trace_order.prontoqa_choices(ex) for ex in generate_dataset(50, seed=1)]
    s = trace_order.summarize(rows, skip_first_backward=True)
    assert s["n"] == 50 and s["proofs_backward_without_choice_after_first"] == 50
    assert s["proofs_forward_without_choice"] == 0  # every forward step has a side branch
    assert s["wrong_first_rule_backward_depths"] == {0: 50}


def test_prosqa_choices_follow_the_gold_proof_and_refuse_a_broken_one():
    """Degrees are counted along the example's own steps (not some other shortest path): a graph with two
    shortest paths gives the counts of the one the proof takes."""
    # 0 -> 1 -> 3 and 0 -> 2 -> 3; node 2 also has a second parent (4) and a second child (5)
    meta = {"edges": [[0, 1], [0, 2], [1, 3], [2, 3], [4, 2], [2, 5]], "root": 0, "target": 3,
            "idx_to_symbol": ["Tom", "wumpus", "yumpus", "lempus", "Bob", "zumpus"], "neg_target": 5}
    via = lambda mid: Example(id="p", question="q", answer="lempus", meta=meta,  # noqa: E731
                              steps=[f"Tom is a {mid}.", f"Every {mid} is a lempus."])
    assert trace_order.prosqa_choices(via("wumpus")) == {"forward": [2, 1], "backward": [1, 2]}
    assert trace_order.prosqa_choices(via("yumpus")) == {"forward": [2, 2], "backward": [2, 2]}
    with pytest.raises(ValueError, match="not a path"):
        trace_order.prosqa_choices(Example(id="p", question="q", answer="lempus", meta=meta,
                                           steps=["Tom is a zumpus.", "Every zumpus is a lempus."]))
    # random walks: forward 0 -> {1: reaches, 2: half (3 or the dead end 5)}; backward 3 -> {1, 2 -> {0, 4: dead}}
    assert trace_order.prosqa_walks(via("wumpus")) == {"forward": 0.75, "backward": 0.75, "backward_wrong_turns": 1}


def test_paired_cot_pairs_two_runs_on_the_problems_both_scored(tmp_path):
    import json

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"prontoqa": {"cot": {"per_problem": {"x": 1.0, "y": 1.0, "z": 0.0}}}}))
    b.write_text(json.dumps({"prontoqa": {"cot": {"per_problem": {"x": 1.0, "y": 0.0, "z": 0.0, "w": 1.0}}}}))
    p = trace_order.paired_cot(str(a), str(b))
    assert p["n"] == 3 and p["only_a_right"] == 1 and p["only_b_right"] == 0 and p["diff"] == pytest.approx(1 / 3, abs=1e-3)
