"""The logic diffusion backbones: AR-to-diffusion weight copy, a tiny pretraining run end to end, bad
arguments, and the shipped logic-mdlm / logic-adlm (loadable by alias; pretraining lowered their
held-out derivation NELBO)."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

import anchored_reasoning.models as models
from anchored_reasoning.models import zoo
from anchored_reasoning.train import diffusion_backbone as db


def _small(cls, cfg_cls, tok):
    return cls(cfg_cls.from_preset(db.PRESET, vocab_size=len(tok), mask_token_id=tok.mask_token_id,
                                   pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))


@pytest.fixture(scope="module")
def gpt():
    return AutoModelForCausalLM.from_pretrained(zoo.LOGIC_BACKBONE_DIR), AutoTokenizer.from_pretrained(zoo.LOGIC_BACKBONE_DIR)


def test_ar_weights_land_in_mdlm(gpt):
    ar, tok = gpt
    m = _small(models.MDLM, models.MDLMConfig, tok)
    n = db.copy_ar_weights(m, ar)
    assert n == 2 + 4 * 10 + 2  # embeddings, head; 10 tensors per block; final norm
    g = ar.transformer
    assert torch.equal(m.embed_tokens.weight, g.wte.weight)
    assert torch.equal(m.encoder.layers[2].qkv.weight, g.h[2].attn.c_attn.weight.T)
    assert torch.equal(m.encoder.layers[3].mlp_out.bias, g.h[3].mlp.c_proj.bias)
    assert torch.equal(m.lm_head.weight, ar.lm_head.weight) and not m.lm_head.bias.any()
    # the copied network computes GPT-2's blocks (bidirectional, rotary): it runs and its predictions differ from a fresh one
    x = torch.tensor([tok("Tom is a wumpus. Every wumpus is a rempus.")["input_ids"]])
    x[0, 3:8] = tok.mask_token_id
    fresh = _small(models.MDLM, models.MDLMConfig, tok)
    got, new = m(input_ids=x).logits[0, 3:8], fresh(input_ids=x).logits[0, 3:8]
    assert torch.isfinite(got).all() and not torch.allclose(got, new)


def test_ar_weights_go_to_adlm_anchor_network_only(gpt):
    ar, tok = gpt
    torch.manual_seed(0)
    a = _small(models.ADLM, models.ADLMConfig, tok)
    before = a.denoiser.layers[0].qkv.weight.clone()
    db.copy_ar_weights(a, ar)
    assert torch.equal(a.anchor.layers[0].qkv.weight, ar.transformer.h[0].attn.c_attn.weight.T)
    assert torch.equal(a.anchor_head.weight, ar.lm_head.weight)
    assert torch.equal(a.denoiser.layers[0].qkv.weight, before)


def test_ar_copy_refuses_other_shapes(gpt):
    ar, tok = gpt
    m = models.MDLM(models.MDLMConfig.from_preset("tiny", vocab_size=len(tok), mask_token_id=tok.mask_token_id))
    with pytest.raises(ValueError, match="AR init needs"):
        db.copy_ar_weights(m, ar)


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


@pytest.mark.parametrize("alias,cls", [("logic-mdlm", models.MDLM), ("logic-adlm", models.ADLM)])
def test_shipped_logic_diffusion_backbones(alias, cls):
    folder = zoo.LOGIC_DIFFUSION_DIRS[alias]
    if not (folder / "model.safetensors").is_file():
        pytest.fail(f"the shipped {alias} is missing from {folder}")
    model = AutoModelForMaskedLM.from_pretrained(zoo.resolve_model(alias))
    assert isinstance(model, cls)
    info = json.loads((folder / "backbone.json").read_text())
    nelbo = info["held_out_derivation_nelbo"]
    for task in ("prosqa", "prontoqa"):  # pretraining taught it the derivations (per-token nats, fixed noise)
        assert nelbo["after"][task] < 0.5 * nelbo["before"][task]
    assert model.config.vocab_size == len(AutoTokenizer.from_pretrained(zoo.LOGIC_BACKBONE_DIR))


def test_claims_read_a_derivation_against_the_graph():
    from anchored_reasoning import generators
    from anchored_reasoning.train.backbone import document

    ex = generators.generate_dataset("prosqa", 1, seed=777, split="derivation-check", **db.CHECK_SIZE)[0]
    gold = document(ex, "prosqa").split("\n", 1)[1]  # the steps, then the closing conclusion
    steps, facts, true = db._claims(ex, gold)
    assert steps == len(ex.steps) + 1 and facts == len(ex.steps) and true == steps
    entity = ex.steps[0].split()[0]
    made_up = f"{entity} is a notaconcept. Every notaconcept is a {ex.answer.split()[-1].rstrip('.')}."
    assert db._claims(ex, made_up) == (2, 0, 0)
    concept = ex.steps[0].rstrip(".").split()[-1]
    assert db._claims(ex, f"Every {concept} is a {concept}.") == (1, 0, 0)  # a concept is not its own claim
