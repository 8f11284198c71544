"""research/backbones/diffusion_backbone.py (the pretraining that built logic-mdlm / logic-adlm): a tiny
pretraining run end to end, bad arguments refused, the time budget, and the derivation check's claims."""
from __future__ import annotations

import json

import pytest
from transformers import AutoModelForMaskedLM, AutoTokenizer

import anchored_reasoning.models as models
from research.backbones import diffusion_backbone as db


def test_bad_arch_and_init_are_refused(tmp_path):
    with pytest.raises(ValueError, match="arch must be one of"):
        db.pretrain(tmp_path, arch="gpt")
    with pytest.raises(ValueError, match="init must be one of"):
        db.pretrain(tmp_path, init="hub")



def test_tiny_pretraining_run_saves_a_loadable_backbone(tmp_path):
    out = tmp_path / "logic-adlm"
    s = db.pretrain(out, arch="adlm", max_steps=3, n_docs=64, eval_docs=8, batch_size=4, warmup=1, threads=1,
                    config={"hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64, "num_attention_heads": 2})
    assert s["steps"] == 3 and s["anchored"] and s["corpus"]["documents"] > 0
    assert set(s["held_out_derivation_nelbo"]["after"]) == {"prosqa", "prontoqa"}
    saved = json.loads((out / "backbone.json").read_text())
    assert saved["arch"] == "adlm" and saved["config"]["hidden_size"] == 32
    assert saved["step_separator"] == " "  # what joined the documents' steps: read by train.separator
    model = AutoModelForMaskedLM.from_pretrained(out)
    assert isinstance(model, models.ADLM)
    assert AutoTokenizer.from_pretrained(out).mask_token_id == model.config.mask_token_id
    assert not (out / "_trainer").exists()



def test_the_time_budget_stops_pretraining(tmp_path):
    """``minutes`` ends the run (it was passed to the trainer config, which has no limit of its own, and
    ignored: a 22-minute run went on towards its step cap)."""
    s = db.pretrain(tmp_path / "m", arch="mdlm", max_steps=500, minutes=1e-6, n_docs=64, eval_docs=8, batch_size=4, warmup=1,
                    threads=1, check_n=0, config={"hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64,
                                                  "num_attention_heads": 2})
    assert 1 <= s["steps"] <= 2



def test_claims_read_a_derivation_against_the_graph():
    from anchored_reasoning import generators
    from anchored_reasoning.train.data.logic_text import document

    ex = generators.generate_dataset("prosqa", 1, seed=777, split="derivation-check", **db.CHECK_SIZE)[0]
    gold = document(ex, "prosqa").split("\n", 1)[1]  # the steps, then the closing conclusion
    steps, facts, true = db._claims(ex, gold)
    assert steps == len(ex.steps) + 1 and facts == len(ex.steps) and true == steps
    entity = ex.steps[0].split()[0]
    made_up = f"{entity} is a notaconcept. Every notaconcept is a {ex.answer.split()[-1].rstrip('.')}."
    assert db._claims(ex, made_up) == (2, 0, 0)
    concept = ex.steps[0].rstrip(".").split()[-1]
    assert db._claims(ex, f"Every {concept} is a {concept}.") == (1, 0, 0)  # a concept is not its own claim



def test_init_from_needs_the_ar_init(tmp_path):
    with pytest.raises(ValueError, match="needs init='ar'"):
        db.pretrain(tmp_path, init="scratch", init_from="logic-gpt2-shift")
    with pytest.raises(ValueError, match="corpus must be"):
        db.pretrain(tmp_path, corpus="wiki")

