"""generators/traces.py: ProntoQA proofs read backward, the claim that makes them look-up only, and the
recipe hook (``data.train.trace``)."""
from __future__ import annotations

import os

import pytest

from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.generators.prontoqa import generate_dataset
from anchored_reasoning.generators.traces import apply_trace, prontoqa_backward, prontoqa_rules
from anchored_reasoning.types import Example

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


def test_recipes_apply_the_trace_and_refuse_a_bad_one_before_data_work(monkeypatch):
    from anchored_reasoning.train.data import data_sources as ar

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
