"""The depth ladder's JSON merges seeds run by separate commands (a `--seeds 1` run used to replace
seed 0's aggregate), and refuses, before training, a merge it cannot make."""
from __future__ import annotations

import argparse
import json

import pytest

from benchmarks import depth_ladder as ladder

HOPS = {f"p{i}": 1 + i % 2 for i in range(8)}  # four 1-hop and four 2-hop problems


def fake_run(seed: int, right: set[str]) -> dict:
    return {"seed": seed, "steps": 10, "train_seconds": 1.0, "accuracy": len(right) / len(HOPS), "tokens": 5.0,
            "tokens_by_hops": {"1": 5.0, "2": 5.0}, "flip_rate": 0.5, "probe_by_hops": {"1": {"flip_rate": 0.5}},
            "by_hops": {}, "_correct": {i: i in right for i in HOPS}}


def args_for(seeds: list[int]) -> argparse.Namespace:
    return argparse.Namespace(hops=[1, 2], train_n=10, eval_n=4, train_steps=10, batch_size=2, lr=1e-3, backbone="x",
                              tokens_per_anchor=1, min_steps_per_stage=None, threads=1, machine_note=None,
                              methods=["cot"], seeds=seeds, trace="forward", step_separator="\n", max_new_tokens=96)


def test_a_second_seed_merges_with_the_first(tmp_path, monkeypatch):
    monkeypatch.setattr(ladder, "plot", lambda *a, **k: None)
    out = tmp_path / "ladder.json"
    every, half = set(HOPS), {i for i in HOPS if HOPS[i] == 1}
    ladder._write(out, {"cot": [fake_run(0, every)]}, HOPS, args_for([0]), 0.0)
    ladder.check_mergeable(out, ["cot"], [1])  # seed 0's records are kept: no refusal
    ladder._write(out, {"cot": [fake_run(1, half)]}, HOPS, args_for([1]), 0.0)
    entry = json.loads(out.read_text())["methods"]["cot"]
    assert entry["seeds"] == [0, 1]
    assert entry["accuracy"] == pytest.approx(0.75)  # (1.0 + 0.5) / 2, not seed 1's 0.5 alone
    assert entry["by_hops"]["2"]["accuracy"] == pytest.approx(0.5)
    ladder._write(out, {"cot": [fake_run(1, every)]}, HOPS, args_for([1]), 0.0)  # a rerun of a seed replaces it
    assert json.loads(out.read_text())["methods"]["cot"]["accuracy"] == pytest.approx(1.0)


def test_a_json_without_per_seed_records_is_refused_before_training(tmp_path):
    out = tmp_path / "old.json"
    out.write_text(json.dumps({"methods": {"cot": {"seeds": [0, 1]}}}))
    with pytest.raises(SystemExit, match=r"seeds \[0, 1\] without their per-problem records"):
        ladder.check_mergeable(out, ["cot"], [2])
    ladder.check_mergeable(out, ["cot"], [0, 1, 2])  # all seeds named: their runs are re-aggregated
    ladder.check_mergeable(out, ["nocot"], [2])  # another method: nothing to merge


def test_a_single_seed_entry_written_before_runs_were_kept_is_rebuilt(tmp_path, monkeypatch):
    """The committed ladder predates ``_runs``; a method of one seed keeps that seed's 0/1 record whole
    in ``_per_problem``, so seeds added later merge with it (a 3-seed method's average cannot be split)."""
    monkeypatch.setattr(ladder, "plot", lambda *a, **k: None)
    out = tmp_path / "ladder.json"
    every, half = set(HOPS), {i for i in HOPS if HOPS[i] == 1}
    ladder._write(out, {"cot": [fake_run(0, half)]}, HOPS, args_for([0]), 0.0)
    ladder._write(out, {"nocot": [fake_run(0, half), fake_run(1, every)]}, HOPS, args_for([0, 1]), 0.0)
    old = json.loads(out.read_text())
    del old["_runs"]  # as written before 2026-12-02
    out.write_text(json.dumps(old))
    ladder.check_mergeable(out, ["cot"], [1])  # rebuilt: no refusal
    with pytest.raises(SystemExit, match="nocot has seeds"):
        ladder.check_mergeable(out, ["nocot"], [2])  # two seeds' average: not rebuilt
    ladder._write(out, {"cot": [fake_run(1, every)]}, HOPS, args_for([1]), 0.0)
    entry = json.loads(out.read_text())["methods"]["cot"]
    assert entry["seeds"] == [0, 1]
    assert entry["accuracy"] == pytest.approx(0.75)
    assert entry["by_hops"]["2"]["accuracy"] == pytest.approx(0.5)


