"""The binding probe and the per-depth breakdown: swapped problems flip the answer; figures from records."""
import json
import os
from pathlib import Path

import pytest

from anchored_reasoning.eval.probes import SWAP_SUFFIX, accuracy_by, binding_probe_examples, hops_of, probe_summary
from anchored_reasoning.generators.prosqa import generate_dataset, generate_rows, ladder_size, swapped_row
from anchored_reasoning.tasks import get_task


def test_swapped_problems_ask_the_other_entity_and_flip_the_answer():
    held = generate_dataset(30, seed=3, **ladder_size(2))
    swapped = binding_probe_examples(held)
    assert len(swapped) == len(held)  # generated problems always have a swap
    task = get_task("prosqa")
    for ex, sw in zip(held, swapped):
        assert sw.id == ex.id + SWAP_SUFFIX
        assert sw.meta["entity"] != ex.meta["entity"]
        assert sw.meta["answer_concept"] == ex.meta["neg_concept"] and sw.meta["neg_concept"] == ex.meta["answer_concept"]
        # the facts are the same, only the asked entity changes
        assert sw.question[: sw.question.rfind(" Is ")] == ex.question[: ex.question.rfind(" Is ")]
        assert sw.question.endswith(ex.question[ex.question.rfind(" a ") :].replace(ex.meta["entity"], sw.meta["entity"]))
        # the original answer is wrong for the swapped question and vice versa
        assert task.grade(f"### {sw.answer}", sw).correct and not task.grade(f"### {ex.answer}", sw).correct
        assert hops_of(sw) == 2 and hops_of(ex) == 2
        # the swapped steps are a real chain from the other entity to its answer
        assert sw.steps[0].startswith(sw.meta["entity"] + " is a ") and sw.steps[-1].endswith(sw.meta["answer_concept"] + ".")


def test_a_row_without_a_well_defined_swap_is_left_out():
    (row,) = generate_rows(1, seed=1, **ladder_size(1))
    bad = {**row, "edges": row["edges"] + [[row["root"], row["neg_target"]]]}  # asked entity now reaches the wrong option too
    assert swapped_row(bad) is None


def _rec(i, extracted, correct, swap=False):
    return {"id": f"p{i}" + (SWAP_SUFFIX if swap else ""), "sample": 0, "extracted": extracted, "correct": correct}


def test_probe_figures_from_records():
    orig = [_rec(0, "a", True), _rec(1, "a", True), _rec(2, "b", False), _rec(3, None, False)]
    swap = [_rec(0, "b", True, True), _rec(1, "a", False, True), _rec(2, "a", False, True), _rec(3, "a", True, True)]
    s = probe_summary(orig, swap, hops={"p0": 1, "p1": 1, "p2": 2, "p3": 2})
    assert s["flip_rate"]["mean"] == pytest.approx(2 / 4)  # p0 and p2 change; p3 unanswered counts as no flip
    assert s["swap_accuracy"]["mean"] == pytest.approx(2 / 4)
    assert s["both_right"]["mean"] == pytest.approx(1 / 4)
    assert s["by_hops"]["1"]["flip_rate"]["mean"] == pytest.approx(0.5)
    assert s["by_hops"]["2"]["both_right"]["mean"] == 0.0
    acc = accuracy_by(orig, {"p0": 1, "p1": 1, "p2": 2, "p3": 2})
    assert acc["1"]["mean"] == 1.0 and acc["2"]["mean"] == 0.0 and acc["1"]["n"] == 2
    with pytest.raises(ValueError, match="no problem"):
        probe_summary(orig, [])


@pytest.mark.data
def test_every_real_test_problem_has_a_swap():
    data = os.environ.get("ANCHORED_REASONING_DATA")
    if not data or not (Path(data) / "prosqa" / "test.json").is_file():
        pytest.skip("needs $ANCHORED_REASONING_DATA with prosqa/test.json")
    rows = json.loads((Path(data) / "prosqa" / "test.json").read_text())
    assert all(swapped_row(r) is not None for r in rows)


