"""generators/traces.py: ProntoQA proofs read backward, the claim that makes them look-up only, and the
recipe hook (``data.train.trace``)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.generators.prontoqa import generate_dataset
from anchored_reasoning.generators.traces import apply_trace, prontoqa_backward, prontoqa_rules
from anchored_reasoning.types import Example

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

FORWARD = [
    "Stella is a zumpus. Zumpuses are gorpuses.",
    "Stella is a gorpus. Every gorpus is a rompus.",
    "Stella is a rompus. Rompuses are not floral.",
    "Stella is not floral.",
]


def test_backward_reverses_the_rules_then_names_the_entity_and_keeps_the_conclusion():
    assert prontoqa_backward(FORWARD) == [
        "Rompuses are not floral.",
        "Every gorpus is a rompus.",
        "Zumpuses are gorpuses.",
        "Stella is a zumpus.",
        "Stella is not floral.",
    ]


@pytest.mark.parametrize("steps", [["Stella is floral."], ["Stella is a zumpus.", "Stella is floral."],
                                   ["Stella is a zumpus. Zumpuses are gorpuses. Extra.", "Stella is a gorpus."]])
def test_a_proof_not_in_prontoqa_form_is_a_data_error(steps):
    with pytest.raises(DataError):
        prontoqa_backward(steps)


def test_apply_trace_checks_the_order_and_the_task_and_names_the_bad_example():
    ex = Example(id="p-1", question="q", answer="False", steps=FORWARD)
    assert apply_trace([ex], "prontoqa", None) == [ex]
    assert apply_trace([ex], "prontoqa", "forward") == [ex]
    out = apply_trace([ex], "prontoqa", "backward")[0]
    assert out.steps[0] == "Rompuses are not floral." and out.meta["trace"] == "backward"
    assert (out.question, out.answer, ex.steps) == ("q", "False", FORWARD)  # the input is not modified
    with pytest.raises(ConfigError, match="sideways"):
        apply_trace([ex], "prontoqa", "sideways")
    with pytest.raises(ConfigError, match="prosqa"):
        apply_trace([ex], "prosqa", "backward")
    bad = Example(id="p-2", question="q", answer="True", steps=["Stella is floral."])
    with pytest.raises(DataError, match="p-2"):
        apply_trace([ex, bad], "prontoqa", "backward")


def test_rules_parse_entities_concepts_and_negations():
    q = "Every gorpus is a rompus. Zumpuses are not floral. Each yumpus is an impus. Stella is a zumpus. True or false: Stella is floral."
    assert prontoqa_rules(q) == [("gorpus", False, "rompus"), ("zumpus", True, "floral"), ("yumpus", False, "impus"),
                                 ("Stella", False, "zumpus")]


def _assert_lookup_only(examples):
    """After the first backward step, each step is the one rule of the question ending in the previous subject."""
    for ex in examples:
        rules = prontoqa_rules(ex.question)
        back = apply_trace([ex], "prontoqa", "backward")[0].steps
        for sentence in back[:-1]:
            assert sentence in ex.question, (ex.id, sentence)
        parsed = [prontoqa_rules(s)[0] for s in back[:-1]]
        goal = parsed[0][2]
        assert sum(o == goal for _, _, o in rules) == 2, ex.id  # the chain's rule and the distractor's
        for prev, cur in zip(parsed, parsed[1:]):
            assert cur[2] == prev[0], ex.id
            assert [r for r in rules if r[2] == prev[0]] == [cur], ex.id


def test_generated_prontoqa_backward_steps_need_no_look_ahead():
    _assert_lookup_only(generate_dataset(200, seed=3))


@pytest.mark.data
@pytest.mark.skipif(not os.environ.get("ANCHORED_REASONING_DATA"), reason="ANCHORED_REASONING_DATA is not set")
def test_real_prontoqa_test_backward_steps_need_no_look_ahead():
    from anchored_reasoning.tasks import get_task

    _assert_lookup_only(get_task("prontoqa").load("test"))


def test_trace_order_benchmark_counts_the_choices():
    import trace_order

    rows = [trace_order.prontoqa_choices(ex) for ex in generate_dataset(50, seed=1)]
    s = trace_order.summarize(rows, skip_first_backward=True)
    assert s["n"] == 50 and s["proofs_backward_without_choice_after_first"] == 50
    assert s["proofs_forward_without_choice"] == 0  # every forward step has a side branch
    assert s["wrong_first_rule_backward_depths"] == {0: 50}


def test_prosqa_choices_follow_the_gold_proof_and_refuse_a_broken_one():
    """Degrees are counted along the example's own steps (not some other shortest path): a graph with two
    shortest paths gives the counts of the one the proof takes."""
    import trace_order

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


def test_recipes_apply_the_trace_and_refuse_a_bad_one_before_data_work(monkeypatch):
    from anchored_reasoning.train import data_sources as ar

    spec = {"generator": "prontoqa", "n": 4, "seed": 0, "trace": "backward"}
    got = ar.load_split(spec, "prontoqa", 0)
    plain = ar.load_split(dict(spec, trace=None), "prontoqa", 0)
    assert [g.steps for g in got] == [prontoqa_backward(p.steps) for p in plain]

    def boom(*a, **k):
        raise AssertionError("data generated before the trace was checked")

    monkeypatch.setattr(ar, "generate_examples", boom)
    with pytest.raises(ConfigError, match="backward"):
        ar.load_split({"generator": "prosqa", "n": 4, "trace": "backward"}, "prosqa", 0)
    with pytest.raises(ConfigError, match="upward"):
        ar.load_split(dict(spec, trace="upward"), "prontoqa", 0)


def test_a_cot_target_follows_the_backward_proof():
    from anchored_reasoning.methods import get_method

    ex = apply_trace([Example(id="p", question="q", answer="False", steps=FORWARD)], "prontoqa", "backward")[0]
    target = get_method("cot", style="trained").render(ex, "prontoqa").target
    assert target.index("Rompuses are not floral.") < target.index("Zumpuses are gorpuses.") < target.index("Stella is a zumpus.")
    assert target.rstrip().endswith("False")


def test_chain_report_reads_written_proofs_against_the_gold_order(tmp_path):
    import json

    import trace_order

    ex = generate_dataset(3, seed=4)
    gold = [s for step in apply_trace([ex[0]], "prontoqa", "backward")[0].steps for s in step.split(". ") if s]
    gold = [s if s.endswith(".") else s + "." for s in gold]
    records = [
        {"id": ex[0].id, "completion": "\n".join(gold) + "[EoR]\n### " + ex[0].answer, "correct": True},
        {"id": ex[1].id, "completion": "Every notaconcept is floral.[EoR]\n### True", "correct": False},
        {"id": ex[2].id, "completion": "[EoR]\n### False", "correct": ex[2].answer == "False"},
    ]
    r = trace_order.chain_report(ex, records, "backward")
    assert r["n"] == 3 and r["exact_proofs"] == 1 and r["conclusion_is_gold"] == 1
    assert r["first_error"] == {"none": 1, "step_made_up": 1, "stopped_short": 1}
    assert r["gold_sentence_at_position"][0] == 1
    assert r["by_rule"]["exact_proofs"] == 1

    # the same proof with one rule in other words: wrong as text, right as a rule
    i = next(k for k, s in enumerate(gold) if s.startswith(("Every ", "Each ")))
    q, _, rest = gold[i].partition(" ")
    reworded = gold[:i] + [("Each " if q == "Every" else "Every ") + rest] + gold[i + 1:]
    records[0] = {"id": ex[0].id, "completion": "\n".join(reworded) + "[EoR]\n### " + ex[0].answer, "correct": True}
    r = trace_order.chain_report(ex, records, "backward")
    assert r["exact_proofs"] == 0 and r["by_rule"]["exact_proofs"] == 1
    assert r["first_error"]["step_in_question"] == 1 and r["by_rule"]["first_error"]["none"] == 1

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"prontoqa": {"cot": {"per_problem": {"x": 1.0, "y": 1.0, "z": 0.0}}}}))
    b.write_text(json.dumps({"prontoqa": {"cot": {"per_problem": {"x": 1.0, "y": 0.0, "z": 0.0, "w": 1.0}}}}))
    p = trace_order.paired_cot(str(a), str(b))
    assert p["n"] == 3 and p["only_a_right"] == 1 and p["only_b_right"] == 0 and p["diff"] == pytest.approx(1 / 3, abs=1e-3)


def test_anchor_chain_report_reads_written_chains_against_the_gold_chain():
    """The bare chain ``Sally rompus impus not sour[EoA]`` is read anchor by anchor against the target the
    method trains on; the first wrong anchor is a real word of the question or a made-up one."""
    import trace_order
    from anchored_reasoning.methods.anchor_chain import AnchorChain

    ex = generate_dataset(4, seed=4, hops=2, mirror_distractor=True)
    gold = [AnchorChain().render(e, "prontoqa").target for e in ex]
    chain0 = gold[0].split("[EoA]")[0].split()
    other = next(w for w in ex[1].question.replace(".", " ").split() if w.endswith("pus") and w not in gold[1])
    records = [
        {"id": ex[0].id, "completion": gold[0], "correct": True},
        {"id": ex[1].id, "completion": " ".join(gold[1].split("[EoA]")[0].split()[:1] + [other]) + "[EoA]\nx\n### True",
         "correct": False},
        {"id": ex[2].id, "completion": gold[2].split()[0] + " blorpus[EoA]\n### False", "correct": False},
        {"id": ex[3].id, "completion": gold[3].split("[EoA]")[0].split()[0] + "[EoA]\n### True", "correct": False},
    ]
    r = trace_order.anchor_chain_report(ex, records)
    assert r["n"] == 4 and r["exact_chains"] == 1 and r["conclusion_is_gold"] == 1
    assert r["answer_right_when_conclusion_is_gold"] == 1
    assert r["first_error"] == {"none": 1, "in_question": 1, "made_up": 1, "stopped_short": 1}
    assert r["gold_anchor_at_position"][: len(chain0)] == [4, 1] + [1] * (len(chain0) - 2)


def _walks_ok(ex):
    """Each walk of an options_backward trace: its facts are the question's, chained backward from the
    option to an entity; returns {option: entity reached}."""
    import re

    facts = set(re.findall(r"[^.?]+\.", ex.question.split("?")[0].rsplit(".", 1)[0] + "."))
    facts = {f.strip() for f in facts}
    reached, option, here = {}, None, None
    for step in ex.steps:
        head, _, fact = step.rpartition(": ")
        if head:
            option = here = head
        assert fact in facts, fact
        m = re.fullmatch(r"(?:Every )?(\w+) is a (\w+)\.", fact)
        assert m and m.group(2) == here, (fact, here)
        here = reached[option] = m.group(1)
    return reached


def test_options_backward_walks_back_from_each_option_to_its_entity():
    from anchored_reasoning.generators.prosqa import generate_dataset as prosqa_dataset

    examples = prosqa_dataset(40, seed=3)
    for before, ex in zip(examples, apply_trace(examples, "prosqa", "options_backward")):
        reached = _walks_ok(ex)
        answer, wrong = ex.meta["answer_concept"], ex.meta["neg_concept"]
        assert set(reached) == {answer, wrong}
        assert reached[answer] == ex.meta["entity"] and reached[wrong] != ex.meta["entity"]
        options = ex.question.rsplit("?", 1)[0].split(" a ")[-1].split(" or ")
        assert [s.split(":")[0] for s in ex.steps if ": " in s] == options  # the question's order
        assert len(ex.steps) >= len(before.steps) + 1  # the gold walk reversed, and at least one step back from the other
        assert (ex.question, ex.answer, ex.meta["trace"]) == (before.question, before.answer, "options_backward")


def test_options_backward_on_the_real_test_and_its_anchor_chain(tmp_path):
    from anchored_reasoning.methods.anchor_chain import AnchorChain
    from anchored_reasoning.tasks import get_task

    data = os.environ.get("ANCHORED_REASONING_DATA")
    test = get_task("prosqa").load("test", data_dir=data)
    traced = apply_trace(test, "prosqa", "options_backward")
    assert all(_walks_ok(ex)[ex.meta["answer_concept"]] == ex.meta["entity"] for ex in traced)
    ex = traced[0]  # "Is Sally a hilpus or sterpus?": sterpus <- rempus <- scrompus <- Sally
    assert ex.steps[-3:] == ["sterpus: Every rempus is a sterpus.", "Every scrompus is a rempus.", "Sally is a scrompus."]
    target = AnchorChain().render(ex, "prosqa").target
    assert target.endswith("sterpus rempus scrompus Sally[EoA]\n### Sally is a sterpus.")
    with pytest.raises(ConfigError, match="prosqa"):
        apply_trace(test[:1], "prontoqa", "options_backward")
    with pytest.raises(DataError, match="graph in meta"):
        apply_trace([Example(id="x", question="q", answer="a", steps=["A is a b."])], "prosqa", "options_backward")


def _replay_dfs(ex):
    """Replays a ``dfs`` trace against the question's facts alone: each fact goes down from the current
    concept to its first unvisited child in the question's order, each ``Back to P.`` leaves a concept with
    no unvisited child for its parent P; returns the stacks after every step."""
    import re

    facts = [f.strip() for f in re.findall(r"[^.?]+\.", ex.question.split("?")[0].rsplit(".", 1)[0] + ".")]
    children: dict[str, list[str]] = {}
    for f in facts:
        m = re.fullmatch(r"(?:Every )?(\w+) is a (\w+)\.", f)
        children.setdefault(m.group(1), []).append(m.group(2))
    stack, seen, stacks = [ex.meta["entity"]], {ex.meta["entity"]}, []
    for step in ex.steps:
        unvisited = [c for c in children.get(stack[-1], []) if c not in seen]
        back = re.fullmatch(r"Back to (\w+)\.", step)
        if back:
            assert not unvisited, (step, stack, unvisited)
            stack.pop()
            assert stack[-1] == back.group(1), (step, stack)
        else:
            m = re.fullmatch(r"(?:Every )?(\w+) is a (\w+)\.", step)
            assert step in facts and m.group(1) == stack[-1], (step, stack)
            assert m.group(2) == unvisited[0], (step, unvisited)
            stack.append(m.group(2))
            seen.add(m.group(2))
        stacks.append(list(stack))
    return stacks


def test_dfs_searches_forward_in_the_question_order_and_stops_at_the_answer():
    from anchored_reasoning.generators.prosqa import generate_dataset as prosqa_dataset

    examples = prosqa_dataset(40, seed=3)
    dfs, paths = apply_trace(examples, "prosqa", "dfs"), apply_trace(examples, "prosqa", "dfs_paths")
    backed_up = 0
    for before, ex, px in zip(examples, dfs, paths):
        stacks = _replay_dfs(ex)
        assert stacks[-1][-1] == ex.meta["answer_concept"]
        assert ex.meta["neg_concept"] not in {n for s in stacks for n in s}
        assert px.steps == [" ".join(s) + "." for s in stacks]  # the same search, the stack written out
        backed_up += any(s.startswith("Back to ") for s in ex.steps)
        assert (ex.question, ex.answer, ex.meta["trace"], px.meta["trace"]) == (before.question, before.answer, "dfs", "dfs_paths")
    assert backed_up >= 10  # the search is not just the gold walk


def test_dfs_on_the_real_test_and_a_search_that_meets_the_wrong_option():
    import dataclasses

    from anchored_reasoning.tasks import get_task

    test = get_task("prosqa").load("test", data_dir=os.environ.get("ANCHORED_REASONING_DATA"))
    traced = apply_trace(test, "prosqa", "dfs")
    assert all(_replay_dfs(ex)[-1][-1] == ex.meta["answer_concept"] for ex in traced)
    assert traced[0].steps[:4] == ["Sally is a boompus.", "Every boompus is a zhorpus.", "Every zhorpus is a tumpus.",
                                   "Back to zhorpus."]
    assert sum(len(ex.steps) for ex in traced) / len(traced) == pytest.approx(11.34, abs=0.01)
    ex = test[0]
    first = ex.meta["idx_to_symbol"].index("boompus")  # Sally's first child in the question's order
    wrong = dataclasses.replace(ex, meta={**ex.meta, "neg_target": first})
    with pytest.raises(DataError, match="wrong option boompus"):
        apply_trace([wrong], "prosqa", "dfs")
    with pytest.raises(ConfigError, match="prosqa"):
        apply_trace(test[:1], "prontoqa", "dfs_paths")
