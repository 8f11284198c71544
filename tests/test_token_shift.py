"""models/shift.py: a token-shifted embedding starts as the plain model, adds exactly the previous
tokens' projections, trains, and keeps the tied output head."""
from __future__ import annotations

import pytest
import torch

from anchored_reasoning.models.shift import add_token_shift


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=32, bos_token_id=0, eos_token_id=0,
                                           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def test_starts_as_the_plain_model():
    model = tiny_gpt2()
    ids = torch.randint(0, 50, (2, 9))
    before = model(ids).logits
    add_token_shift(model, 3)
    assert torch.allclose(model(ids).logits, before, atol=1e-6)
    assert model.generation_config.use_cache is False


def test_adds_each_previous_token_projection():
    model = add_token_shift(tiny_gpt2(), 2)
    shifted = model.get_input_embeddings()
    with torch.no_grad():
        shifted.proj[0].weight.copy_(torch.eye(16))
        shifted.proj[1].weight.copy_(2 * torch.eye(16))
    ids = torch.tensor([[3, 7, 11, 5]])
    e = shifted.emb(ids)[0]
    out = shifted(ids)[0]
    assert torch.allclose(out[0], e[0])  # nothing before the first token
    assert torch.allclose(out[1], e[1] + e[0])
    assert torch.allclose(out[3], e[3] + e[2] + 2 * e[1])


def test_projections_train_and_the_head_stays_tied():
    model = add_token_shift(tiny_gpt2(), 1)
    shifted = model.get_input_embeddings()
    assert model.lm_head.weight is shifted.emb.weight
    ids = torch.randint(0, 50, (2, 6))
    model(ids, labels=ids).loss.backward()
    assert shifted.proj[0].weight.grad is not None and shifted.proj[0].weight.grad.abs().sum() > 0


def test_refuses_no_shift():
    with pytest.raises(ValueError, match="n >= 1"):
        add_token_shift(tiny_gpt2(), 0)
