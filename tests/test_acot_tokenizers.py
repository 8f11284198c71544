"""ACoT anchor labels on real tokenizers: SmolLM2 spells numbers digit by digit, GPT-2-style BPEs
(logic-gpt2) spell every anchor as one token. Labels must keep whole anchors on both."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from anchored_reasoning.anchors import register_anchor_extractor
from anchored_reasoning.errors import DataError
from anchored_reasoning.methods import get_method
from anchored_reasoning.methods.anchored import ANT, add_special_tokens
from anchored_reasoning.resources import builtin_dir
from anchored_reasoning.train.data.collate import (
    IGNORE,
    AnchoredCollator,
    anchor_label_ids,
    check_anchor_labels,
    examples_dataset,
)
from anchored_reasoning.types import Example

DATA = os.environ.get("ANCHORED_REASONING_DATA")
needs_data = pytest.mark.skipif(
    not DATA or not Path(DATA).is_dir(), reason="ANCHORED_REASONING_DATA is not set to the shared data folder"
)


def tokenizer_of(alias: str):
    from transformers import AutoTokenizer

    from anchored_reasoning.models.zoo import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model(alias))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    add_special_tokens(tok)
    return tok


@pytest.fixture(scope="module")
def smollm2():
    return tokenizer_of("smollm2-135m")


@pytest.fixture(scope="module")
def logic_gpt2():
    return tokenizer_of("logic-gpt2")


def labelled_anchors(batch, rows, tokens_per_anchor, tok):
    """(anchor, label ids) for every anchor labelled in the batch, read back from the tensors."""
    import json

    ant = tok.convert_tokens_to_ids(ANT)
    out = []
    for r, row in enumerate(rows):
        slots = (batch["input_ids"][r] == ant).nonzero().flatten().tolist()
        anchors = row["_anchors"]
        for g, anchor in enumerate(anchors):
            group = slots[g * tokens_per_anchor : (g + 1) * tokens_per_anchor]
            labels = [int(batch["anchor_labels"][r, p]) for p in group if int(batch["anchor_labels"][r, p]) != IGNORE]
            out.append((anchor, tuple(labels)))
        assert json.loads(row["example"])["id"]
    return out


@needs_data
def test_gsm8k_labels_on_smollm2_keep_every_number_whole(smollm2):
    """The shipped recipe (2 anchors x 7 slots) on 300 GSM8K training problems: no label is
    whitespace, each anchor's labels spell it, and distinct anchors get distinct label sequences."""
    from anchored_reasoning.tasks import get_task

    recipe = yaml.safe_load((builtin_dir("train") / "gsm8k_smollm2_acot.yaml").read_text())
    options = recipe["method"]["options"]
    method = get_method("acot", style="trained", **options)
    examples = get_task("gsm8k").load("train", limit=300)
    collator = AnchoredCollator(smollm2, method, task="gsm8k")
    rows = [dict(r) for r in examples_dataset(examples)]
    for row, ex in zip(rows, examples):
        row["_anchors"] = method.render(ex, "gsm8k").anchors
    pairs = []
    for start in range(0, len(rows), 50):
        chunk = rows[start : start + 50]
        pairs += labelled_anchors(collator(chunk), chunk, options["tokens_per_anchor"], smollm2)
    assert len(pairs) >= 550  # 2 anchors on nearly every problem
    blank = [(a, ids) for a, ids in pairs for t in ids if not smollm2.decode([t]).strip()]
    assert blank == []
    assert all(smollm2.decode(list(ids)) == a for a, ids in pairs)
    by_labels = {}
    for anchor, ids in pairs:
        by_labels.setdefault(ids, set()).add(anchor)
    assert all(len(group) == 1 for group in by_labels.values())
    assert len(by_labels) == len({a for a, _ in pairs}) > 50
    stats = check_anchor_labels(smollm2, method, examples, "gsm8k")
    assert stats["anchors_truncated"] == 0 and stats["anchors_sharing_labels"] == 0
    # the rule this replaced (first token of " " + anchor) gives every number the same label: the space
    assert {smollm2(" " + a, add_special_tokens=False)["input_ids"][0] for a, _ in pairs} == {
        smollm2(" ", add_special_tokens=False)["input_ids"][0]
    }


def test_logic_gpt2_labels_are_one_token_per_anchor_as_before(logic_gpt2):
    """On a GPT-2-style BPE where every anchor is one token, the default (tokens_per_anchor=1)
    prompts and labels equal the earlier rule: slot i = the token of " " + anchor i."""
    from anchored_reasoning.generators import generate_dataset

    examples = generate_dataset("prosqa", 40, seed=3, num_nodes=12, min_hops=2)
    method = get_method("acot", style="trained", k=6, remove_steps_per_stage=1).with_stage(4)
    collator = AnchoredCollator(logic_gpt2, method, task="prosqa")
    rows = [dict(r) for r in examples_dataset(examples)]
    for row, ex in zip(rows, examples):
        row["_anchors"] = method.render(ex, "prosqa").anchors
        assert "[BoA]" + ANT * 4 + "[EoA][BoR]" in method.render(ex, "prosqa").prompt
    pairs = labelled_anchors(collator(rows), rows, 1, logic_gpt2)
    assert len(pairs) == sum(len(r["_anchors"]) for r in rows) > 3 * len(examples)
    old_rule = {a: (logic_gpt2(" " + a, add_special_tokens=False)["input_ids"][0],) for a, _ in pairs}
    assert all(ids == old_rule[a] for a, ids in pairs)
    assert all(len(anchor_label_ids(logic_gpt2, a)) == 1 for a, _ in pairs)
    assert collator.stats["truncated_anchors"] == 0


def test_a_longer_anchor_fills_its_slots_and_is_cut_at_a_token_boundary(smollm2):
    method = get_method("acot", style="trained", k=2, tokens_per_anchor=3)
    ex = Example(id="g1", question="q", answer="1", steps=["<<12345+6=12351>>"], meta={"task": "gsm8k"})
    collator = AnchoredCollator(smollm2, method, task="gsm8k")
    batch = collator(list(examples_dataset([ex])))
    ant = smollm2.convert_tokens_to_ids(ANT)
    slots = (batch["input_ids"][0] == ant).nonzero().flatten().tolist()
    labels = [int(batch["anchor_labels"][0, p]) for p in slots]
    assert len(slots) == 6
    assert smollm2.decode(labels[:3]) == "123"  # 12345 keeps its first three digits
    assert smollm2.decode(labels[3:4]) == "6" and labels[4:] == [IGNORE, IGNORE]
    assert collator.stats["truncated_anchors"] == 1
    assert batch["anchor_slots"].tolist() == [2] and batch["anchor_targets"].tolist() == [2]


def test_an_anchor_that_tokenizes_to_nothing_is_named_before_training(smollm2):
    register_anchor_extractor("blank_anchor_task", lambda ex, m: ["7", "  "], 6)
    examples = [Example(id="ok-1", question="q", answer="7", steps=["7"]),
                Example(id="bad-2", question="q", answer="7", steps=["7 and nothing"])]
    method = get_method("acot", style="trained", k=2)
    with pytest.raises(DataError, match=r"example ok-1: anchor '  ' tokenizes to nothing"):
        check_anchor_labels(smollm2, method, examples, "blank_anchor_task")
    collator = AnchoredCollator(smollm2, method, task="blank_anchor_task")
    with pytest.raises(DataError, match="anchor '  '"):
        collator(list(examples_dataset(examples[1:])))
