"""benchmarks/acot_vs_cot.py: the goals compare methods problem by problem (paired), on the problems both scored."""
from __future__ import annotations

import pytest
from benchmarks import acot_vs_cot


def test_goals_pair_methods_on_shared_problems():
    cot = {"accuracy": 0.75, "per_problem": {f"p{i}": 1.0 for i in range(40)} | {"only_cot": 0.0}}
    nocot = {"accuracy": 0.5, "per_problem": {f"p{i}": float(i % 2) for i in range(40)}}
    g = acot_vs_cot.goals({"prontoqa": {"cot": cot, "nocot": nocot}}, None)
    d = g["prontoqa_cot_minus_nocot"]
    assert d["n"] == 40 and d["diff"] == pytest.approx(0.5) and d["ci_low"] > 0
    assert "prontoqa_anchor_chain_minus_cot" not in g  # a pair runs only when both methods ran
    # an entry from before per-problem records were kept is skipped, not an error
    assert "prosqa_cot_minus_nocot" not in acot_vs_cot.goals({"prosqa": {"cot": {"accuracy": 0.5}, "nocot": nocot}}, None)


def test_run_one_reuses_a_finished_run_and_refuses_one_with_other_settings(tmp_path):
    """A finished run in the work folder is reused as it is; asked for other settings (here the step budget)
    the benchmark stops with the differing key instead of scoring the old model under the new label."""
    import argparse
    import json

    from anchored_reasoning.errors import ResumeError
    from anchored_reasoning.generators.prontoqa import generate_dataset

    train = generate_dataset(8, seed=1, split="t", hops=1)
    test = generate_dataset(2, seed=2, split="e", hops=1)

    def ns(steps):
        return argparse.Namespace(work=str(tmp_path), backbone="logic-gpt2-shift", preset=None, lr=1e-3,
                                  batch_size=2, train_seconds=0.0, train_steps=steps)

    first = acot_vs_cot.run_one("prontoqa", "nocot", 0, train, test, None, ns(2))
    assert first["steps"] == 2 and set(first["_correct"]) == {e.id for e in test}
    run_config = tmp_path / "prontoqa" / "nocot" / "seed0" / "model" / "run_config.json"
    sessions = json.loads(run_config.read_text())["sessions"]
    again = acot_vs_cot.run_one("prontoqa", "nocot", 0, train, test, None, ns(2))
    assert again["_correct"] == first["_correct"]
    assert json.loads(run_config.read_text())["sessions"] == sessions  # not trained again
    with pytest.raises(ResumeError, match="max_steps: 2 .* 3"):
        acot_vs_cot.run_one("prontoqa", "nocot", 0, train, test, None, ns(3))