def test_goals_pair_the_papers_ablations_per_depth_and_regoal_keeps_the_runs(tmp_path, monkeypatch):
    """ACoT against pause-as-thought (same curriculum, no anchors), against acot_keep (steps kept) and
    stepwise, per depth and paired; rewriting the goals from the kept runs changes nothing else."""
    monkeypatch.setattr(ladder, "plot", lambda *a, **k: None)
    out = tmp_path / "ladder.json"
    every, half = set(HOPS), {i for i in HOPS if HOPS[i] == 1}
    ladder._write(out, {"acot": [fake_run(0, every)], "pause_as_thought": [fake_run(0, half)]}, HOPS, args_for([0]), 0.0)
    before = json.loads(out.read_text())
    pair = before["goals"]["ablations"]["acot_minus_pause_as_thought"]
    assert pair["1"]["diff"] == pytest.approx(0.0) and pair["2"]["diff"] == pytest.approx(1.0) and pair["2"]["n"] == 4
    assert "acot_minus_stepwise" not in before["goals"]["ablations"]  # only pairs that both ran
    del before["goals"]["ablations"]
    out.write_text(json.dumps(before))
    ladder._write(out, {}, HOPS, args_for([0]), 0.0)  # what --regoal does
    after = json.loads(out.read_text())
    assert after["goals"]["ablations"]["acot_minus_pause_as_thought"] == pair
    assert {k: v for k, v in after.items() if k != "goals"} == {k: v for k, v in before.items() if k != "goals"}


def test_goals_pair_both_decoded_chains_with_cot_and_their_token_ratio(tmp_path, monkeypatch):
    monkeypatch.setattr(ladder, "plot", lambda *a, **k: None)
    out = tmp_path / "ladder.json"
    every, half = set(HOPS), {i for i in HOPS if HOPS[i] == 1}
    walk = {**fake_run(0, every), "tokens_by_hops": {"1": 1.0, "2": 2.0}}
    ladder._write(out, {"cot": [fake_run(0, half)], "anchor_walk": [walk]}, HOPS, args_for([0]), 0.0)
    goals = json.loads(out.read_text())["goals"]
    assert "anchor_chain_minus_cot" not in goals  # only what ran
    pair = goals["anchor_walk_minus_cot"]
    assert pair["2"]["diff"] == pytest.approx(1.0) and pair["1"]["diff"] == pytest.approx(0.0)
    assert pair["1"]["token_ratio"] == pytest.approx(1 / 5) and pair["2"]["token_ratio"] == pytest.approx(2 / 5)


