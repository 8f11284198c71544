"""Anchor extraction: the paper's own examples, the real data files, and traces without anchors."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from anchored_reasoning.anchors import (
    extract_anchors,
    frequency_anchor_mask,
    frequency_anchors,
    generic_anchors,
    gsm8k_anchors,
    logic_anchors,
    logic_nodes,
    logic_walk,
    numbers_in,
)
from anchored_reasoning.errors import ConfigError
from anchored_reasoning.types import Example

DATA = os.environ.get("ANCHORED_REASONING_DATA")
needs_data = pytest.mark.skipif(
    not DATA or not Path(DATA).is_dir(), reason="ANCHORED_REASONING_DATA is not set to the shared data folder"
)


def ex(steps, answer="0", meta=None, question="q"):
    return Example(id="x", question=question, answer=answer, steps=list(steps), meta=dict(meta or {}))


# ------------------------------------------------------------------------ the paper's examples


def test_gsm8k_paper_example_annotations_only():
    # iCoT/Coconut augmented GSM8K: steps are the calculator annotations
    assert extract_anchors(ex(["<<16-3-4=9>>", "<<9*2=18>>"], "18"), "gsm8k") == ["16", "3", "4", "9", "2", "18"]


def test_gsm8k_paper_example_prose_with_annotations_counts_each_number_once():
    steps = [
        "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.",
        "She makes 9 * 2 = $<<9*2=18>>18 every day at the farmer’s market.",
        "#### 18",
    ]
    assert extract_anchors(ex(steps, "18"), "gsm8k") == ["16", "3", "4", "9", "2", "18"]


def test_gsm8k_loader_shape_uses_meta_calculations():
    # the GSM8K loader strips annotations from steps and keeps them in meta["calculations"]
    example = ex(
        ["Janet sells 16 - 3 - 4 = 9 duck eggs a day.", "She makes 9 * 2 = $18 every day at the farmer’s market."],
        "18",
        meta={"calculations": [["16-3-4=9"], ["9*2=18"]]},
    )
    assert extract_anchors(example, "gsm8k") == ["16", "3", "4", "9", "2", "18"]
    # two [ANT] slots take the first two
    assert extract_anchors(example, "gsm8k", max_anchors=2) == ["16", "3"]


def test_gsm8k_plain_text_and_number_forms():
    assert numbers_in("16-3-4=9") == ["16", "3", "4", "9"]
    assert numbers_in("$1,200.50 and -5 apples, 12% off, 3/4 cup") == ["1200.50", "5", "12", "3", "4"]
    # a step without annotation next to annotated ones contributes its own numbers
    example = ex(["He has 7 pens.", "He buys 3 more."], "10", meta={"calculations": [[], ["7+3=10"]]})
    assert extract_anchors(example, "gsm8k") == ["7", "3", "10"]
    assert gsm8k_anchors(["There are 5 cats and 5 dogs, 10 in all."]) == ["5", "10"]


def test_prontoqa_paper_example():
    steps = [
        "Alex is a tumpus. Every tumpus is a gorpus.",
        "Alex is a gorpus. Gorpuses are wompuses.",
        "Alex is a wompus. Each wompus is a sterpus.",
        "Alex is a sterpus. Sterpuses are brimpuses.",
        "Alex is a brimpus. Every brimpus is an impus.",
        "Alex is an impus. Impuses are not bitter.",
        "Alex is not bitter.",
    ]
    anchors = extract_anchors(ex(steps, "True"), "prontoqa")
    assert [a.lower() for a in anchors] == ["alex", "tumpus", "gorpus", "wompus", "sterpus", "brimpus"]
    assert anchors[0] == "Alex"  # entities keep their capital; concepts are singular, lower case
    assert extract_anchors(ex(steps, "True"), "prontoqa", max_anchors=None)[-2:] == ["impus", "bitter"]


def test_prosqa_paper_example():
    steps = ["Tom is a terpus.", "Every terpus is a brimpus.", "Every brimpus is a lempus."]
    anchors = extract_anchors(ex(steps, "Tom is a lempus."), "prosqa")
    assert [a.lower() for a in anchors] == ["tom", "terpus", "brimpus", "lempus"]


def test_logic_plural_sentence_start_is_a_concept_not_an_entity():
    assert logic_anchors(["Stella is a zumpus. Zumpuses are gorpuses."]) == ["Stella", "zumpus", "gorpus"]


def test_a_written_search_anchors_on_the_concepts_it_visited():
    """The dfs trace's back-up steps name visited nodes: no "back" anchor, no repeat."""
    steps = ["Carol is a rompus.", "Every rompus is a jompus.", "Every jompus is a zhorpus.", "Back to jompus.",
             "Back to rompus.", "Every rompus is a tumpus."]
    assert logic_anchors(steps, None) == ["Carol", "rompus", "jompus", "zhorpus", "tumpus"]
    assert logic_anchors(["Carol is a rompus. Every rompus is a lempus. Back to rompus. Every rompus is a tumpus."]) == [
        "Carol", "rompus", "lempus", "tumpus"]


