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


def tiny_shift_gpt2():
    from anchored_reasoning.models import ShiftGPT2LMHeadModel

    model = ShiftGPT2LMHeadModel.from_gpt2(tiny_gpt2(), 3).eval()
    with torch.no_grad():
        for lin in model.shift_proj:
            lin.weight.normal_(0, 0.3)
    return model


def test_converted_gpt2_starts_identical():
    from anchored_reasoning.models import ShiftGPT2LMHeadModel

    gpt2 = tiny_gpt2().eval()
    ids = torch.randint(0, 50, (2, 9))
    assert torch.allclose(ShiftGPT2LMHeadModel.from_gpt2(gpt2, 3).eval()(ids).logits, gpt2(ids).logits, atol=1e-6)


def test_cached_generation_matches_uncached():
    model = tiny_shift_gpt2()
    ids = torch.randint(1, 50, (2, 6))
    kw = dict(max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(ids, use_cache=True, **kw), model.generate(ids, use_cache=False, **kw))


def test_padding_feeds_no_shift():
    model = tiny_shift_gpt2()
    ids = torch.randint(1, 50, (1, 5))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], 1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(ids)], 1)
    with torch.no_grad():
        plain = model.shifted_embeddings(ids)
        left = model.shifted_embeddings(padded, attention_mask=mask)[:, 3:]
    assert torch.allclose(plain, left, atol=1e-6)


def test_saves_and_loads_with_the_auto_class(tmp_path):
    from transformers import AutoModelForCausalLM

    import anchored_reasoning.models  # noqa: F401  (registers shift-gpt2)

    model = tiny_shift_gpt2()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 50, (2, 7))
    assert type(loaded).__name__ == "ShiftGPT2LMHeadModel" and loaded.config.token_shift == 3
    assert torch.allclose(loaded(ids).logits, model(ids).logits, atol=1e-6)


def test_trls_fused_head_scores_through_the_shift():
    """SFT/GRPO training calls ``model(..., fused_lm_head=True)``, which runs ``model.base_model`` and the
    head, not the LM-head model's forward: the shift must be in the backbone or training never sees it
    (it did not, until the shift moved into ``ShiftGPT2Model``)."""
    from trl.trainer.utils import add_fused_lm_head

    model = tiny_shift_gpt2()
    ids = torch.randint(1, 50, (2, 8))
    labels = torch.nn.functional.pad(ids[:, 1:], (0, 1), value=-100)
    with torch.no_grad():
        ref = torch.log_softmax(model(ids).logits, -1)
        ref = ref[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
        unshifted = torch.log_softmax(unshifted_logits(model, ids), -1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
    add_fused_lm_head(model)
    with torch.no_grad():
        fused = model(input_ids=ids, shift_labels=labels, fused_lm_head=True).log_probs[:, :-1]
    assert torch.allclose(fused, ref, atol=1e-5)
    assert not torch.allclose(fused, unshifted, atol=1e-3)  # the check can fail: the shift changes the scores


def unshifted_logits(model, ids):
    """The same weights scored without the shift (plain GPT-2's embedding)."""
    from transformers import GPT2Model

    return model.lm_head(GPT2Model.forward(model.transformer, input_ids=ids).last_hidden_state)


def test_a_checkpoint_with_the_old_top_level_shift_names_loads_its_shift(tmp_path):
    """Checkpoints saved before the shift moved into the backbone name it ``shift_proj.*``: loading one
    must restore those projections (left at zero, the model would silently be plain GPT-2). transformers
    maps a key without the backbone prefix onto ``transformer.``, so they load as they are."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    model = tiny_shift_gpt2()
    model.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    save_file({k.removeprefix("transformer.") if ".shift_proj." in "." + k else k: v for k, v in state.items()},
              str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    assert any(k.startswith("shift_proj.") for k in load_file(str(tmp_path / "model.safetensors")))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 50, (2, 7))
    assert torch.allclose(loaded(ids).logits, model(ids).logits, atol=1e-6)
