"""Fast-dLLM's approximate KV cache (sampling/kv_cache.py): off = bit-identical, on = committed tokens
never change, the cached computation is the model's, and the computed positions drop as counted."""
import random

import pytest
import torch

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.models import ADLM, ADLMConfig, MDLM, MDLMConfig, TADM, TADMConfig
from anchored_reasoning.sampling import MaskedDiffusionAdapter, SamplerConfig, make_model_fn, sample
from anchored_reasoning.sampling.kv_cache import KVCacheModelFn

torch.set_num_threads(1)
V, MASK, EOS = 40, 3, 2
_MODELS: dict = {}


def _build(arch: str, **extra):
    torch.manual_seed(1)
    common = dict(vocab_size=V, mask_token_id=MASK, max_position_embeddings=64, hidden_size=32,
                  intermediate_size=64, num_attention_heads=2, **extra)
    if arch == "mdlm":
        return MDLM(MDLMConfig.from_preset("tiny", **common))
    if arch == "adlm":
        return ADLM(ADLMConfig.from_preset("tiny", **common))
    model = TADM(TADMConfig.from_preset("tiny", **common, shared_layers=1, num_hidden_layers=2, denoiser_layers=1))
    with torch.no_grad():  # a fusion that is not the identity, so S and Phi matter
        model.fusion.delta_out.weight.normal_(0, 0.2)
        model.fusion.gate.bias.fill_(0.0)
    return model


def tiny(arch: str):
    """``mdlm``/``adlm``/``tadm``, or with ``-shift`` the same with a (non-zero) 2-token shift, which
    the cache must feed whole rows; ``-both`` adds the output shift (``shift_logits``), for which a
    cached call must read the state just before its block."""
    if arch not in _MODELS:
        shifted = arch.endswith("-shift") or arch.endswith("-both")
        extra = {"token_shift": 2, **({"shift_logits": True} if arch.endswith("-both") else {})} if shifted else {}
        model = _build(arch.removesuffix("-shift").removesuffix("-both"), **extra)
        if shifted:
            with torch.no_grad():
                for lin in model.shift_proj:
                    lin.weight.normal_(0, 0.3)
        _MODELS[arch] = model.eval()
    return _MODELS[arch]


ARCHS = ["mdlm", "adlm", "tadm"]


def _prompt(bsz=2, plen=5, seed=0, padded=False):
    g = torch.Generator().manual_seed(seed)
    p = torch.randint(4, V, (bsz, plen), generator=g)
    am = torch.ones(bsz, plen, dtype=torch.long)
    if padded:
        am[0, :2] = 0
        p[0, :2] = 0
    return p, am


@pytest.mark.parametrize("remasking", ["low_confidence", "ancestral", "threshold", "remdm"])
@pytest.mark.parametrize("arch", ARCHS)
def test_cache_off_is_bit_identical_to_the_plain_model_fn(arch, remasking):
    model = tiny(arch)
    p, am = _prompt(padded=True)
    cfg = SamplerConfig(remasking=remasking, steps=12, gen_length=12, block_length=4, temperature=0.7, seed=3)
    a, sa = sample(model, p, cfg, attention_mask=am)  # kv_cache="none" (the default)
    full = torch.cat([am, torch.ones(2, 12, dtype=am.dtype)], 1)
    b, sb = sample(model, p, cfg, attention_mask=am, model_fn=make_model_fn(model, full))
    assert torch.equal(a, b) and sa.revealed_per_step == sb.revealed_per_step and sa.nfe == sb.nfe


@pytest.mark.parametrize("mode", ["prefix", "dual"])
@pytest.mark.parametrize("arch", ARCHS + [a + "-shift" for a in ARCHS] + [a + "-both" for a in ARCHS])
def test_cached_calls_compute_what_the_model_computes(arch, mode):
    """A block's full pass equals the model; a cached call on unchanged tokens equals the full pass
    (so the cache math is exact and only staleness differs); padded rows included."""
    model = tiny(arch)
    z = torch.randint(4, V, (2, 20), generator=torch.Generator().manual_seed(5))
    z[:, 12:] = MASK
    am = torch.ones(2, 20, dtype=torch.long)
    am[0, :3] = 0
    fn = KVCacheModelFn(model, mode, 1, am)
    fn.start_block(12, 16)
    with torch.no_grad():
        full = fn(z, 0)
        ref = model(input_ids=z, attention_mask=am).logits
        assert fn.logits_offset == 0 and torch.equal(full, ref)
        z2 = z.clone()
        again = fn(z2, 1)
    end = 20 if mode == "prefix" else 16
    assert fn.logits_offset == 12 and again.shape[1] == end - 12
    torch.testing.assert_close(again, full[:, 12:end], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS + [a + "-both" for a in ARCHS])