def test_regoal_reads_the_held_out_hops_from_the_json_instead_of_regenerating(tmp_path, monkeypatch):
    monkeypatch.setattr(ladder, "plot", lambda *a, **k: None)
    out = tmp_path / "ladder.json"
    ladder._write(out, {"acot": [fake_run(0, set(HOPS))], "pause_as_thought": [fake_run(0, set())]}, HOPS,
                  args_for([0]), 0.0)
    assert json.loads(out.read_text())["_held_out_hops"] == HOPS
    before = json.loads(out.read_text())["goals"]

    def no_regeneration(*a, **k):
        raise AssertionError("--regoal regenerated the problems")

    monkeypatch.setattr(ladder, "ladder_problems", no_regeneration)
    assert ladder.main(["--regoal", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["goals"] == before
    data = json.loads(out.read_text())
    del data["_held_out_hops"]  # a JSON written before the map existed falls back to regenerating
    out.write_text(json.dumps(data))
    with pytest.raises(AssertionError, match="regenerated"):
        ladder.main(["--regoal", "--out", str(out)])


def test_a_work_folder_with_another_step_budget_is_refused_not_reused(tmp_path):
    """run_one used to score whatever finished model sat in <work>/<method>/seed<seed>; now the trainer
    compares recipes, so a rerun with another budget stops with the differing key."""
    from anchored_reasoning.errors import ResumeError
    from anchored_reasoning.eval.probes import binding_probe_examples

    train, held, hops = ladder.ladder_problems([1], 2, 8)
    args = ladder.parse_args(["--hops", "1", "--train-steps", "2", "--batch-size", "2", "--work", str(tmp_path)])
    first = ladder.run_one("nocot", 0, train, held, binding_probe_examples(held), hops, args)
    assert first["steps"] == 2 and len(first["_correct"]) == len(held)
    args.train_steps = 3
    with pytest.raises(ResumeError, match="max_steps: 2 .* 3"):
        ladder.run_one("nocot", 0, train, held, binding_probe_examples(held), hops, args)


def test_a_ladder_of_another_trace_or_backbone_is_not_merged_into(tmp_path, monkeypatch):
    """depth_ladder.json (the proof, logic-gpt2-shift) and a ladder on the written search are different
    experiments: a run of the second aimed at the first's JSON stops before training, naming what differs."""
    monkeypatch.setattr(ladder, "plot", lambda *a, **k: None)
    out = tmp_path / "ladder.json"
    ladder._write(out, {"cot": [fake_run(0, set(HOPS))]}, HOPS, args_for([0]), 0.0)
    same = args_for([1])
    ladder.check_mergeable(out, ["cot"], [0, 1], same)
    other = args_for([1])
    other.trace, other.step_separator, other.backbone = "dfs", " ", "logic-gpt2-search"
    with pytest.raises(SystemExit, match="trace: 'forward' there, 'dfs' here.*backbone|backbone.*trace: 'forward' there"):
        ladder.check_mergeable(out, ["cot"], [0, 1], other)
    old = json.loads(out.read_text())
    for key in ("trace", "step_separator"):  # a JSON from before the option: the proof, steps on lines
        del old["setup"][key]
    out.write_text(json.dumps(old))
    ladder.check_mergeable(out, ["cot"], [0, 1], same)


def test_the_ladder_on_the_written_search_trains_on_it_and_replays_the_searches(tmp_path):
    """--trace dfs: the training targets are the depth-first search (steps joined by a space, as the
    search backbone was pretrained), generation gets the longer budget, and each run keeps its searches
    replayed per depth instead of the forward-walk reading."""
    from anchored_reasoning.eval.probes import binding_probe_examples
    from anchored_reasoning.generators.traces import BACK_UP

    args = ladder.parse_args(["--hops", "1", "2", "--trace", "dfs", "--train-steps", "2", "--batch-size", "2",
                              "--backbone", "logic-gpt2-search", "--work", str(tmp_path)])
    assert (args.step_separator, args.max_new_tokens) == (" ", 192)
    assert ladder.parse_args(["--trace", "dfs", "--step-separator", "newline"]).step_separator == "\n"
    train, held, hops = ladder.ladder_problems([1, 2], 2, 40, "dfs")
    forward_train, forward_held, _ = ladder.ladder_problems([1, 2], 2, 40)
    assert [ex.question for ex in held] == [ex.question for ex in forward_held]  # the same held-out problems
    assert any(BACK_UP.search(" ".join(ex.steps)) for ex in train)  # searches back up somewhere
    run = ladder.run_one("cot", 0, train, held, binding_probe_examples(held), hops, args)
    saved = json.loads((tmp_path / "cot" / "seed0" / "model" / "anchored_reasoning.json").read_text())
    assert saved["method_options"]["step_separator"] == " "  # the run trained on space-joined steps
    assert "chains" not in run and sorted(run["search"]) == ["1", "2"]
    for h, s in run["search"].items():
        assert s["n"] == 2 and 0.0 <= s["legal_to_answer"] <= 1.0 and sum(s["first_error"].values()) == 2
    agg = ladder.aggregate([run], hops)
    assert "search_legal_to_answer" in agg["by_hops"]["1"] and agg["by_hops"]["1"]["chains"] is None
    # the search in anchors only: trained with back-ups kept, its chains replayed as walks
    walk = ladder.run_one("anchor_walk", 0, train, held, binding_probe_examples(held), hops, args)
    saved = json.loads((tmp_path / "anchor_walk" / "seed0" / "model" / "anchored_reasoning.json").read_text())
    assert saved["method"] == "anchor_chain" and saved["method_options"]["revisits"] is True
    assert sum(walk["search"]["2"]["first_error"].values()) == 2


def test_a_run_of_another_budget_is_not_merged_into_a_ladder(tmp_path, monkeypatch):
    """A ladder compares methods at equal steps: a longer run of one method aimed at it stops before
    training, naming the budget, instead of silently joining it (and rewriting its setup's step count)."""
    monkeypatch.setattr(ladder, "plot", lambda *a, **k: None)
    out = tmp_path / "ladder.json"
    ladder._write(out, {"cot": [fake_run(0, set(HOPS))]}, HOPS, args_for([0]), 0.0)
    longer = args_for([0])
    longer.train_steps, longer.lr = 40, 3e-4
    with pytest.raises(SystemExit, match="train_steps_per_run: 10 there, 40 here.*lr: 0.001 there, 0.0003 here"):
        ladder.check_mergeable(out, ["anchor_walk"], [0], longer)
    old = json.loads(out.read_text())
    del old["setup"]["max_new_tokens"]  # a JSON from before the key: its trace's default then
    out.write_text(json.dumps(old))
    ladder.check_mergeable(out, ["cot"], [1], args_for([1]))
