"""NELBO / ANELBO / forward process / anchors / perplexity bound."""
import math
from types import SimpleNamespace

import pytest
import torch

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.models import ADLM, ADLMConfig, MDLM, MDLMConfig
from anchored_reasoning.objectives import (
    LogLinearSchedule, diffusion_loss, frequency_anchor_mask, gamma_schedule, perplexity_bound, q_sample,
    sample_times, weighted_ce,
)

torch.set_num_threads(1)
V, MASK = 24, 3


def tiny(cls, seed=0):
    torch.manual_seed(seed)
    cfg = (ADLMConfig if cls is ADLM else MDLMConfig).from_preset("tiny", vocab_size=V, mask_token_id=MASK)
    return cls(cfg)


class Spy(torch.nn.Module):
    """Wraps a model, records the noisy inputs it sees, optionally hides anchor logits."""

    def __init__(self, model, hide_anchor=False):
        super().__init__()
        self.model, self.hide_anchor, self.seen = model, hide_anchor, []
        self.mask_token_id = model.config.mask_token_id

    def forward(self, input_ids, attention_mask=None):
        self.seen.append(input_ids.clone())
        out = self.model(input_ids, attention_mask=attention_mask)
        return SimpleNamespace(logits=out.logits) if self.hide_anchor else out


def test_schedule_and_times():
    s = LogLinearSchedule(eps=1e-3)
    t = torch.tensor([0.1, 0.5, 1.0])
    torch.testing.assert_close(s.weight(t), 1 / t)
    torch.testing.assert_close(s.mask_prob(t), (1 - 1e-3) * t)
    ts = sample_times(8, generator=torch.Generator().manual_seed(0), t_min=0.0)
    assert sorted((ts * 8).floor().long().tolist()) == list(range(8)), "antithetic times cover each 1/n bin once"
    ts = sample_times(1000, antithetic=False, t_min=0.2, generator=torch.Generator().manual_seed(0))
    assert ts.min() >= 0.2 and ts.max() <= 1.0


def test_q_sample_rate_and_maskable():
    x = torch.randint(4, V, (4, 4000), generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0.0, 0.25, 0.5, 1.0])
    z, masked = q_sample(x, t, MASK, generator=torch.Generator().manual_seed(1))
    rate = masked.float().mean(-1)
    torch.testing.assert_close(rate, (1 - 1e-3) * t, atol=0.03, rtol=0)
    assert torch.equal(z == MASK, masked) and torch.equal(z[~masked], x[~masked])
    maskable = torch.zeros_like(x, dtype=torch.bool)
    maskable[:, 2000:] = True
    _, masked = q_sample(x, 1.0, MASK, maskable=maskable)
    assert not masked[:, :2000].any() and masked[:, 2000:].float().mean() > 0.99


def test_frequency_anchor_mask_matches_a_loop():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 9, (5, 30), generator=g)
    valid = torch.rand(5, 30, generator=g) < 0.8
    got = frequency_anchor_mask(x, tau=3, ignore_ids=[0], valid_mask=valid)
    for b in range(5):
        toks = [int(x[b, i]) for i in range(30) if valid[b, i] and x[b, i] != 0]
        for i in range(30):
            want = bool(valid[b, i]) and int(x[b, i]) != 0 and toks.count(int(x[b, i])) <= 3
            assert bool(got[b, i]) == want
    with pytest.raises(ConfigError):
        frequency_anchor_mask(x, tau=0)


def test_gamma_ramp():
    assert gamma_schedule(0, 1000, 3e-3, 0.01) == 0.0
    assert gamma_schedule(5, 1000, 3e-3, 0.01) == pytest.approx(1.5e-3)
    assert gamma_schedule(10, 1000, 3e-3, 0.01) == gamma_schedule(999, 1000, 3e-3, 0.01) == 3e-3
    assert gamma_schedule(0, 1000, 3e-3, 0.0) == 3e-3


@pytest.mark.parametrize("normalization", ["token", "sequence"])
def test_anelbo_gamma_zero_equals_denoiser_nelbo(normalization):
    model = tiny(ADLM)
    x = torch.randint(4, V, (4, 16), generator=torch.Generator().manual_seed(0))
    anelbo = diffusion_loss(model, x, gamma=0.0, normalization=normalization, generator=torch.Generator().manual_seed(7))
    plain = diffusion_loss(Spy(model, hide_anchor=True), x, normalization=normalization,
                           generator=torch.Generator().manual_seed(7))
    assert anelbo.anchor_loss is not None and anelbo.anchor_loss > 0
    assert plain.anchor_loss is None
    assert torch.equal(anelbo.loss, plain.loss) and torch.equal(anelbo.loss, anelbo.nelbo)


