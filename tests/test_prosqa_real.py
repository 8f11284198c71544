"""benchmarks/prosqa_real.py: the real test split against its surface shortcut, and held-out problems."""
from __future__ import annotations

from pathlib import Path

from anchored_reasoning.generators.prosqa import generate_dataset
from anchored_reasoning.generators.shortcuts import RULES, parse
from benchmarks import prosqa_real


def test_a_model_riding_the_best_rule_is_wrong_wherever_the_rule_is():
    test = generate_dataset(60, seed=5)  # the published construction: its shortcut is open
    first = prosqa_real.shortcut_split(test, {e.id: 1 for e in test})
    rule = RULES[first["rule"]]
    riding = {e.id: int(rule(*parse(e.question)) == e.meta["answer_concept"]) for e in test}
    got = prosqa_real.shortcut_split(test, riding)
    assert got["rule"] == first["rule"] and got["rule_accuracy"] > 0.55
    assert got["rule_right"]["accuracy"] == 1.0 and got["rule_wrong"]["accuracy"] == 0.0
    assert got["rule_right"]["n"] + got["rule_wrong"]["n"] + got.get("undecided", {}).get("n", 0) == 60
    always = prosqa_real.shortcut_split(test, {e.id: 1 for e in test})
    assert always["rule_wrong"]["accuracy"] == 1.0
    name, score, group = prosqa_real.shortcut_groups(test)  # per problem, as search_hazards reads it
    assert name == first["rule"] and round(score, 4) == first["rule_accuracy"] and set(group) == {e.id for e in test}
    assert all(group[e.id] == ("rule_right" if riding[e.id] else "rule_wrong") for e in test if group[e.id] != "undecided")


def test_heldout_problems_leave_out_the_training_questions(monkeypatch):
    monkeypatch.setattr(prosqa_real, "HELDOUT_SIZES", {"2": {"num_nodes": 12, "min_hops": 2, "max_hops": 2,
                                                             "neg_depth": "match"}})
    all_, group = prosqa_real.heldout_examples(6, set())
    assert len(all_) == 6 and set(group.values()) == {"2"}
    kept, _ = prosqa_real.heldout_examples(6, {all_[0].question, all_[3].question})
    assert [e.question for e in kept] == [e.question for i, e in enumerate(all_) if i not in (0, 3)]


def test_backward_chains_read_a_gold_chain_as_exact_and_a_broken_one_as_not():
    from anchored_reasoning.generators.traces import apply_trace
    from anchored_reasoning.methods.anchor_chain import AnchorChain

    test = generate_dataset(8, seed=6)
    gold = [AnchorChain().render(ex, "prosqa").target for ex in apply_trace(test, "prosqa", "options_backward")]
    records = [{"id": ex.id, "completion": g, "extracted": ex.meta["answer_concept"]} for ex, g in zip(test, gold)]
    got = prosqa_real.backward_chains(test, records)
    assert got.pop("reverse_steps") == got.pop("reverse_steps_real") >= 8 * 4  # >= 3 hops + 1 back from the other
    assert got == {"n": 8, "exact": 8, "steps_real": 8, "answer_walk_reaches_entity": 8,
                   "wrong_walk_reaches_other_entity": 8, "one_walk_reaches_entity": 8, "answer_follows_walks": 8}
    answer = test[0].meta["answer_concept"]
    broken = [{"id": test[0].id, "completion": f"{answer} {test[0].meta['entity']}[EoA]", "extracted": None}]
    got = prosqa_real.backward_chains(test, broken)
    assert got["exact"] == 0 and got["answer_follows_walks"] == 0 and got["n"] == 1


