"""DiffusionGemma in the library (models/diffusion_gemma.py), TADM's cached sampling inside the model's own
block loop (models/tadm_gemma.py) and the diffusion_gemma backend, on a tiny CPU config."""
import json

import pytest
import torch

torch.set_num_threads(1)

from anchored_reasoning.errors import ConfigError  # noqa: E402
from anchored_reasoning.models.diffusion_gemma import (  # noqa: E402
    LayerSplit,
    decoder_embed,
    decoder_head,
    decoder_layers,
    load_diffusion_gemma,
    make_tiny_diffusion_gemma,
    paper_generation_kwargs,
    tiny_diffusion_gemma_config,
)
from anchored_reasoning.models.tadm_gemma import (  # noqa: E402
    AnchorFusion,
    TADMDiffusionGemma,
    fusion_parameters,
    layer_calls_per_canvas,
)

GEN = dict(max_new_tokens=32, **paper_generation_kwargs(6))  # 2 canvases of 16, 6 steps each


@pytest.fixture(scope="module")
def model():
    from transformers import DiffusionGemmaForBlockDiffusion

    torch.manual_seed(0)
    return DiffusionGemmaForBlockDiffusion(tiny_diffusion_gemma_config(300)).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from anchored_reasoning.generators.prosqa import generate_dataset

    examples = generate_dataset(2, seed=0, num_nodes=12, min_hops=2)
    path = make_tiny_diffusion_gemma(tmp_path_factory.mktemp("dg") / "tiny", texts=[e.question for e in examples])
    return path, examples


def _encode(model, ids, mask=None):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    model.model.encoder(input_ids=ids, attention_mask=mask, past_key_values=cache,
                        position_ids=torch.arange(ids.shape[1]).unsqueeze(0))
    return cache


