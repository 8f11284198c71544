"""The logic-text document format the shipped logic backbones were pretrained on (``train.logic_text``), its
reader, and the shipped ``logic-gpt2`` itself. The pretraining is archived in research/backbones/ (its tests:
research/tests/test_backbone.py)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from anchored_reasoning.train.data import logic_text


def _sentences(text: str) -> list[str]:
    return [s.strip() + "." for s in text.split(".") if s.strip()]


def test_prosqa_document_is_question_free_and_its_derivation_follows_the_facts():
    from anchored_reasoning.generators.prosqa import generate_dataset

    for ex in generate_dataset(20, seed=3, split="t"):
        doc = logic_text.document(ex, "prosqa")
        facts, derivation = doc.split("\n")
        assert "?" not in doc and "###" not in doc and "[" not in doc
        fact_set = set(_sentences(facts))
        steps = _sentences(derivation)
        assert steps[-1] == ex.answer
        # every rule the derivation uses is stated in the facts, and the chain is connected
        for s in steps[:-1]:
            assert s in fact_set, s
        chain = [re.match(r"(?:Every )?(\w+) is an? (\w+)\.", s).groups() for s in steps]
        for (a, b), (c, _) in zip(chain[1:-1], chain[2:-1]):
            assert b == c



def test_prontoqa_document_drops_the_query():
    from anchored_reasoning.generators.prontoqa import generate_dataset

    ex = generate_dataset(1, seed=0, split="t")[0]
    doc = logic_text.document(ex, "prontoqa")
    facts, derivation = doc.split("\n")
    assert "True or false" not in doc
    assert facts and derivation.startswith(ex.steps[0])
    assert ex.answer not in ("True", "False") or ex.answer not in doc.split()



@pytest.fixture(scope="module")
def shipped():
    from anchored_reasoning.models.zoo import LOGIC_BACKBONE_DIR, resolve_model

    if not (LOGIC_BACKBONE_DIR / "model.safetensors").is_file():
        pytest.fail(f"the shipped backbone is missing from {LOGIC_BACKBONE_DIR}")
    return resolve_model("logic-gpt2")



def test_shipped_backbone_loads_by_alias_and_knows_the_task_words(shipped):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anchored_reasoning.generators import prontoqa, prosqa
    from anchored_reasoning.methods.anchored import SPECIAL_TOKENS

    tok = AutoTokenizer.from_pretrained(shipped)
    model = AutoModelForCausalLM.from_pretrained(shipped)
    assert model.config.n_layer == 4  # the shape research/backbones/backbone.py gives it
    assert model.get_input_embeddings().weight.shape[0] == len(tok)
    for t in SPECIAL_TOKENS:
        assert tok.convert_tokens_to_ids(t) != tok.unk_token_id
    words = prosqa.CONCEPT_NAMES + prosqa.ENTITY_NAMES + prontoqa.CONCEPT_NAMES
    for w in words:
        assert len(tok(" " + w)["input_ids"]) == 1, w
    info = json.loads((Path(shipped) / "backbone.json").read_text())
    assert info["steps"] > 0 and info["held_out_derivation_loss"]["prosqa"] < 1.0



def test_shipped_backbone_follows_a_rule_it_has_never_seen(shipped):
    """Greedy continuation of a fresh problem's facts plus the first derivation step uses a stated rule."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anchored_reasoning.generators.prosqa import generate_dataset

    tok = AutoTokenizer.from_pretrained(shipped)
    model = AutoModelForCausalLM.from_pretrained(shipped).eval()
    good = 0
    problems = generate_dataset(40, seed=4242, split="t", num_nodes=7, min_hops=2, max_hops=2)
    for ex in problems:
        facts = logic_text.document(ex, "prosqa").split("\n")[0]
        prompt = f"{facts}\n{ex.steps[0]}"
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
        nxt = _sentences(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
        node = re.match(r"\w+ is an? (\w+)\.", ex.steps[0]).group(1)
        if nxt and nxt[0] in set(_sentences(facts)) and nxt[0].startswith(f"Every {node} is"):
            good += 1
    # a format-only model (the first pretraining phase) scores 0/40 here; the shipped backbone 26/40
    assert good >= 16, f"{good}/40 continuations applied a stated rule"



def test_document_answer_reads_the_line_after_the_marker_only():
    assert logic_text.document_answer("Tom is a wumpus. ### Tom is a lempus.\nTom is a gorpus.") == "lempus"
    assert logic_text.document_answer("Tom is a wumpus. Tom is a lempus.") == ""  # no answer written
    assert logic_text.document_answer("Tom is a wumpus. ###") == ""

