"""The logic diffusion backbones: AR-to-diffusion weight copy (``models.ar_init``) and the shipped logic-mdlm /
logic-adlm (loadable by alias; pretraining lowered their held-out derivation NELBO). Their pretraining is archived
in research/backbones/ (its tests: research/tests/test_diffusion_backbone.py)."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

import anchored_reasoning.models as models
from anchored_reasoning.models import zoo
from anchored_reasoning.models import ar_init


def _small(cls, cfg_cls, tok):
    return cls(cfg_cls.from_preset(ar_init.PRESET, vocab_size=len(tok), mask_token_id=tok.mask_token_id,
                                   pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))


@pytest.fixture(scope="module")
def gpt():
    return AutoModelForCausalLM.from_pretrained(zoo.LOGIC_BACKBONE_DIR), AutoTokenizer.from_pretrained(zoo.LOGIC_BACKBONE_DIR)


def test_ar_weights_land_in_mdlm(gpt):
    ar, tok = gpt
    m = _small(models.MDLM, models.MDLMConfig, tok)
    n = ar_init.copy_ar_weights(m, ar)
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
    ar_init.copy_ar_weights(a, ar)
    assert torch.equal(a.anchor.layers[0].qkv.weight, ar.transformer.h[0].attn.c_attn.weight.T)
    assert torch.equal(a.anchor_head.weight, ar.lm_head.weight)
    assert torch.equal(a.denoiser.layers[0].qkv.weight, before)


def test_ar_copy_refuses_other_shapes(gpt):
    ar, tok = gpt
    m = models.MDLM(models.MDLMConfig.from_preset("tiny", vocab_size=len(tok), mask_token_id=tok.mask_token_id))
    with pytest.raises(ValueError, match="AR init needs"):
        ar_init.copy_ar_weights(m, ar)


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