@torch.no_grad()
def test_decoder_in_stages_is_the_models_forward_bit_for_bit(model):
    torch.manual_seed(1)
    ids = torch.randint(3, 300, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0  # a left-padded row
    cache = _encode(model, ids, mask)
    canvas, sc = torch.randint(0, 300, (2, 16)), torch.randn(2, 16, 303)
    kw = dict(self_conditioning_logits=sc, decoder_attention_mask=torch.nn.functional.pad(mask.bool(), (0, 16), value=True),
              decoder_position_ids=torch.arange(7, 23).unsqueeze(0))
    reference = model(decoder_input_ids=canvas, past_key_values=cache, **kw).logits
    hidden, step = decoder_embed(model, canvas, cache, **kw)
    for lo, hi in ((0, 1), (1, 4), (4, 6)):
        hidden = decoder_layers(model, hidden, lo, hi, step)
    assert torch.equal(decoder_head(model, hidden), reference)


def test_untrained_fusion_at_k1_is_the_base_model_token_for_token(model):
    fusion = AnchorFusion.for_model(model, LayerSplit.proportional(6), seed=0)
    assert float(fusion.o_proj.weight.detach().abs().sum()) == 0.0
    ids = torch.randint(3, 300, (2, 9), generator=torch.Generator().manual_seed(2))
    torch.manual_seed(5)
    base = model.generate(ids, **GEN).sequences
    tadm = TADMDiffusionGemma(model, fusion, anchor_refresh_every=1)
    torch.manual_seed(5)
    cached = tadm.generate(ids, **GEN).sequences
    assert torch.equal(cached, base)
    assert tadm.counters.nfe == 12 and tadm.counters.anchor_refreshes == 12 and tadm.counters.canvases == 2
    assert tadm.counters.decoder_layer_calls == tadm.counters.base_decoder_layer_calls == 12 * 6
    assert "forward" not in vars(model)  # the model's own forward is back


@pytest.mark.parametrize("k", [2, 3])
def test_stale_anchor_runs_fewer_anchor_layers(model, k):
    split = LayerSplit.proportional(6)  # 1 / 3 / 2
    fusion = AnchorFusion.for_model(model, split, seed=0)
    ids = torch.randint(3, 300, (1, 5), generator=torch.Generator().manual_seed(3))
    fresh = TADMDiffusionGemma(model, fusion, anchor_refresh_every=1)
    fresh.generate(ids, **GEN)
    stale = TADMDiffusionGemma(model, fusion, anchor_refresh_every=k)
    torch.manual_seed(7)
    out = stale.generate(ids, **GEN).sequences
    c = stale.counters
    assert out.shape == (1, 5 + 32) and c.nfe == 12 and c.canvases == 2
    assert c.anchor_refreshes == 2 * -(-6 // k) < fresh.counters.anchor_refreshes
    assert c.anchor_layer_calls == c.anchor_refreshes * split.anchor < fresh.counters.anchor_layer_calls
    assert c.decoder_layer_calls == 2 * layer_calls_per_canvas(split, 6, k) < c.base_decoder_layer_calls
    # an untrained fusion is the identity on the stale state: the same tokens as naive stale reuse
    naive = TADMDiffusionGemma(model, None, split=split, anchor_refresh_every=k)
    torch.manual_seed(7)
    assert torch.equal(naive.generate(ids, **GEN).sequences, out)
    assert naive.counters.fusion_calls == 0 and c.fusion_calls == 12


def test_a_trained_fusion_changes_the_output_and_counts_its_parameters(model):
    split = LayerSplit.proportional(6)
    fusion = AnchorFusion.for_model(model, split, fusion_dim=64, num_heads=2, seed=0)
    assert fusion_parameters(fusion) == 6 * 64 * 64 + 2 * 64  # 6 d r + the two norms
    with torch.no_grad():
        fusion.o_proj.weight.normal_(std=0.5)
    ids = torch.randint(3, 300, (1, 5), generator=torch.Generator().manual_seed(4))
    torch.manual_seed(9)
    base = model.generate(ids, **GEN).sequences
    torch.manual_seed(9)
    assert not torch.equal(TADMDiffusionGemma(model, fusion).generate(ids, **GEN).sequences, base)


def test_split_proportions_and_bad_splits(model):
    assert LayerSplit.proportional(30) == LayerSplit(2, 20, 8)
    assert LayerSplit.for_model(model.config, None) == LayerSplit(1, 3, 2)
    assert LayerSplit.for_model(model.config, [2, 2, 2]) == LayerSplit(2, 2, 2)
    with pytest.raises(ConfigError, match=r"shared=2 \+ anchor=20 \+ denoiser=8 = 30 layers does not fit .* 6 decoder"):
        LayerSplit.for_model(model.config, (2, 20, 8))
    with pytest.raises(ConfigError, match="anchor, denoiser >= 1"):
        LayerSplit.for_model(model.config, [3, 3, 0])
    with pytest.raises(ConfigError, match="three integers"):
        LayerSplit.for_model(model.config, [1, 5])


@pytest.mark.parametrize("k", [0, -1, 1.5, True])
def test_refresh_period_below_one_is_refused(model, k):
    with pytest.raises(ConfigError, match="anchor_refresh_every"):
        TADMDiffusionGemma(model, anchor_refresh_every=k)


def test_a_fusion_for_another_split_is_refused(model):
    fusion = AnchorFusion.for_model(model, LayerSplit(1, 3, 2))
    with pytest.raises(ConfigError, match="differs from the fusion's"):
        TADMDiffusionGemma(model, fusion, split=[2, 2, 2])


def test_a_checkpoint_that_is_no_diffusion_gemma_is_refused_before_loading(tmp_path, monkeypatch):
    from transformers import DiffusionGemmaForBlockDiffusion

    from anchored_reasoning.backends import get_backend
    from anchored_reasoning.testing import make_tiny_causal_lm

    path = make_tiny_causal_lm(tmp_path / "llama")

    def no_load(*args, **kwargs):
        raise AssertionError("weights loaded before the check")

    monkeypatch.setattr(DiffusionGemmaForBlockDiffusion, "from_pretrained", no_load)
    with pytest.raises(ConfigError, match="'llama' checkpoint, not a DiffusionGemma"):
        load_diffusion_gemma(str(path))
    with pytest.raises(ConfigError, match="not a DiffusionGemma"):
        get_backend("diffusion_gemma", str(path))


def test_backend_refuses_bad_options_before_loading(saved, monkeypatch):
    from transformers import DiffusionGemmaForBlockDiffusion

    from anchored_reasoning.backends import get_backend

    monkeypatch.setattr(DiffusionGemmaForBlockDiffusion, "from_pretrained",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    with pytest.raises(ConfigError, match="anchor_refresh_every=0"):
        get_backend("diffusion_gemma", str(saved[0]), anchor_refresh_every=0)
    with pytest.raises(ConfigError, match="does not fit"):
        get_backend("diffusion_gemma", str(saved[0]), split=[2, 20, 8])


def test_backend_through_run_eval_records_layer_calls(saved, tmp_path):
    from anchored_reasoning.backends import get_backend
    from anchored_reasoning.eval.runner import run_eval

    path, examples = saved
    records = {}
    for k in (1, 2):
        backend = get_backend("diffusion_gemma", str(path), steps=4, anchor_refresh_every=k)
        summary = run_eval("prosqa", backend, "cot", out_dir=tmp_path / f"k{k}", examples=examples, max_new_tokens=24,
                           progress=False)
        assert summary["accuracy"]["n"] == 2
        records[k] = [json.loads(line) for line in (tmp_path / f"k{k}" / "records.jsonl").read_text().splitlines()]
        assert len(records[k]) == 2 and all(0 < r["tokens"] <= 32 for r in records[k])
    base, stale = records[1][0]["meta"], records[2][0]["meta"]
    assert base["nfe"] == 8 and base["decoder_layer_calls"] == 8 * 6 and base["anchor_refresh_every"] is None
    assert stale["nfe"] == 8 and stale["anchor_refreshes"] == 4 and stale["anchor_refresh_every"] == 2
    assert stale["decoder_layer_calls"] < stale["base_decoder_layer_calls"] == base["decoder_layer_calls"]
    # seeded per row: the base model's completions come back the same on a second run
    backend = get_backend("diffusion_gemma", str(path), steps=4)
    again = run_eval("prosqa", backend, "cot", out_dir=tmp_path / "again", examples=examples, max_new_tokens=24,
                     progress=False)
    assert again["accuracy"]["n"] == 2
    assert [json.loads(x)["completion"] for x in (tmp_path / "again" / "records.jsonl").read_text().splitlines()] \
        == [r["completion"] for r in records[1]]


# -- the confidence-triggered refresh (the library's anchor_refresh_below, in DiffusionGemma's block loop) --
def test_confidence_rule_reads_the_previous_steps_prediction(model):
    tadm = TADMDiffusionGemma(model, anchor_refresh_every=100, anchor_refresh_below=0.5)
    logits = torch.full((1, 4, 5), -30.0)
    logits[0, :, 0] = torch.tensor([30.0, 30.0, 0.0, 0.0])  # positions 0, 1: token 0 for sure
    logits[0, 2, 1], logits[0, 3, 2], logits[0, 3, 3] = 2.0, 0.2, 0.0  # 2: token 1, p 0.88; 3: token 2, p 0.38
    settled = torch.tensor([[0, 0, 1, 2]])
    assert not tadm.hard_step(settled, logits)  # every canvas token is the prediction: nothing left to decide
    # position 2 renoised: the next decision is confident (0.88 >= 0.5)
    assert not tadm.hard_step(torch.tensor([[0, 0, 4, 2]]), logits)
    # only position 3 renoised: the next decision is a hard one (0.38 < 0.5)
    assert tadm.hard_step(torch.tensor([[0, 0, 1, 4]]), logits)
    # both renoised: the sampler decides the most confident first, so it is not hard
    assert not tadm.hard_step(torch.tensor([[0, 0, 4, 4]]), logits)
    # a batch refreshes when any row needs it
    assert tadm.hard_step(torch.tensor([[0, 0, 4, 2], [0, 0, 1, 4]]), logits.expand(2, -1, -1))


def test_confidence_refresh_in_generate(model):
    split = LayerSplit.proportional(6)
    ids = torch.randint(3, 300, (1, 5), generator=torch.Generator().manual_seed(3))
    torch.manual_seed(9)
    base = model.generate(ids, **GEN).sequences
    plain = TADMDiffusionGemma(model, None, split=split, anchor_refresh_every=6)
    torch.manual_seed(9)
    plain_out = plain.generate(ids, **GEN).sequences
    assert plain.counters.anchor_refreshes == 2 and plain.counters.confidence_refreshes == 0  # one per canvas
    # tau = 1: every step still has something to decide, so every step refreshes: the base model, token for token
    always = TADMDiffusionGemma(model, None, split=split, anchor_refresh_every=6, anchor_refresh_below=1.0)
    torch.manual_seed(9)
    assert torch.equal(always.generate(ids, **GEN).sequences, base)
    c = always.counters
    assert c.anchor_refreshes == c.nfe == 12 and c.confidence_refreshes == 10 and c.anchor_layer_calls == 12 * split.anchor
    assert not torch.equal(plain_out, base)  # the stale anchor mattered, so the equality above says something
    # tau near 0: no step is that unsure, so it is the plain K-periodic cache
    never = TADMDiffusionGemma(model, None, split=split, anchor_refresh_every=6, anchor_refresh_below=1e-9)
    torch.manual_seed(9)
    assert torch.equal(never.generate(ids, **GEN).sequences, plain_out) and never.counters.confidence_refreshes == 0
    assert always.describe()["anchor_refresh_below"] == 1.0


@pytest.mark.parametrize("tau", [0, -0.1, 1.5, "high", True])
def test_refresh_threshold_outside_zero_one_is_refused(model, saved, monkeypatch, tau):
    from transformers import DiffusionGemmaForBlockDiffusion

    from anchored_reasoning.backends import get_backend

    with pytest.raises(ConfigError, match="anchor_refresh_below"):
        TADMDiffusionGemma(model, anchor_refresh_every=3, anchor_refresh_below=tau)
    monkeypatch.setattr(DiffusionGemmaForBlockDiffusion, "from_pretrained",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    with pytest.raises(ConfigError, match="backend option anchor_refresh_below"):
        get_backend("diffusion_gemma", str(saved[0]), anchor_refresh_every=3, anchor_refresh_below=tau)


def test_a_fusion_folder_that_is_none_or_names_no_diffusion_gemma_is_refused_before_loading(model, saved, tmp_path,
                                                                                            monkeypatch):
    from transformers import DiffusionGemmaForBlockDiffusion

    from anchored_reasoning.backends import get_backend
    from anchored_reasoning.models.tadm_gemma import load_fusion
    from anchored_reasoning.testing import make_tiny_causal_lm

    llama = make_tiny_causal_lm(tmp_path / "llama")
    fusion = AnchorFusion.for_model(model, LayerSplit.proportional(6), seed=0)
    fusion.config.base_model = str(llama)
    fusion.save_pretrained(tmp_path / "fusion")
    monkeypatch.setattr(DiffusionGemmaForBlockDiffusion, "from_pretrained",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    with pytest.raises(ConfigError, match="not a TADM fusion"):
        load_fusion(str(saved[0]))
    with pytest.raises(ConfigError, match="not a TADM fusion"):
        get_backend("diffusion_gemma", str(saved[0]), fusion=str(llama))
    with pytest.raises(ConfigError, match="base model .*not a DiffusionGemma"):
        get_backend("diffusion_gemma", str(tmp_path / "fusion"))
