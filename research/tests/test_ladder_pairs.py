"""research/ladder/ladder_pairs.py: a method run at another budget paired with a ladder's methods on the same
held-out problems, refused where the problems differ; each pair named so none replaces another."""
from __future__ import annotations

import json

import pytest

from benchmarks import depth_ladder as ladder
from research.ladder import ladder_pairs
from tests.test_depth_ladder_merge import HOPS, args_for, fake_run  # the ladder JSONs of the ladder's own tests


def test_ladder_pairs_compares_a_longer_run_with_a_ladder_on_the_same_problems(tmp_path, monkeypatch):
    monkeypatch.setattr(ladder, "plot", lambda *a, **k: None)
    base, long = tmp_path / "ladder.json", tmp_path / "long.json"
    ladder._write(base, {"cot": [fake_run(0, set(HOPS))]}, HOPS, args_for([0]), 0.0)
    longer = args_for([0])
    longer.train_steps = 40
    half = {i for i in HOPS if HOPS[i] == 1}  # right at 1 hop only
    ladder._write(long, {"anchor_walk": [fake_run(0, half)]}, HOPS, longer, 0.0)
    out = tmp_path / "pairs.json"
    ladder_pairs.main(["--a", f"{long}:anchor_walk", "--b", f"{base}:cot", "--out", str(out)])
    pair = json.loads(out.read_text())["pairs"]["anchor_walk_minus_cot"]
    assert pair["a"]["steps"] == [10] and pair["b"]["lr"] == 1e-3  # each side's own budget (fake runs say 10)
    assert pair["by_hops"]["1"]["diff"] == pytest.approx(0.0) and pair["by_hops"]["1"]["n"] == 4
    assert pair["by_hops"]["2"]["diff"] == pytest.approx(-1.0) and pair["by_hops"]["2"]["token_ratio"] == pytest.approx(1.0)
    other = args_for([0])
    other.eval_n = 8  # other held-out problems: nothing pairs up
    ladder._write(tmp_path / "other.json", {"cot": [fake_run(0, set(HOPS))]}, HOPS, other, 0.0)
    with pytest.raises(SystemExit, match="held_out_per_depth: 8 vs 4"):
        ladder_pairs.compare(f"{tmp_path / 'other.json'}:cot", f"{long}:anchor_walk")
    with pytest.raises(SystemExit, match="no per-problem records of 'pause'"):
        ladder_pairs.compare(f"{long}:pause", f"{base}:cot")



def test_ladder_pairs_names_a_method_of_another_json_by_that_json():
    assert ladder_pairs.pair_names("x/long.json:anchor_walk", ["y/ladder.json:cot", "y/ladder.json:anchor_walk"]) == \
        ["anchor_walk_minus_cot", "anchor_walk_minus_anchor_walk_of_ladder"]
    # one method from two JSONs (CoT at two budgets): each pair carries its JSON's name, none replaces the other
    assert ladder_pairs.pair_names("x/long.json:anchor_walk", ["y/ladder.json:cot", "z/cot2000.json:cot"]) == \
        ["anchor_walk_minus_cot_of_ladder", "anchor_walk_minus_cot_of_cot2000"]
    with pytest.raises(SystemExit, match="same comparison"):
        ladder_pairs.pair_names("x/long.json:anchor_walk", ["y/ladder.json:cot", "y/ladder.json:cot"])