def test_anelbo_matches_hand_computation():
    model = tiny(ADLM).eval()
    x = torch.randint(4, V, (2, 10), generator=torch.Generator().manual_seed(0))
    anchors = torch.zeros_like(x, dtype=torch.bool)
    anchors[:, :3] = True
    t = torch.tensor([0.3, 0.8])
    spy = Spy(model)
    res = diffusion_loss(spy, x, t=t, gamma=0.5, anchor_mask=anchors, generator=torch.Generator().manual_seed(3))
    z = spy.seen[0]
    masked = z == MASK
    with torch.no_grad():
        out = model(z)
    ce = torch.nn.functional.cross_entropy(out.logits.reshape(-1, V), x.reshape(-1), reduction="none").reshape(2, 10)
    ace = torch.nn.functional.cross_entropy(out.anchor_logits.reshape(-1, V), x.reshape(-1), reduction="none").reshape(2, 10)
    w = 1 / t
    nelbo = ((ce * masked).sum(-1) * w).sum() / 20
    anchor = ((ace * anchors).sum(-1) * w).sum() / 20  # all anchor positions, masked or not
    torch.testing.assert_close(res.nelbo.detach(), nelbo)
    torch.testing.assert_close(res.anchor_loss.detach(), anchor)
    torch.testing.assert_close(res.loss.detach(), nelbo + 0.5 * anchor)


def test_prompt_is_never_masked_and_llada_normalisation():
    model = tiny(MDLM).eval()
    x = torch.randint(4, V, (3, 12), generator=torch.Generator().manual_seed(0))
    prompt = torch.zeros_like(x, dtype=torch.bool)
    prompt[:, :5] = True
    prompt[2, :] = True  # an empty response
    spy = Spy(model)
    t = torch.tensor([0.9, 0.9, 0.9])
    res = diffusion_loss(spy, x, prompt_mask=prompt, t=t, normalization="sequence",
                         generator=torch.Generator().manual_seed(1))
    z = spy.seen[0]
    assert torch.equal(z[prompt], x[prompt]), "prompt tokens must never be masked"
    with torch.no_grad():
        logp = model(z).logits
    ce = -logp.gather(-1, x.unsqueeze(-1)).squeeze(-1) * (z == MASK)
    p_mask = (1 - 1e-3) * 0.9
    want = (ce[0].sum() / p_mask / 7 + ce[1].sum() / p_mask / 7) / 2  # row 2 has no response: left out
    torch.testing.assert_close(res.loss.detach(), want)
    assert res.num_tokens == 14


def test_empty_batch_gives_zero_loss_with_gradient():
    model = tiny(ADLM)
    x = torch.randint(4, V, (2, 8))
    res = diffusion_loss(model, x, prompt_mask=torch.ones_like(x, dtype=torch.bool), gamma=0.1)
    assert res.loss.item() == 0.0 and res.num_tokens == 0
    res.loss.backward()


def test_gamma_needs_anchor_logits():
    with pytest.raises(ConfigError, match="anchor_logits"):
        diffusion_loss(tiny(MDLM), torch.randint(4, V, (2, 8)), gamma=0.1)


def _corpus(n=64, l=16):
    # a tiny, very learnable corpus: periodic sequences with a random phase and period
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(n):
        period = int(torch.randint(2, 4, (1,), generator=g))
        base = torch.randint(4, V, (period,), generator=g)
        rows.append(base.repeat(l // period + 1)[:l])
    return torch.stack(rows)


@pytest.mark.parametrize("cls,gamma", [(MDLM, 0.0), (ADLM, 0.1)])
def test_nelbo_decreases_under_training(cls, gamma):
    model = tiny(cls)
    data = _corpus()
    before = perplexity_bound(model, data, num_t_samples=4, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    model.train()
    for step in range(60):
        batch = data[torch.randint(0, len(data), (16,), generator=gen)]
        loss = diffusion_loss(model, batch, gamma=gamma, generator=gen).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = perplexity_bound(model, data, num_t_samples=4, seed=0)
    assert after.nelbo < 0.92 * before.nelbo, (before, after)
    assert math.isclose(after.perplexity, math.exp(after.nelbo))


def test_perplexity_bound_is_deterministic_and_checks_input():
    model = tiny(MDLM)
    x = torch.randint(4, V, (5, 10))
    a = perplexity_bound(model, x, num_t_samples=3, batch_size=2, seed=1)
    b = perplexity_bound(model, x, num_t_samples=3, batch_size=2, seed=1)
    assert a == b and a.num_tokens == 50
    with pytest.raises(ValueError):
        perplexity_bound(model, x[:0])
    with pytest.raises(ValueError, match="no tokens"):
        perplexity_bound(model, x, attention_mask=torch.zeros_like(x))


def test_weighted_ce_rejects_unknown_normalisation():
    with pytest.raises(ConfigError):
        weighted_ce(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool),
                    torch.ones(1), torch.ones(1, 2, dtype=torch.bool), "batch")