def test_chain_check_tells_a_made_up_step_from_a_wrong_branch():
    from anchored_reasoning.eval.probes import chain_check, chain_summary, prosqa_children, reaches

    held = generate_dataset(40, seed=11, **ladder_size(3))
    for ex in held:
        gold = "\n".join(ex.steps) + f"[EoR]\n### {ex.answer}"
        assert chain_check(ex, gold) == {"steps": 3, "unreal": 0, "connected": True, "ends_at_answer": True, "kind": "ok",
                                          "first_error": None, "error_step": None}
        assert chain_check(ex, f"### {ex.answer}")["kind"] == "none"
        made_up = "\n".join(ex.steps[:-1] + [f"Every {ex.steps[-1].split()[1]} is a zzzpus."])
        assert chain_check(ex, made_up)["kind"] == "lookup" and chain_check(ex, made_up)["unreal"] == 1
    # a real, connected chain that ends off the answer (a wrong branch) is a search failure
    found = wrong_branch = 0
    for ex in held:
        sym, root = ex.meta["idx_to_symbol"], ex.meta["root"]
        first = [b for a, b in ex.meta["edges"] if a == root and sym[b] != ex.steps[0].split()[-1].rstrip(".")]
        if first:
            found += 1
            res = chain_check(ex, f"{sym[root]} is a {sym[first[0]]}.[EoR]\n### {sym[root]} is a {sym[first[0]]}.")
            assert res["kind"] == "search" and res["unreal"] == 0 and res["connected"]
            # the other child may still lead to the answer (the graph is a DAG): then the walk stopped short
            below = reaches(prosqa_children(ex), sym[first[0]], sym[ex.meta["target"]])
            assert (res["first_error"], res["error_step"]) == (("stopped_short", 1) if below else ("wrong_branch", 1))
            wrong_branch += not below
        # the gold walk cut before its last step stops short; its steps out of order do not chain;
        # a step made up from the right concept is a failed lookup at that step
        assert chain_check(ex, "\n".join(ex.steps[:-1]))["first_error"] == "stopped_short"
        assert chain_check(ex, "\n".join(ex.steps[::-1]))["first_error"] == "disconnected"
        made_up = "\n".join(ex.steps[:-1] + [f"Every {ex.steps[-1].split()[1]} is a zzzpus."])
        assert (chain_check(ex, made_up)["first_error"], chain_check(ex, made_up)["error_step"]) == ("made_up", 3)
        # walking on past the answer
        answer = sym[ex.meta["target"]]
        assert chain_check(ex, "\n".join(ex.steps) + f"\nEvery {answer} is a zzzpus.")["first_error"] == "overshot"
    assert found > 10 and wrong_branch > 5
    # the summary counts kinds per depth, and among the wrong answers
    ex = held[0]
    recs = [{"id": ex.id, "sample": 0, "completion": "Every x is a y.[EoR]", "correct": False}]
    s = chain_summary(recs, held, {ex.id: 3})
    assert s["lookup"] == 1.0 and s["wrong_by_kind"]["lookup"] == 1 and s["by_hops"]["3"]["n"] == 1
    assert s["first_errors"] == {"none": 0, "disconnected": 1, "made_up": 0, "wrong_branch": 0, "stopped_short": 0,
                                 "overshot": 0}


def test_chain_check_reads_a_bare_anchor_chain():
    from anchored_reasoning.eval.probes import chain_check, derivation_steps
    from anchored_reasoning.methods import get_method

    method = get_method("anchor_chain", style="trained")
    held = generate_dataset(20, seed=5, **ladder_size(3))
    for ex in held:
        gold = method.render(ex, "prosqa").target  # "Tom a b c[EoA]\n### Tom is a c."
        assert chain_check(ex, gold) == {"steps": 3, "unreal": 0, "connected": True, "ends_at_answer": True, "kind": "ok",
                                          "first_error": None, "error_step": None}
        # as the evaluation records it: the special tokens skipped in decoding
        assert chain_check(ex, gold.replace("[EoA]", ""))["kind"] == "ok"
        nodes = gold.split("[EoA]")[0].split()
        assert chain_check(ex, " ".join(nodes[:-1] + ["zzzpus"]))["kind"] == "lookup"
    # sentences still win, and a stray sentence fragment is not read as a chain
    assert derivation_steps("Tom is a wumpus.\n### Tom is a wumpus.") == [("Tom", "wumpus")]
    assert derivation_steps("is a chorpus chorpus. ### Tom is a sterpus.") == []


def test_prontoqa_polarity_probe_negates_the_query_and_flips_the_answer():
    from anchored_reasoning.eval.probes import prontoqa_polarity_examples
    from anchored_reasoning.generators import prontoqa

    held = prontoqa.generate_dataset(20, seed=3, hops=2, mirror_distractor=True)
    flipped = prontoqa_polarity_examples(held)
    task = get_task("prontoqa")
    for a, b in zip(held, flipped):
        assert b.id == a.id + SWAP_SUFFIX and b.answer != a.answer and b.steps == a.steps
        fact_part = a.question.rpartition("True or false:")[0]
        assert b.question.startswith(fact_part) and (" not " in a.question[len(fact_part):]) != (" not " in b.question[len(fact_part):])
        assert task.grade(f"### {b.answer}", b).correct and not task.grade(f"### {a.answer}", b).correct
    assert [e.question for e in prontoqa_polarity_examples(flipped)] == [e.question for e in held]  # an involution
    # a model that compares its conclusion with the query flips every answer; a constant one flips none
    follows = [{"id": e.id, "extracted": e.answer, "correct": True} for e in held + flipped]
    constant = [{"id": e.id, "extracted": "True", "correct": e.answer == "True"} for e in held + flipped]
    assert probe_summary(follows[:20], follows[20:])["flip_rate"]["mean"] == 1.0
    assert probe_summary(constant[:20], constant[20:])["flip_rate"]["mean"] == 0.0
    with pytest.raises(ValueError, match="True or false"):
        prontoqa_polarity_examples([held[0].__class__(id="x", question="Is Tom a wumpus?", answer="True")])