def test_entries_are_keyed_by_method_trace_backbone_and_seed():
    base = {"method": "cot", "seed": 2, "trace": "forward", "model": "logic-gpt2-shift"}
    assert prosqa_real.entry_key(base) == "cot_s2"
    assert prosqa_real.entry_key({**base, "trace": "options_backward"}) == "cot_options_backward_s2"
    other = {**base, "trace": "options_backward", "model": "/work/runs/backbone_back"}
    assert prosqa_real.entry_key(other) == "cot_options_backward_backbone_back_s2"
    # a learning rate other than the recipe's, and the anchor chain written as a walk, are named too
    assert prosqa_real.entry_key({**base, "lr": 1e-3}) == "cot_s2"
    assert prosqa_real.entry_key({**base, "trace": "dfs", "model": "logic-gpt2-search", "lr": 1e-4}) == \
        "cot_dfs_logic-gpt2-search_lr0.0001_s2"
    walk = {**base, "method": "anchor_chain", "trace": "dfs", "method_options": {"revisits": True}}
    assert prosqa_real.entry_key(walk) == "anchor_chain_walk_dfs_s2"
    marked = {**walk, "method_options": {"revisits": True, "mark_backups": True}}
    assert prosqa_real.entry_key(marked) == "anchor_chain_walk_back_dfs_s2"
    token = {**walk, "method_options": {"revisits": True, "mark_backups": True, "backup_marker": "token"}}
    assert prosqa_real.entry_key(token) == "anchor_chain_walk_back_token_dfs_s2"
    word = {**walk, "method_options": {**token["method_options"], "backup_marker_init": "word"}}
    assert prosqa_real.entry_key(word) == "anchor_chain_walk_back_token_word_dfs_s2"
    assert prosqa_real.entry_key({**walk, "method_options": {**word["method_options"], "backup_marker_init": "mean"}}) == \
        "anchor_chain_walk_back_token_dfs_s2"
    wide = {**walk, "method_options": {**token["method_options"], "backup_marker_width": 2}}
    assert prosqa_real.entry_key(wide) == "anchor_chain_walk_back_token_x2_dfs_s2"
    one = {**walk, "method_options": {**marked["method_options"], "backup_word": "B"}}
    assert prosqa_real.entry_key(one) == "anchor_chain_walk_back_as_B_dfs_s2"
    assert prosqa_real.entry_key({**walk, "method_options": {**one["method_options"], "backup_word": "Back"}}) == \
        "anchor_chain_walk_back_dfs_s2"
    noline = {**walk, "method_options": {**marked["method_options"], "answer_line": False}}
    assert prosqa_real.entry_key(noline) == "anchor_chain_walk_back_no_answer_line_dfs_s2"
    assert prosqa_real.entry_key({**walk, "method_options": {**marked["method_options"], "answer_line": True}}) == \
        "anchor_chain_walk_back_dfs_s2"
    cot = {**base, "method": "cot", "trace": "dfs", "method_options": {"answer_line": False}}
    assert prosqa_real.entry_key(cot) == "cot_no_answer_line_dfs_s2"
    # the paper's baselines remove the steps through a curriculum: never the key of the method's plain run
    assert prosqa_real.entry_key({**base, "method": "acot", "trace": "dfs", "curriculum": True}) == "acot_curriculum_dfs_s2"
    assert prosqa_real.entry_key({**base, "method": "acot", "trace": "dfs", "curriculum": False}) == "acot_dfs_s2"


def test_a_search_trace_is_replayed_and_a_path_trace_read_as_paths():
    from anchored_reasoning.generators.traces import prosqa_dfs

    test = generate_dataset(4, seed=6)
    for trace, paths in (("dfs", False), ("dfs_paths", True)):
        records = [{"id": ex.id, "sample": 0, "completion": " ".join(prosqa_dfs(ex, paths=paths)) + "[EoR]\n### x",
                    "extracted": ex.meta["answer_concept"], "correct": True} for ex in test]
        got = prosqa_real.chains(trace, test, records, {ex.id: 1 for ex in test})
        assert got["n"] == 4 and got["exact"] == 4 and got["answer_follows_search"] == 4, (trace, got)
    # the anchor chain with revisits writes the search's walk: replayed node by node
    from anchored_reasoning.anchors import logic_walk

    records = [{"id": ex.id, "sample": 0, "completion": " ".join(logic_walk(prosqa_dfs(ex))) + "[EoA]\n### x",
                "extracted": ex.meta["answer_concept"], "correct": True} for ex in test]
    got = prosqa_real.chains("dfs", test, records, {ex.id: 1 for ex in test}, walk=True)
    assert got["exact"] == 4 and got["first_error"]["none"] == 4


