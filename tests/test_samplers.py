"""Samplers: committed tokens never change (property test), reveal counts add up, EOS, bad input, adapters."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.models import ADLM, ADLMConfig, MDLM, MDLMConfig
from anchored_reasoning.objectives import diffusion_loss
from anchored_reasoning.sampling import (
    LOCKED_IN, REMASKING, MaskedDiffusionAdapter, SamplerConfig, load_masked_diffusion_model, sample,
)

torch.set_num_threads(1)
V, MASK, EOS = 30, 3, 2
_MODELS = {}


def tiny(cls=MDLM, max_len=64):
    key = (cls, max_len)
    if key not in _MODELS:
        torch.manual_seed(0)
        cfg = (ADLMConfig if cls is ADLM else MDLMConfig).from_preset(
            "tiny", vocab_size=V, mask_token_id=MASK, max_position_embeddings=max_len, hidden_size=32,
            intermediate_size=64, num_attention_heads=2)
        _MODELS[key] = cls(cfg).eval()
    return _MODELS[key]


def run_with_trace(model, prompt, cfg, **kw):
    trace = []
    ids, stats = sample(model, prompt, cfg, callback=lambda step, x: trace.append(x.clone()), **kw)
    return ids, stats, trace


def check_committed_never_change(prompt, ids, stats, trace, cfg):
    plen = prompt.shape[1]
    assert torch.equal(ids[:, :plen], prompt), "prompt tokens changed"
    blocks = cfg.blocks()
    for k, snap in enumerate(trace):
        assert torch.equal(snap[:, :plen], prompt)
        decoded = snap[:, plen:] != MASK
        for pos in range(cfg.gen_length):
            blk = next(b for b, (s, e) in enumerate(blocks) if s <= pos < e)
            if cfg.remasking not in LOCKED_IN:
                later_remask = any(stats.can_remask[j] and stats.block_of_step[j] == blk for j in range(k + 1, len(trace)))
                if later_remask:
                    continue  # not committed yet: ReMDM may still re-mask it
            for later in trace[k + 1:] + [ids]:
                changed = decoded[:, pos] & (later[:, plen + pos] != snap[:, plen + pos])
                assert not changed.any(), f"committed token at {pos} changed after step {k} ({cfg.remasking})"


def check_counts(ids, stats, cfg, bsz):
    assert not (ids[:, stats.prompt_length:] == MASK).any()
    for r in range(bsz):
        revealed = sum(step[r] for step in stats.revealed_per_step)
        remasked = sum(step[r] for step in stats.remasked_per_step)
        assert revealed - remasked + stats.filled_after_eos[r] == cfg.gen_length
        if cfg.remasking in LOCKED_IN:
            assert remasked == 0
    assert stats.nfe <= stats.steps <= cfg.steps
    assert len(stats.can_remask) == len(stats.block_of_step) == stats.steps


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    remasking=st.sampled_from(REMASKING),
    adlm=st.booleans(),
    bsz=st.integers(1, 3),
    plen=st.integers(0, 6),
    gen_length=st.integers(1, 20),
    block_length=st.one_of(st.none(), st.integers(1, 12)),
    extra_steps=st.integers(0, 12),
    temperature=st.sampled_from([0.0, 0.7, 1.0]),
    top_p=st.sampled_from([1.0, 0.9, 0.5]),
    top_k=st.sampled_from([0, 5]),
    threshold=st.floats(0.0, 1.0),
    eta=st.sampled_from([0.0, 0.02, 0.5]),
    stop_at_eos=st.booleans(),
    left_pad=st.integers(0, 3),
    seed=st.integers(0, 10_000),
)
def test_no_sampler_changes_a_committed_token(remasking, adlm, bsz, plen, gen_length, block_length, extra_steps,
                                              temperature, top_p, top_k, threshold, eta, stop_at_eos, left_pad, seed):
    model = tiny(ADLM if adlm else MDLM)
    n_blocks = len(range(0, gen_length, block_length or gen_length))
    cfg = SamplerConfig(remasking=remasking, steps=n_blocks + extra_steps, gen_length=gen_length,
                        block_length=block_length, temperature=temperature, top_p=top_p, top_k=top_k,
                        threshold=threshold, eta=eta, seed=seed, stop_at_eos=stop_at_eos, eos_token_id=EOS)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(4, V, (bsz, plen), generator=g)
    kw = {}
    if left_pad and plen:  # row 0 left-padded by up to left_pad tokens (pad id 0)
        am = torch.ones_like(prompt)
        am[0, :min(left_pad, plen - 1)] = 0
        prompt[0][am[0] == 0] = 0
        kw["attention_mask"] = am
    ids, stats, trace = run_with_trace(model, prompt, cfg, **kw)
    assert ids.shape == (bsz, plen + gen_length)
    check_committed_never_change(prompt, ids, stats, trace, cfg)
    check_counts(ids, stats, cfg, bsz)


@pytest.mark.parametrize("remasking", REMASKING)
def test_revealed_per_step_adds_up_and_seed_is_deterministic(remasking):
    model = tiny(ADLM)
    prompt = torch.randint(4, V, (2, 5))
    cfg = SamplerConfig(remasking=remasking, steps=24, gen_length=24, block_length=8, temperature=1.0, top_p=0.9, seed=3)
    ids, stats = sample(model, prompt, cfg)
    check_counts(ids, stats, cfg, 2)
    again, _ = sample(model, prompt, cfg)
    assert torch.equal(ids, again)
    if remasking in ("low_confidence", "random"):
        assert stats.revealed_per_step == [[1, 1]] * 24  # LLaDA: an even share per step
    if remasking == "threshold":
        assert stats.steps <= 24


def test_remdm_remasks_only_in_its_loop_phase():
    model = tiny(MDLM)
    cfg = SamplerConfig(remasking="remdm", steps=200, gen_length=16, eta=0.3, temperature=1.0, seed=0)
    ids, stats = sample(model, torch.randint(4, V, (2, 4)), cfg)
    remasked = [sum(r) for r in stats.remasked_per_step]
    assert sum(remasked) > 0
    assert all(n == 0 for n, can in zip(remasked, stats.can_remask) if not can)
    loop = [i for i, can in enumerate(stats.can_remask) if can]
    assert loop and loop[0] >= 0.4 * 200 and loop[-1] <= 0.96 * 200  # between t_on=0.55 and t_off=0.05


def test_padded_prompts_match_unpadded():
    model = tiny(MDLM)
    p = torch.randint(4, V, (1, 5))
    cfg = SamplerConfig(remasking="low_confidence", steps=8, gen_length=8)
    ids, _ = sample(model, p, cfg)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), p], 1)
    am = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 5, dtype=torch.long)], 1)
    ids_pad, _ = sample(model, padded, cfg, attention_mask=am)
    assert torch.equal(ids_pad[:, 3:], ids)


def test_stop_at_eos_fills_and_stops_early():
    model = tiny(MDLM)

    def eos_first(z, step):  # a model that wants EOS everywhere: the first block ends the text
        logits = torch.zeros(z.shape[0], z.shape[1], V)
        logits[..., EOS] = 10.0
        return logits

    cfg = SamplerConfig(remasking="low_confidence", steps=8, gen_length=16, block_length=4, stop_at_eos=True,
                        eos_token_id=EOS)
    ids, stats = sample(model, torch.randint(4, V, (2, 3)), cfg, model_fn=eos_first)
    assert stats.steps == 2 and stats.nfe == 2  # only the first block was decoded
    assert stats.filled_after_eos == [12, 12]
    assert torch.all(ids[:, 3:] == EOS)
    check_counts(ids, stats, cfg, 2)
    with pytest.raises(ConfigError, match="eos_token_id"):
        SamplerConfig(stop_at_eos=True)


def test_model_fn_indirection_sees_every_call():
    model = tiny(ADLM)
    calls = []

    def cached(z, step):  # a hand-written cache policy: refresh the anchor every 2 steps
        calls.append(step)
        if step % 2 == 0 or not hasattr(cached, "anchor"):
            cached.anchor = model.anchor_forward(z)
        return model.denoise(cached.anchor, z)

    cfg = SamplerConfig(remasking="low_confidence", steps=8, gen_length=8)
    _, stats = sample(model, torch.randint(4, V, (1, 3)), cfg, model_fn=cached)
    assert calls == list(range(8)) and stats.nfe == 8


def test_bad_input_is_a_clear_error():
    model = tiny(MDLM, max_len=16)
    with pytest.raises(ConfigError, match="fills the model's whole context"):
        sample(model, torch.randint(4, V, (1, 16)), SamplerConfig(gen_length=4, steps=4))
    with pytest.raises(ConfigError, match="exceeds"):
        sample(model, torch.randint(4, V, (1, 10)), SamplerConfig(gen_length=8, steps=4))
    with pytest.raises(DataError, match="mask token"):
        sample(model, torch.tensor([[5, MASK, 6]]), SamplerConfig(gen_length=4, steps=4))
    with pytest.raises(ConfigError, match="fewer than the number of blocks"):
        sample(model, torch.randint(4, V, (1, 2)), SamplerConfig(gen_length=8, block_length=2, steps=3))
    with pytest.raises(ConfigError, match="remasking"):
        SamplerConfig(remasking="beam")
    with pytest.raises(ConfigError, match="no field"):
        SamplerConfig().replace(temprature=1.0)


def test_empty_response_is_handled():
    model = tiny(MDLM)
    p = torch.randint(4, V, (2, 4))
    ids, stats = sample(model, p, SamplerConfig(gen_length=0, steps=4))
    assert torch.equal(ids, p) and stats.nfe == 0 and stats.steps == 0
    ids, stats = sample(model, torch.zeros(1, 0, dtype=torch.long), SamplerConfig(gen_length=4, steps=4))
    assert ids.shape == (1, 4) and not (ids == MASK).any()  # unconditional generation


def _tiny_bert(tmp_path=None):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=64, max_position_embeddings=32)).eval()
    return model


def test_external_checkpoint_through_the_adapter(tmp_path):
    bert = _tiny_bert()
    adapter = MaskedDiffusionAdapter(bert, mask_token_id=MASK)
    assert adapter.max_length == 32
    cfg = SamplerConfig(remasking="low_confidence", steps=6, gen_length=6)
    prompt = torch.randint(4, V, (2, 4))
    ids, stats, trace = run_with_trace(adapter, prompt, cfg)
    check_committed_never_change(prompt, ids, stats, trace, cfg)
    check_counts(ids, stats, cfg, 2)
    loss = diffusion_loss(adapter, torch.randint(4, V, (2, 10)))
    loss.loss.backward()
    assert bert.bert.embeddings.word_embeddings.weight.grad is not None
    with pytest.raises(ConfigError, match="max length"):
        adapter(torch.randint(4, V, (1, 40)))
    # shifted (Dream-style) logits: position i gets what the model said at i - 1
    shifted = MaskedDiffusionAdapter(bert, mask_token_id=MASK, shift_logits=True, attention_mask_format="4d")
    z = torch.randint(4, V, (1, 6))
    with torch.no_grad():
        a, b = adapter(z).logits, shifted(z, attention_mask=torch.ones_like(z)).logits
    assert torch.equal(b[:, 1:], a[:, :-1])
    # loading: an external checkpoint gets wrapped, ours loads as itself
    bert.config.mask_token_id = MASK
    bert.save_pretrained(tmp_path / "bert")
    loaded = load_masked_diffusion_model(str(tmp_path / "bert"))
    assert isinstance(loaded, MaskedDiffusionAdapter) and loaded.mask_token_id == MASK
    tiny(ADLM).save_pretrained(tmp_path / "adlm")
    assert isinstance(load_masked_diffusion_model(str(tmp_path / "adlm")), ADLM)
    with pytest.raises(ConfigError, match="differs"):
        load_masked_diffusion_model(str(tmp_path / "adlm"), mask_token_id=MASK + 1)


def test_anchor_cache_k1_is_exact_and_counts_refreshes():
    from anchored_reasoning.sampling import AnchorCacheModelFn

    model = tiny(ADLM)
    prompt = torch.randint(4, V, (2, 3))
    cfg = SamplerConfig(remasking="low_confidence", steps=10, gen_length=10, temperature=1.0, seed=5)
    plain, _ = sample(model, prompt, cfg)
    k1 = AnchorCacheModelFn(model, refresh_every=1)
    cached, stats = sample(model, prompt, cfg, model_fn=k1)
    assert torch.equal(plain, cached) and k1.anchor_calls == stats.nfe == 10
    k3 = AnchorCacheModelFn(model, refresh_every=3)
    _, stats = sample(model, prompt, cfg, model_fn=k3)
    assert k3.calls == stats.nfe == 10 and k3.anchor_calls == 4  # ceil(10 / 3)
    with pytest.raises(ConfigError, match="anchor_forward"):
        AnchorCacheModelFn(tiny(MDLM))


def test_every_native_model_type_loads_without_an_adapter(tmp_path):
    from anchored_reasoning.models import DiffusionPreTrainedModel

    model = tiny(MDLM)
    model.save_pretrained(tmp_path)
    loaded = load_masked_diffusion_model(str(tmp_path))
    assert isinstance(loaded, DiffusionPreTrainedModel) and type(loaded) is MDLM


def _left_pad(rows):
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    am = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], am[i, width - len(r):] = torch.tensor(r), 1
    return ids, am


@pytest.mark.parametrize("opts", [{"remasking": "low_confidence"}, {"remasking": "threshold", "threshold": 0.05},
                                  {"remasking": "low_confidence", "kv_cache": "prefix"},
                                  {"remasking": "low_confidence", "kv_cache": "dual"}])
def test_a_left_padded_mixed_length_batch_gives_the_texts_of_one_at_a_time(opts):
    model = tiny(MDLM)
    gen = torch.Generator().manual_seed(1)
    rows = [torch.randint(4, V, (n,), generator=gen).tolist() for n in (3, 9, 5, 7, 4, 8)]
    cfg = SamplerConfig(steps=12, gen_length=12, block_length=4, **opts)
    ids, am = _left_pad(rows)
    batched, _ = sample(model, ids, cfg, attention_mask=am)
    for i, r in enumerate(rows):
        alone, _ = sample(model, torch.tensor([r]), cfg)
        assert batched[i, ids.shape[1]:].tolist() == alone[0, len(r):].tolist(), (opts, i)


class _SureWhenLong(torch.nn.Module):
    """Predicts token 5 everywhere: surely for rows with long prompts (threshold decoding reveals their block in one
    step), uniformly unsure for short ones (one position per step). Records each call's row count."""

    def __init__(self):
        super().__init__()
        self.config = type("C", (), {"mask_token_id": MASK, "max_position_embeddings": 64})()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.calls = []

    def forward(self, input_ids, attention_mask=None):
        self.calls.append(input_ids.shape[0])
        real = attention_mask.sum(-1) if attention_mask is not None else torch.full((input_ids.shape[0],), input_ids.shape[1])
        logits = torch.zeros(*input_ids.shape, V)
        logits[..., 5] = torch.where(real > 16, 20.0, 1.0)[:, None]
        return type("O", (), {"logits": logits})()


def test_rows_whose_block_is_done_skip_the_model():
    model = _SureWhenLong()
    ids, am = _left_pad([[7] * 2, [7] * 9, [7] * 2])  # with 12 generated: two short rows (14 positions), one long (21)
    cfg = SamplerConfig(remasking="threshold", threshold=0.9, steps=12, gen_length=12, block_length=4)
    out, stats = sample(model, ids, cfg, attention_mask=am)
    # the long row's block is done after the first call of each block; the block's other 3 calls run the short rows
    assert model.calls == [3, 2, 2, 2] * 3 and stats.nfe == 12 and stats.model_rows == 27
    assert stats.calls_of_row == [12, 3, 12]
    assert (out[:, ids.shape[1]:] == 5).all()
    alone, _ = sample(model, torch.tensor([[7] * 2]), cfg)
    assert out[0, ids.shape[1]:].tolist() == alone[0, 2:].tolist()
    # sampling (temperature > 0) keeps every row in every call: its draws never depend on which rows ran
    model.calls.clear()
    sample(model, ids, cfg.replace(temperature=1.0), attention_mask=am)
    assert set(model.calls) == {3}
