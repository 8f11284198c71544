"""The token shift in the diffusion models (``config.token_shift``): zero at the start (the model
computes what it would without), causal (a position's input reads only earlier tokens), blind to
padding, saved and loaded, carried from a shift-gpt2 by the AR initialisation and into a TADM."""
from __future__ import annotations

import pytest
import torch

import anchored_reasoning.models as models
from anchored_reasoning.models.shift import ShiftGPT2LMHeadModel
from anchored_reasoning.models import ar_init

V, MASK = 50, 3
COMMON = dict(vocab_size=V, mask_token_id=MASK, hidden_size=32, intermediate_size=64, num_attention_heads=2,
              num_hidden_layers=2, max_position_embeddings=64)


def _pair(cls, cfg_cls, n=3):
    torch.manual_seed(0)
    plain = cls(cfg_cls(**COMMON))
    shifted = cls(cfg_cls(**COMMON, token_shift=n))
    missing = shifted.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert sorted(missing) == [f"shift_proj.{j}.weight" for j in range(n)]
    return plain.eval(), shifted.eval()


def _randomise(model):
    with torch.no_grad():
        for lin in model.shift_proj:
            lin.weight.normal_(0, 0.3)


@pytest.mark.parametrize("cls,cfg_cls", [(models.MDLM, models.MDLMConfig), (models.ADLM, models.ADLMConfig)])
def test_a_new_shift_is_zero_and_changes_nothing(cls, cfg_cls):
    plain, shifted = _pair(cls, cfg_cls)
    x = torch.randint(4, V, (2, 12))
    x[:, 6:] = MASK
    with torch.no_grad():
        assert torch.equal(plain(input_ids=x).logits, shifted(input_ids=x).logits)
    assert all(not lin.weight.any() for lin in shifted.shift_proj)
    assert plain.shift_proj is None and plain.config.token_shift == 0


def test_the_shift_reads_earlier_tokens_only_and_ignores_padding():
    _, m = _pair(models.MDLM, models.MDLMConfig, n=2)
    _randomise(m)
    x = torch.randint(4, V, (1, 10))
    base = m.embed(x)
    later, earlier = x.clone(), x.clone()
    later[0, 6] = (x[0, 6] + 1) % V
    earlier[0, 4] = (x[0, 4] + 1) % V
    with torch.no_grad():
        d_later = (m.embed(later) - base).abs().sum(-1)[0]
        d_earlier = (m.embed(earlier) - base).abs().sum(-1)[0]
    assert torch.equal(d_later[:6], torch.zeros(6)) and d_later[6:9].gt(0).all()  # positions 6, 7, 8 see token 6
    assert d_earlier[4:7].gt(0).all() and d_earlier[7:].eq(0).all()               # a 2-token shift ends at 6
    am = torch.ones(1, 10, dtype=torch.long)
    am[0, :3] = 0  # left padding: what sits there must not reach the first real token
    padded = x.clone()
    padded[0, :3] = 7
    with torch.no_grad():
        assert torch.allclose(m.embed(x, am)[0, 3:], m.embed(padded, am)[0, 3:])
        assert not torch.allclose(m.embed(x)[0, 3:5], m.embed(padded)[0, 3:5])


def test_shift_weights_survive_save_and_load(tmp_path):
    _, m = _pair(models.ADLM, models.ADLMConfig)
    _randomise(m)
    m.save_pretrained(tmp_path)
    from transformers import AutoModelForMaskedLM

    back = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert back.config.token_shift == 3
    x = torch.randint(4, V, (2, 9))
    x[:, 5:] = MASK
    with torch.no_grad():
        assert torch.allclose(m(input_ids=x).logits, back(input_ids=x).logits)


def test_tadm_from_a_shifted_base_keeps_the_shift():
    _, m = _pair(models.ADLM, models.ADLMConfig)
    _randomise(m)
    t = models.TADM.from_diffusion_model(m).eval()
    assert t.config.token_shift == 3
    for a, b in zip(t.shift_proj, m.shift_proj):
        assert torch.equal(a.weight, b.weight)
    x = torch.randint(4, V, (1, 9))
    x[:, 5:] = MASK
    with torch.no_grad():  # the fusion starts as the identity: the TADM computes the ADLM
        torch.testing.assert_close(t(input_ids=x).logits, m(input_ids=x).logits, atol=1e-4, rtol=1e-4)