def test_runs_differing_only_in_seed_are_pooled_over_problems(tmp_path):
    """`over_seeds`: seeds 0-2 of one run kind pooled (each seed's accuracy, their mean, an interval over
    problems of the seed-averaged accuracy); a kind with one seed and other kinds stay apart. A rerun
    without --run recomputes it from the JSON and keeps the grading's machine and command."""
    import json

    def entry(seed, right):
        correct = {f"t{i}": int(i < right) for i in range(4)}
        return {"method": "cot", "seed": seed, "real_test": {"accuracy": right / 4}, "_correct": correct}

    runs = {"cot_dfs_s0": entry(0, 4), "cot_dfs_s1": entry(1, 2), "cot_dfs_s2": entry(2, 0),
            "cot_dfs_logic-gpt2-search_s0": entry(0, 3), "cot_s0": entry(0, 1)}
    pooled = prosqa_real.over_seeds(runs)
    assert list(pooled) == ["cot_dfs"]
    got = pooled["cot_dfs"]
    assert got["seeds"] == [0, 1, 2] and got["accuracy_by_seed"] == [1.0, 0.5, 0.0]
    assert got["accuracy"] == 0.5 and got["n"] == 4 and got["ci95"][0] <= 0.5 <= got["ci95"][1]
    out = tmp_path / "real.json"
    out.write_text(json.dumps({**runs, "machine": {"note": "grading"}, "command": "python benchmarks/prosqa_real.py --run r"}))
    assert prosqa_real.main(["--out", str(out)]) == 0
    again = json.loads(out.read_text())
    assert again["over_seeds"] == pooled and again["machine"] == {"note": "grading"}
    assert "cot_dfs_s0 - cot_dfs_logic-gpt2-search_s0" in again["paired"] or \
        "cot_dfs_logic-gpt2-search_s0 - cot_dfs_s0" in again["paired"]
    assert again["paired_over_seeds"] == {}  # one group of several seeds: nothing to pair it with


def test_two_seed_groups_are_paired_on_the_seeds_both_ran():
    """`paired_over_seeds`: a method of seeds 0-2 against another of seeds 1-2 is compared on seeds 1-2,
    per problem averaged over them, with McNemar on the (seed, problem) pairs."""
    def entry(seed, right):
        return {"method": "m", "seed": seed, "real_test": {"accuracy": len(right) / 4},
                "_correct": {f"t{i}": int(i in right) for i in range(4)}}

    runs = {"walk_s0": entry(0, {0}), "walk_s1": entry(1, {0, 1, 2, 3}), "walk_s2": entry(2, {0, 1, 2}),
            "cot_s1": entry(1, {0, 1}), "cot_s2": entry(2, {0}), "nocot_s0": entry(0, {0})}
    pairs = prosqa_real.paired_over_seeds(runs)
    assert list(pairs) == ["cot - walk"]  # nocot has one seed
    got = pairs["cot - walk"]
    assert got["seeds_paired"] == [1, 2]
    # per problem over seeds 1-2: cot (1, .5, 0, 0), walk (1, 1, 1, .5) -> mean difference -0.5
    assert got["diff"] == -0.5 and got["only_this_right"] == 0 and got["only_second_right"] == 4


def test_gold_tokens_cost_the_runs_own_target_so_a_cut_off_can_be_read_against_it():
    """The walk's right completion is a few anchors, the written search's a paragraph: each run's budget
    is read against its own method and trace (the target plus EOS, in the run's tokenizer)."""
    from transformers import AutoTokenizer

    from anchored_reasoning.generators.traces import apply_trace
    from anchored_reasoning.methods import get_method
    from anchored_reasoning.models.zoo import resolve_model

    run = Path(resolve_model("logic-gpt2-search"))
    test = generate_dataset(12, seed=7)
    walk = prosqa_real.gold_tokens(run, {"method": {"name": "anchor_chain", "options": {"revisits": True}}}, test, "dfs")
    cot = prosqa_real.gold_tokens(run, {"method": {"name": "cot", "options": {"step_separator": " "}}}, test, "dfs")
    assert walk["median"] <= walk["max"] < cot["median"] <= cot["max"]
    tok = AutoTokenizer.from_pretrained(str(run))
    method = get_method("anchor_chain", style="trained", revisits=True)
    lengths = [len(tok(method.render(ex, "prosqa").target)["input_ids"]) + 1 for ex in apply_trace(test, "prosqa", "dfs")]
    assert walk["max"] == max(lengths) and walk["median"] == sorted(lengths)[6]