def test_committed_tokens_never_change_with_the_cache_on(arch):
    rng = random.Random(0)
    model = tiny(arch)
    for trial in range(6):
        remasking = rng.choice(["low_confidence", "ancestral", "threshold", "random"])
        gen_length = rng.choice([8, 12, 16])
        block = rng.choice([2, 4, 8])
        cfg = SamplerConfig(remasking=remasking, steps=gen_length, gen_length=gen_length, block_length=block,
                            temperature=rng.choice([0.0, 1.0]), seed=trial, kv_cache=rng.choice(["prefix", "dual"]),
                            anchor_refresh_every=1 if arch.startswith("mdlm") else rng.choice([1, 2, 3]))
        p, am = _prompt(bsz=2, plen=rng.choice([1, 4]), seed=trial)
        trace = []
        ids, stats = sample(model, p, cfg, attention_mask=am, callback=lambda s, x: trace.append(x.clone()))
        assert torch.equal(ids[:, :p.shape[1]], p)
        assert not (ids == MASK).any()
        for k, snap in enumerate(trace):
            decoded = snap != MASK
            for later in trace[k + 1:] + [ids]:
                assert not (decoded & (later != snap)).any(), f"a committed token changed ({cfg})"


@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_forward_cost_drops_as_counted(mode):
    model = tiny("mdlm")
    p, am = _prompt(plen=6)
    gen, block, steps = 16, 4, 16
    cfg = SamplerConfig(steps=steps, gen_length=gen, block_length=block, kv_cache=mode)
    fn = KVCacheModelFn(model, mode, 1)
    ids, stats = sample(model, p, cfg.replace(kv_cache="none"), model_fn=fn)
    n_layers, length = model.config.num_hidden_layers, 6 + gen
    per_block = steps // (gen // block)
    expected = 0
    for b in range(gen // block):
        start = 6 + b * block
        active = length - start if mode == "prefix" else block
        expected += n_layers * (length + (per_block - 1) * active)
    assert fn.full_passes == gen // block and fn.calls == stats.nfe == steps
    assert fn.query_positions == expected
    assert fn.query_positions < n_layers * length * stats.nfe  # what the uncached sampler computes


def test_composes_with_the_anchor_cache():
    """TADM with kv_cache and K = 3: the anchor runs at each block's full pass and every 3 calls after."""
    model = tiny("tadm")
    p, _ = _prompt(plen=4)
    fn = KVCacheModelFn(model, "prefix", refresh_every=3)
    ids, stats = sample(model, p, SamplerConfig(steps=16, gen_length=16, block_length=8), model_fn=fn)
    assert stats.nfe == 16 and fn.full_passes == 2
    assert fn.anchor_calls == 2 * -(-8 // 3)
    k1 = KVCacheModelFn(model, "prefix", refresh_every=1)
    sample(model, p, SamplerConfig(steps=16, gen_length=16, block_length=8), model_fn=k1)
    assert k1.anchor_calls == 16
    # through the config, the same policy
    via_cfg, _ = sample(model, p, SamplerConfig(steps=16, gen_length=16, block_length=8, kv_cache="prefix",
                                                anchor_refresh_every=3))
    assert torch.equal(via_cfg, ids)


def test_bad_use_is_a_clear_error():
    with pytest.raises(ConfigError, match="kv_cache"):
        SamplerConfig(kv_cache="full")
    model = tiny("mdlm")
    p, _ = _prompt()
    with pytest.raises(ConfigError, match="either kv_cache or model_fn"):
        sample(model, p, SamplerConfig(gen_length=4, steps=4, kv_cache="prefix"), model_fn=make_model_fn(model))
    with pytest.raises(ConfigError, match="two-stage"):
        sample(model, p, SamplerConfig(gen_length=4, steps=4, kv_cache="prefix", anchor_refresh_every=2))
    adapter = MaskedDiffusionAdapter(tiny("mdlm"), mask_token_id=MASK)
    with pytest.raises(ConfigError, match="kv_cache needs one of this library's"):
        sample(adapter, p, SamplerConfig(gen_length=4, steps=4, kv_cache="dual"))
