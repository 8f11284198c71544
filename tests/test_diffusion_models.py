"""MDLM/ADLM: SUBS invariants, Auto-class round trip, padding, length errors, the ADLM factorisation."""
import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM

from anchored_reasoning.models import ADLM, ADLMConfig, MDLM, MDLMConfig, SequenceLengthError

torch.set_num_threads(1)
V, MASK = 40, 3


def make(cls, seed=0, **kw):
    cfg_cls = ADLMConfig if cls is ADLM else MDLMConfig
    torch.manual_seed(seed)
    return cls(cfg_cls.from_preset("tiny", vocab_size=V, mask_token_id=MASK, pad_token_id=0, **kw)).eval()


def noisy(b=3, l=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(4, V, (b, l), generator=g)
    m = torch.rand(b, l, generator=g) < 0.5
    return torch.where(m, torch.full_like(x, MASK), x), m


@pytest.mark.parametrize("cls", [MDLM, ADLM])
def test_subs_invariants(cls):
    model = make(cls)
    z, masked = noisy()
    with torch.no_grad():
        logp = model(z).logits
    probs = logp.exp()
    assert torch.all(probs[..., MASK] == 0), "the mask token must never be predicted"
    torch.testing.assert_close(probs.sum(-1), torch.ones(z.shape))
    carried = probs.gather(-1, z.unsqueeze(-1)).squeeze(-1)
    assert torch.all(carried[~masked] == 1.0), "unmasked positions must copy their input token"
    # masked positions get a real distribution, not a point mass
    assert torch.all(probs[masked].max(-1).values < 1.0)


@pytest.mark.parametrize("cls", [MDLM, ADLM])
def test_save_and_auto_from_pretrained_round_trip(cls, tmp_path):
    model = make(cls)
    z, _ = noisy()
    with torch.no_grad():
        ref = model(z).logits
    model.save_pretrained(tmp_path)
    assert type(AutoConfig.from_pretrained(tmp_path)) is type(model.config)
    for auto in (AutoModelForMaskedLM, AutoModel):
        loaded = auto.from_pretrained(tmp_path).eval()
        assert type(loaded) is cls
        with torch.no_grad():
            assert torch.equal(loaded(z).logits, ref)


@pytest.mark.parametrize("cls", [MDLM, ADLM])
def test_too_long_input_is_a_clear_error(cls):
    model = make(cls, max_position_embeddings=16)
    with pytest.raises(SequenceLengthError, match="max_position_embeddings=16"):
        model(torch.full((1, 17), 5))
    model(torch.full((1, 16), 5))  # exactly the maximum is fine


def test_missing_mask_token_id_is_a_clear_error():
    with pytest.raises(ValueError, match="mask_token_id"):
        MDLM(MDLMConfig.from_preset("tiny", vocab_size=V))
    with pytest.raises(ValueError, match="unknown preset"):
        MDLMConfig.from_preset("huge")


@pytest.mark.parametrize("cls", [MDLM, ADLM])
def test_left_padding_does_not_change_real_positions(cls):
    model = make(cls)
    z, _ = noisy(b=1, l=10)
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), z], dim=1)
    am = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 10, dtype=torch.long)], dim=1)
    with torch.no_grad():
        a = model(z).logits
        b = model(padded, attention_mask=am).logits[:, 4:]
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_adlm_factorises_into_anchor_and_denoiser():
    model = make(ADLM)
    assert len(model.anchor.layers) == 2 and len(model.denoiser.layers) == 1
    z, _ = noisy()
    with torch.no_grad():
        out = model(z)
        anchor = model.anchor_forward(z)
        assert torch.equal(anchor, out.anchor_logits)
        assert torch.equal(model.denoise(anchor, z), out.logits)
        # a stale (cached) anchor from a noisier sequence still gives valid SUBS output for the current z
        stale = model.anchor_forward(torch.full_like(z, MASK))
        probs = model.denoise(stale, z).exp()
        assert torch.all(probs[..., MASK] == 0)


def test_paper_preset_sizes():
    c = ADLMConfig.from_preset("paper", vocab_size=50258, mask_token_id=50257)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_denoiser_layers) == (12, 768, 12, 6)
    assert MDLMConfig.from_preset("paper", vocab_size=10, mask_token_id=9).num_hidden_layers == 12


@pytest.mark.parametrize("cls", [MDLM, ADLM])
def test_gradient_checkpointing_gives_the_same_gradients(cls):
    z, _ = noisy()
    grads = []
    for ckpt in (False, True):
        model = make(cls).train()
        if ckpt:
            model.gradient_checkpointing_enable()
        target = torch.randint(4, V, z.shape, generator=torch.Generator().manual_seed(0))
        logp = model(z).logits
        (-logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)[z == MASK]).sum().backward()
        grads.append(model.embed_tokens.weight.grad.clone())
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1])
