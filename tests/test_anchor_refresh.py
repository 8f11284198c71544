"""Confidence-triggered anchor refresh (``anchor_refresh_below``): a row's anchor is recomputed, for that
row only, when its next token is a hard one; the spliced rows equal a full refresh's, rows never see each
other, the counters say what ran, and bad settings are refused."""
import pytest
import torch

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.models import ADLM, ADLMConfig, MDLM, MDLMConfig, TADM, TADMConfig
from anchored_reasoning.sampling import AnchorCacheModelFn, SamplerConfig, sample

torch.set_num_threads(1)
V, MASK = 30, 3


def tadm(seed=0):
    torch.manual_seed(seed)
    model = TADM(TADMConfig.from_preset("tiny", vocab_size=V, mask_token_id=MASK, hidden_size=32, intermediate_size=64,
                                        num_attention_heads=2, max_position_embeddings=64, shared_layers=1,
                                        num_hidden_layers=2, denoiser_layers=1)).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # a fusion that is not the identity, so a stale anchor changes the output
        for p in model.fusion.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model


def adlm(seed=0):
    torch.manual_seed(seed)
    return ADLM(ADLMConfig.from_preset("tiny", vocab_size=V, mask_token_id=MASK, hidden_size=32, intermediate_size=64,
                                       num_attention_heads=2, max_position_embeddings=64, num_hidden_layers=4)).eval()


def noisy(b=3, l=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(4, V, (b, l), generator=g)
    return torch.where(torch.rand(b, l, generator=g) < 0.5, torch.full_like(x, MASK), x)


@pytest.mark.parametrize("make", [tadm, adlm])
def test_only_the_hard_row_is_refreshed_and_its_anchor_equals_a_full_refresh(make):
    model = make()
    z0, z1 = noisy(seed=1), noisy(seed=2)
    fn = AnchorCacheModelFn(model, refresh_every=100, refresh_below=0.5)
    with torch.no_grad():
        fn(z0, 0)
        conf = torch.full_like(fn.confidence, 0.9)
        conf[1] = 0.1  # row 1's next token (its most confident masked position) is below tau
        fn.confidence = conf
        out = fn(z1, 1)
        old, new = model.anchor_forward(z0), model.anchor_forward(z1)
    get = (lambda a: a) if isinstance(fn.anchor, torch.Tensor) else (lambda a: a.hidden)
    torch.testing.assert_close(get(fn.anchor)[1], get(new)[1])
    torch.testing.assert_close(get(fn.anchor)[[0, 2]], get(old)[[0, 2]])
    assert not torch.allclose(get(old)[1], get(new)[1])  # the two inputs really differ
    with torch.no_grad():
        torch.testing.assert_close(out, model.denoise(fn.anchor, z1))
    assert (fn.anchor_calls, fn.anchor_rows, fn.row_calls, fn.calls) == (2, 4, 6, 2)
    assert fn.refresh_fraction == pytest.approx(4 / 6)
    assert fn.age.tolist() == [2, 1, 2]


def test_a_row_samples_the_same_alone_and_in_a_batch():
    """Per-row decisions: what a row generates cannot depend on which other rows share its batch."""
    model = tadm()
    prompts = torch.randint(4, V, (4, 5), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():  # tau: the median top probability of this untrained model, so some steps are hard
        z = torch.cat([prompts, torch.full((4, 12), MASK)], 1)
        tau = float(model(input_ids=z).logits.max(-1).values.exp()[:, 5:].median())
    cfg = SamplerConfig(steps=12, gen_length=12, anchor_refresh_every=4, anchor_refresh_below=tau)
    with torch.no_grad():
        batch, stats = sample(model, prompts, cfg)
        alone = [sample(model, prompts[i:i + 1], cfg)[0] for i in range(4)]
    assert torch.equal(batch, torch.cat(alone))
    # between K-periodic (1/4) and every call (1): the hard steps of some rows were refreshed
    assert 0.25 < stats.anchor_refresh_fraction < 1


def test_the_threshold_moves_the_cost_between_the_periodic_and_the_full_refresh():
    model = tadm()
    prompts = torch.randint(4, V, (3, 5), generator=torch.Generator().manual_seed(6))
    cfg = SamplerConfig(steps=12, gen_length=12, anchor_refresh_every=4)
    with torch.no_grad():
        periodic, s_periodic = sample(model, prompts, cfg)
        always, s_always = sample(model, prompts, cfg.replace(anchor_refresh_below=1.0))
        plain, _ = sample(model, prompts, cfg.replace(anchor_refresh_every=1))
        tiny_tau, s_tiny = sample(model, prompts, cfg.replace(anchor_refresh_below=1e-9))
    assert s_periodic.anchor_refresh_fraction == pytest.approx(3 / 12)  # steps 0, 4, 8
    assert (s_periodic.anchor_rows, s_periodic.row_calls) == (3 * 3, 3 * 12)  # the exact counts behind it
    # tau = 1: every step with a masked position is hard, so each call refreshes: the uncached model
    assert s_always.anchor_refresh_fraction == pytest.approx(1.0) and torch.equal(always, plain)
    # a tau nothing falls below: exactly the periodic cache
    assert s_tiny.anchor_refresh_fraction == pytest.approx(3 / 12) and torch.equal(tiny_tau, periodic)


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="anchor_refresh_below=0"):
        SamplerConfig(anchor_refresh_below=0)
    with pytest.raises(ConfigError, match="not implemented for the KV cache"):
        SamplerConfig(anchor_refresh_below=0.5, kv_cache="prefix")
    torch.manual_seed(0)
    mdlm = MDLM(MDLMConfig.from_preset("tiny", vocab_size=V, mask_token_id=MASK, hidden_size=32, intermediate_size=64,
                                       num_attention_heads=2, max_position_embeddings=64, num_hidden_layers=2)).eval()
    with pytest.raises(ConfigError, match="two-stage"):
        sample(mdlm, torch.randint(4, V, (1, 4)), SamplerConfig(steps=4, gen_length=4, anchor_refresh_below=0.5))
    with pytest.raises(ConfigError, match="refresh_below=1.5"):
        AnchorCacheModelFn(tadm(), refresh_below=1.5)