def test_the_walk_keeps_a_searchs_back_ups_and_equals_the_nodes_on_a_proof():
    steps = ["Carol is a rompus.", "Every rompus is a jompus.", "Every jompus is a zhorpus.", "Back to jompus.",
             "Back to rompus.", "Every rompus is a tumpus."]
    assert logic_walk(steps) == ["Carol", "rompus", "jompus", "zhorpus", "jompus", "rompus", "tumpus"]
    proof = ["Tom is a terpus.", "Every terpus is a brimpus.", "Every brimpus is a lempus."]
    assert logic_walk(proof) == logic_nodes(proof) == ["Tom", "terpus", "brimpus", "lempus"]
    # ProntoQA restates where the walk is before the next rule: no node twice in a row
    pronto = ["Stella is a zumpus. Zumpuses are gorpuses.", "Stella is a gorpus. Every gorpus is floral."]
    assert logic_walk(pronto) == ["Stella", "zumpus", "gorpus", "floral"]
    assert logic_walk([]) == []


# ------------------------------------------------------------------------ generic rule


def test_frequency_rule():
    tokens = ["the"] * 6 + ["cat", "the", "sat", "cat"]
    assert frequency_anchors(tokens, tau=5) == ["cat", "sat"]
    assert frequency_anchors(tokens, tau=7) == ["the", "cat", "sat"]
    assert frequency_anchors(tokens, tau=1) == ["sat"]
    assert frequency_anchor_mask([1, 2, 1, 3], tau=1) == [False, True, False, True]
    assert frequency_anchors([], tau=5) == []
    with pytest.raises(ConfigError):
        frequency_anchors(tokens, tau=0)


def test_one_frequency_rule_for_token_lists_and_tensors():
    """anchors.frequency_anchor_mask (lists of any tokens) and objectives.frequency_anchor_mask
    (id tensors, what ADLM training uses) agree, and both equal counting by hand."""
    import random
    from collections import Counter

    import torch

    from anchored_reasoning.objectives import frequency_anchor_mask as tensor_mask

    rng = random.Random(0)
    for tau in (1, 2, 5):
        rows = [[rng.randrange(12) for _ in range(40)] for _ in range(6)]
        batch = tensor_mask(torch.tensor(rows), tau)
        for row, got in zip(rows, batch.tolist()):
            counts = Counter(row)
            assert frequency_anchor_mask(row, tau) == got == [counts[t] <= tau for t in row]
            words = [f"w{t}" for t in row]  # the list rule takes any hashable token
            assert frequency_anchor_mask(words, tau) == got
            assert frequency_anchors(words, tau) == list(dict.fromkeys(w for w, keep in zip(words, got) if keep))


def test_unknown_task_uses_frequency_rule_on_the_trace():
    steps = ["x " * 6 + "apple pear", "Pear cherry"]
    assert generic_anchors(steps, tau=5) == ["apple", "pear", "cherry"]
    assert extract_anchors(ex(steps), "my_task") == ["apple", "pear", "cherry"]
    assert extract_anchors(ex(steps), "my_task", max_anchors=1) == ["apple"]


# ------------------------------------------------------------------------ no anchors, never a crash


@pytest.mark.parametrize("task", ["gsm8k", "prontoqa", "prosqa", "other", None])
def test_no_trace_gives_no_anchors(task):
    assert extract_anchors(ex([]), task) == []
    assert extract_anchors(ex(["", "   "]), task) == []


def test_trace_without_anchors_gives_empty_list():
    assert extract_anchors(ex(["So she is done."], "1"), "gsm8k") == []
    assert extract_anchors(ex(["Every is a not."], "True"), "prontoqa") == []
    assert extract_anchors(ex(["... !!!"]), "other") == []


def test_task_object_is_accepted():
    class T:
        name = "prosqa"

    assert extract_anchors(ex(["Tom is a terpus."]), T()) == ["Tom", "terpus"]


# ------------------------------------------------------------------------ real files


@needs_data
def test_prosqa_real_anchors_are_the_path_nodes():
    from anchored_reasoning.tasks import get_task

    for example in get_task("prosqa").load("test", data_dir=DATA):
        anchors = extract_anchors(example, "prosqa")
        # the path: the entity, then each step's object
        path = [example.meta["entity"]] + [s.rstrip(".").split()[-1] for s in example.steps]
        assert anchors == path[:6], example.id
        assert anchors[-1] == example.meta["answer_concept"] or len(path) > 6


@needs_data
def test_prontoqa_and_gsm8k_real_anchors():
    from anchored_reasoning.tasks import get_task

    for example in get_task("prontoqa").load("test", data_dir=DATA):
        anchors = extract_anchors(example, "prontoqa")
        assert len(anchors) == 6 and anchors[0] == example.steps[0].split()[0], example.id
    examples = get_task("gsm8k").load("test", data_dir=DATA)
    counts = [len(extract_anchors(e, "gsm8k")) for e in examples]
    assert sum(c > 0 for c in counts) == len(examples)
    first = extract_anchors(examples[0], "gsm8k")
    assert first == ["16", "3", "4", "9", "2", "18"]  # Janet's ducks, the paper's example