def test_ar_init_from_a_shift_gpt2_copies_the_shift():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=2, n_positions=64, n_inner=64,
                                         bos_token_id=1, eos_token_id=2))
    ar = ShiftGPT2LMHeadModel.from_gpt2(gpt, 3)
    with torch.no_grad():
        for lin in ar.transformer.shift_proj:
            lin.weight.normal_(0, 0.1)
    m = models.MDLM(models.MDLMConfig(**COMMON, token_shift=3))
    n = ar_init.copy_ar_weights(m, ar)
    assert n == 2 + 2 * 10 + 2 + 3
    for a, b in zip(m.shift_proj, ar.transformer.shift_proj):
        assert torch.equal(a.weight, b.weight)
    with pytest.raises(ValueError, match="shifts 3 tokens"):
        ar_init.copy_ar_weights(models.MDLM(models.MDLMConfig(**COMMON, token_shift=2)), ar)


def test_a_negative_shift_is_refused():
    with pytest.raises(ValueError, match="token_shift=-1"):
        models.MDLM(models.MDLMConfig(**COMMON, token_shift=-1))


# --- the output shift (config.shift_logits): AR alignment of the copied head ----------------------------


def test_shift_logits_moves_each_prediction_one_position_on():
    torch.manual_seed(0)
    plain = models.MDLM(models.MDLMConfig(**COMMON)).eval()
    shifted = models.MDLM(models.MDLMConfig(**COMMON, shift_logits=True)).eval()
    shifted.load_state_dict(plain.state_dict())
    x = torch.full((1, 8), MASK)
    with torch.no_grad():
        a, b = plain(input_ids=x).logits, shifted(input_ids=x).logits
    torch.testing.assert_close(b[:, 1:], a[:, :-1])
    torch.testing.assert_close(b[:, 0], a[:, 0])


def test_the_ar_init_with_both_shifts_predicts_what_the_ar_model_predicts():
    """logic-gpt2-shift's weights in an MDLM: with the output shift, a masked object is looked up as the AR
    model looks it up (its next token); without it the copied head predicts at the wrong position."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anchored_reasoning.models.zoo import resolve_model

    path = resolve_model("logic-gpt2-shift")
    tok, ar = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()
    ids = tok("Polly is a bompus. Tom is a wumpus. Every bompus is a yerpus. Is Tom a wumpus or yerpus?\nTom is a")["input_ids"]
    want = tok(" wumpus", add_special_tokens=False)["input_ids"][0]
    got = {}
    for flag in (False, True):
        m = models.MDLM(models.MDLMConfig.from_preset(ar_init.PRESET, vocab_size=len(tok), mask_token_id=tok.mask_token_id,
                                                      token_shift=3, shift_logits=flag))
        ar_init.copy_ar_weights(m, ar)
        with torch.no_grad():
            got[flag] = m.eval()(input_ids=torch.tensor([ids + [tok.mask_token_id]])).logits[0, -1].argmax().item()
    with torch.no_grad():
        assert ar(input_ids=torch.tensor([ids])).logits[0, -1].argmax().item() == want
    assert got[True] == want and got[False] != want


def test_tadm_and_the_kv_cache_with_shift_logits():
    from anchored_reasoning.sampling.kv_cache import KVCacheModelFn

    torch.manual_seed(0)
    a = models.ADLM(models.ADLMConfig(**COMMON, shift_logits=True)).eval()
    t = models.TADM.from_diffusion_model(a).eval()
    x = torch.randint(4, V, (1, 9))
    x[:, 5:] = MASK
    with torch.no_grad():
        torch.testing.assert_close(t(input_ids=x).logits, a(input_ids=x).logits, atol=1e-4, rtol=1e-4)
    # the KV cache reads the state before each block: a cached call on unchanged tokens is the full pass
    for model in (a, t):
        fn = KVCacheModelFn(model, "prefix")
        fn.start_block(5, 7)
        with torch.no_grad():
            full, again = fn(x, 0), fn(x.clone(), 1)
        assert fn.logits_offset == 5
        torch.testing.assert_close(again, full[:, 5:], atol=1e-5, rtol=1e-5)
