"""TADM: fusion identity at init, exact K = 1 caching for every sampler, ceil(T/K) anchor calls and the
layer-call cost formula, frozen backbone under post-training, T-ANELBO learning, checkpoints, trainer."""
import json
import math

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.models import ADLM, ADLMConfig, MDLM, MDLMConfig, TADM, TADMConfig
from anchored_reasoning.objectives_tadm import (
    BUDGET_CHOICES, draw_budgets, draw_staleness, posttrain_loss, remask_to, stale_perplexity_bound, stale_times, t_anelbo,
)
from anchored_reasoning.objectives import LogLinearSchedule, perplexity_bound
from anchored_reasoning.sampling import REMASKING, AnchorCacheModelFn, SamplerConfig, sample

torch.set_num_threads(1)
V, MASK, EOS = 30, 3, 2


def tadm(seed=0, **kw):
    torch.manual_seed(seed)
    sizes = dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, max_position_embeddings=64,
                 shared_layers=1, num_hidden_layers=2, denoiser_layers=1)
    return TADM(TADMConfig.from_preset("tiny", vocab_size=V, mask_token_id=MASK, **{**sizes, **kw})).eval()


def base(cls, seed=0, layers=4):
    torch.manual_seed(seed)
    cfg = (ADLMConfig if cls is ADLM else MDLMConfig).from_preset(
        "tiny", vocab_size=V, mask_token_id=MASK, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        max_position_embeddings=64, num_hidden_layers=layers)
    return cls(cfg).eval()


def perturb_fusion(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.fusion.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model


def noisy(b=3, l=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(4, V, (b, l), generator=g)
    return torch.where(torch.rand(b, l, generator=g) < 0.5, torch.full_like(x, MASK), x)


def test_fusion_at_initialisation_returns_the_cached_anchor_unchanged():
    model = tadm(fusion_variant="residual")
    f = model.fusion
    assert torch.all(f.gate.bias == -3.0) and torch.all(f.delta_out.weight == 0) and torch.all(f.delta_out.bias == 0)
    assert f.delta_in.weight.abs().sum() > 0 and f.gate.weight.abs().sum() > 0  # the rest is really initialised
    assert f.norm_out is None and f.delta_in.out_features == 32  # residual: no output norm, d-wide MLP
    g = torch.Generator().manual_seed(0)
    c, h = torch.randn(2, 7, 32, generator=g), torch.randn(2, 7, 32, generator=g) * 5
    assert torch.equal(f(c, h), h)
    # a stale anchor goes through D unchanged: denoise(stale) == D(h) without fusion
    z_old, z_new = noisy(seed=1), noisy(seed=2)
    with torch.no_grad():
        anchor = model.anchor_forward(z_old)
        assert torch.equal(model.denoise(anchor, z_new), model.denoise(anchor, z_new, fuse=False))
        perturb_fusion(model)
        assert not torch.equal(model.denoise(anchor, z_new), model.denoise(anchor, z_new, fuse=False))
        model.fusion.reset_to_identity()
        assert torch.equal(model.denoise(anchor, z_new), model.denoise(anchor, z_new, fuse=False))


def test_published_fusion_is_the_papers_module():
    """Appendix C.2: u = [LN c; LN h]; delta = W2 GELU(W1 u + b1) + b2 with W1: 2d -> 4d, W2: 4d -> d
    zero-initialised; g = sigmoid(Wg u + bg) per position and dimension; h~ = LN(h + g * delta)."""
    model = tadm()  # the default variant
    assert model.config.fusion_variant == "published"
    f = model.fusion
    assert (f.delta_in.in_features, f.delta_in.out_features) == (64, 128)  # 2d -> 4d
    assert (f.delta_out.in_features, f.delta_out.out_features) == (128, 32)  # 4d -> d
    assert (f.gate.in_features, f.gate.out_features) == (64, 32)  # a gate per hidden dimension
    assert torch.all(f.delta_out.weight == 0) and torch.all(f.delta_out.bias == 0)
    g = torch.Generator().manual_seed(0)
    c, h = torch.randn(2, 7, 32, generator=g), torch.randn(2, 7, 32, generator=g) * 5 + 2
    # zero last projection: at initialisation the output is the output LayerNorm of the stale anchor, whatever c
    with torch.no_grad():
        at_init = f(c, h)
        assert torch.equal(at_init, f.norm_out(h)) and torch.equal(f(c * 3 + 1, h), at_init)
        assert torch.allclose(at_init, torch.nn.functional.layer_norm(h, (32,), eps=1e-5), atol=1e-6)
        perturb_fusion(model)
        u = torch.cat([torch.nn.functional.layer_norm(c, (32,), f.norm_c.weight, f.norm_c.bias, 1e-5),
                       torch.nn.functional.layer_norm(h, (32,), f.norm_h.weight, f.norm_h.bias, 1e-5)], -1)
        delta = f.delta_out(torch.nn.functional.gelu(f.delta_in(u)))
        want = torch.nn.functional.layer_norm(h + torch.sigmoid(f.gate(u)) * delta, (32,), f.norm_out.weight,
                                              f.norm_out.bias, 1e-5)
        assert torch.allclose(f(c, h), want, atol=1e-5)
    assert tadm(fusion_size=48).fusion.delta_in.out_features == 48  # fusion_size still overrides the width
    with pytest.raises(ValueError, match="fusion_variant"):
        tadm(fusion_variant="attention")


def test_a_checkpoint_saved_before_the_variant_existed_loads_as_residual(tmp_path):
    model = perturb_fusion(tadm(fusion_variant="residual"))
    z_old, z = noisy(seed=4), noisy(seed=5)
    with torch.no_grad():
        ref = model(z, anchor_input_ids=z_old).logits
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg.pop("fusion_variant") == "residual"
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # as the checkpoints written before the key
    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert loaded.config.fusion_variant == "residual" and loaded.fusion.norm_out is None
    with torch.no_grad():
        assert torch.equal(loaded(z, anchor_input_ids=z_old).logits, ref)
    published = tadm()
    published.save_pretrained(tmp_path / "p")
    assert AutoModelForMaskedLM.from_pretrained(tmp_path / "p").config.fusion_variant == "published"


@pytest.mark.parametrize("source,shared", [(ADLM, 0), (ADLM, 1), (MDLM, 0), (MDLM, 1)])
def test_built_from_a_trained_model_it_equals_that_model_and_only_fusion_trains(source, shared):
    src = base(source)
    model = TADM.from_diffusion_model(src, shared_layers=shared).eval()
    z = noisy()
    with torch.no_grad():
        assert torch.equal(model(z).logits, src(z).logits)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(n.startswith("fusion.") for n in trainable)
    c = model.config
    assert c.shared_layers + c.num_hidden_layers + c.num_denoiser_layers == 4 + (src.config.num_denoiser_layers if source is ADLM else 0)


@pytest.mark.parametrize("scale", ["relative", "absolute"])
def test_relative_fusion_corrects_by_a_share_of_h_whatever_its_size(scale):
    """fusion_scale="relative": the correction is proportional to |h| (Phi(c, 8 h) - 8 h ==
    8 (Phi(c, h) - h)); "absolute" (the default) adds the same correction whatever |h| is. Both start
    as the identity (the residual variant: the published one's output LayerNorm rescales everything)."""
    model = tadm(fusion_scale=scale, fusion_variant="residual")
    f = model.fusion
    c, h = torch.randn(2, 5, 32), torch.randn(2, 5, 32)
    assert torch.equal(f(c, h), h)  # identity at initialisation
    perturb_fusion(model)
    with torch.no_grad():
        small, big = f(c, h) - h, f(c, 8 * h) - 8 * h
    assert small.abs().max() > 0
    torch.testing.assert_close(big, 8 * small if scale == "relative" else small, rtol=1e-3, atol=1e-3)


def test_bad_sizes_are_clear_errors():
    with pytest.raises(ValueError, match="anchor_bottleneck"):
        tadm(anchor_bottleneck="softmax")
    with pytest.raises(ValueError, match="fusion_scale"):
        tadm(fusion_scale="log")
    with pytest.raises(ConfigError, match="shared_layers=4"):
        TADM.from_diffusion_model(base(ADLM), shared_layers=4)
    with pytest.raises(ConfigError, match="cannot split"):
        TADM.from_diffusion_model(base(MDLM), shared_layers=2, anchor_layers=2)
    with pytest.raises(ConfigError, match="anchor_refresh_every"):
        SamplerConfig(anchor_refresh_every=0)


@pytest.mark.parametrize("remasking", REMASKING)
def test_k1_gives_bit_identical_samples_to_the_uncached_path(remasking):
    prompt = torch.randint(4, V, (2, 3), generator=torch.Generator().manual_seed(3))
    cfg = SamplerConfig(remasking=remasking, steps=12, gen_length=12, block_length=6, temperature=1.0, seed=7,
                        threshold=0.2)
    # a TADM with a trained-looking (non-identity) fusion: cached K = 1 == plain forward
    model = perturb_fusion(tadm())
    plain, s_plain = sample(model, prompt, cfg)
    k1 = AnchorCacheModelFn(model, refresh_every=1)
    cached, s_cached = sample(model, prompt, cfg, model_fn=k1)
    assert torch.equal(plain, cached) and s_plain.revealed_per_step == s_cached.revealed_per_step
    assert k1.anchor_calls == k1.calls == s_cached.nfe
    via_config, _ = sample(model, prompt, cfg.replace(anchor_refresh_every=1))
    assert torch.equal(plain, via_config)
    # a TADM built from an ADLM, at K = 1, samples exactly what the ADLM samples
    adlm = base(ADLM)
    ref, _ = sample(adlm, prompt, cfg)
    built = TADM.from_diffusion_model(adlm, shared_layers=1).eval()
    out, _ = sample(built, prompt, cfg, model_fn=AnchorCacheModelFn(built, refresh_every=1))
    assert torch.equal(ref, out)


class LayerCounter:
    """Counts forward calls of each stage's transformer blocks and of the anchor network as a whole."""

    def __init__(self, model):
        self.layers = {name: 0 for name in ("shared", "anchor", "denoiser")}
        self.anchor_net = 0
        self.handles = []
        for name, blocks in model.stage_blocks().items():
            for block in blocks:
                self.handles.append(block.register_forward_hook(lambda *_, n=name: self._bump(n)))
        self.handles.append(model.anchor.register_forward_hook(lambda *_: self._net()))

    def _bump(self, name):
        self.layers[name] += 1

    def _net(self):
        self.anchor_net += 1

    def close(self):
        for h in self.handles:
            h.remove()


@pytest.mark.parametrize("remasking", REMASKING)
@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
def test_anchor_network_runs_ceil_t_over_k_times(remasking, k):
    model = tadm(shared_layers=1, num_hidden_layers=3, denoiser_layers=2)
    prompt = torch.randint(4, V, (2, 2), generator=torch.Generator().manual_seed(0))
    cfg = SamplerConfig(remasking=remasking, steps=10, gen_length=10, temperature=1.0, seed=1, threshold=0.5,
                        anchor_refresh_every=k)
    counter = LayerCounter(model)
    try:
        _, stats = sample(model, prompt, cfg)
    finally:
        counter.close()
    t = stats.nfe
    assert t >= 1
    if remasking in ("low_confidence", "random"):
        assert t == cfg.steps  # one model call per step
    assert counter.anchor_net == math.ceil(t / k)
    assert counter.layers == {"shared": t * 1, "anchor": math.ceil(t / k) * 3, "denoiser": t * 2}
    assert sum(counter.layers.values()) == model.config.layer_calls(t, k)


def test_refresh_step_runs_s_once():
    model = tadm(shared_layers=2)
    counter = LayerCounter(model)
    with torch.no_grad():
        model(noisy())
    counter.close()
    assert counter.layers["shared"] == 2  # S's output is reused by the denoiser on the same tokens


def test_stale_anchor_draws_follow_the_forward_process():
    k, age = draw_staleness(4000, (1, 2, 4, 8), torch.Generator().manual_seed(0))
    assert set(k.tolist()) == {1, 2, 4, 8} and torch.all(age < k) and torch.all(age >= 0)
    assert abs(float((age == 0).float().mean()) - (1 + 1 / 2 + 1 / 4 + 1 / 8) / 4) < 0.03
    t = torch.full((4000,), 0.3)
    t_stale = stale_times(t, age, steps=10)
    assert torch.allclose(t_stale, (0.3 + age / 10).clamp(max=1.0))
    sched = LogLinearSchedule()
    g = torch.Generator().manual_seed(1)
    x = torch.randint(4, V, (4000, 16), generator=g)
    z = torch.where(torch.rand(x.shape, generator=g) < sched.mask_prob(t).reshape(-1, 1), torch.full_like(x, MASK), x)
    eligible = torch.ones_like(x, dtype=torch.bool)
    z_stale = remask_to(z, t, t_stale, MASK, eligible, sched, g)
    assert torch.all(z_stale[z == MASK] == MASK), "a stale sequence keeps every mask of the current one"
    assert torch.equal(z_stale[age == 0], z[age == 0])
    unchanged = (z_stale != MASK)
    assert torch.equal(z_stale[unchanged], x[unchanged])
    for a in (1, 3, 7):  # the marginal mask rate at t' is p(t')
        rows = age == a
        want = float(sched.mask_prob(torch.tensor(min(1.0, 0.3 + a / 10))))
        assert abs(float((z_stale[rows] == MASK).float().mean()) - want) < 0.03


def test_budgets_are_drawn_per_row_and_set_the_stale_time():
    """The paper: T ~ {128, ..., 4096}, t' = min(1, t + k / T) with the row's own T."""
    assert BUDGET_CHOICES == (128, 256, 512, 1024, 2048, 4096)
    budget = draw_budgets(6000, BUDGET_CHOICES, torch.Generator().manual_seed(0))
    assert set(budget.tolist()) == set(BUDGET_CHOICES)
    assert all(abs(float((budget == b).float().mean()) - 1 / 6) < 0.03 for b in BUDGET_CHOICES)
    t, age = torch.full((4,), 0.5), torch.tensor([0, 3, 7, 7])
    assert torch.allclose(stale_times(t, age, torch.tensor([128, 128, 4096, 8])), torch.tensor([0.5, 0.5 + 3 / 128,
                                                                                               0.5 + 7 / 4096, 1.0]))
    with pytest.raises(ConfigError, match="budget_choices"):
        draw_budgets(4, [128, 0])
    model = tadm().train()
    x = torch.randint(4, V, (64, 8), generator=torch.Generator().manual_seed(1))
    drawn = t_anelbo(model, x, generator=torch.Generator().manual_seed(2), budget_choices=(16, 4096))
    assert set(drawn.budget.tolist()) == {16, 4096}
    fixed = t_anelbo(model, x, generator=torch.Generator().manual_seed(2), sampling_steps=16)
    assert set(fixed.budget.tolist()) == {16}
    # the budget reaches the stale anchor: with every cache age 7, T = 1 masks everything, T = 10**6 nothing more
    seen = {}

    def spy(input_ids, attention_mask=None, anchor_input_ids=None):
        seen["stale"] = anchor_input_ids
        return model(input_ids=input_ids, attention_mask=attention_mask, anchor_input_ids=anchor_input_ids)

    spy.config = model.config
    age7 = torch.full((64,), 7)
    t_anelbo(spy, x, age=age7, t=torch.full((64,), 0.3), sampling_steps=1, generator=torch.Generator().manual_seed(3))
    assert torch.all(seen["stale"] == MASK)
    t_anelbo(spy, x, age=age7, t=torch.full((64,), 0.3), budget_choices=(10**6,), generator=torch.Generator().manual_seed(3))
    assert 0 < float((seen["stale"] == MASK).float().mean()) < 0.5


def test_stale_perplexity_bound_k1_is_the_plain_bound_and_staleness_is_measured():
    model = perturb_fusion(tadm())
    x = torch.randint(4, V, (6, 16), generator=torch.Generator().manual_seed(2))
    plain = perplexity_bound(model, x, num_t_samples=4, seed=3)
    k1 = stale_perplexity_bound(model, x, refresh_every=1, num_t_samples=4, seed=3, sampling_steps=8)
    assert k1.nelbo == pytest.approx(plain.nelbo, rel=1e-6)
    k8 = stale_perplexity_bound(model, x, refresh_every=8, num_t_samples=4, seed=3, sampling_steps=8)
    assert k8.nelbo != k1.nelbo


def test_posttraining_leaves_the_frozen_weights_untouched():
    model = TADM.from_diffusion_model(base(ADLM), shared_layers=1)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)  # every parameter, on purpose
    g = torch.Generator().manual_seed(0)
    x = torch.randint(4, V, (4, 16), generator=g)
    rollouts = set()
    for _ in range(4):
        loss = posttrain_loss(model, x, sampling_steps=8, generator=g)
        rollouts.add(loss.rollout)
        opt.zero_grad()
        loss.loss.backward()
        opt.step()
    after = model.state_dict()
    for key, value in before.items():
        if key.startswith("fusion."):
            continue
        assert torch.equal(value, after[key]), f"frozen weight {key} changed"
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("fusion.")), "fusion did not train"
    assert rollouts <= {0, 1, 2}


def test_posttrain_loss_parts():
    model = TADM.from_diffusion_model(base(ADLM), shared_layers=0)
    x = torch.randint(4, V, (4, 16), generator=torch.Generator().manual_seed(0))
    out = posttrain_loss(model, x, sampling_steps=8, rollout=0, generator=torch.Generator().manual_seed(1))
    # k = 0 and an identity fusion: the student is the teacher, so the KL is 0
    assert float(out.kl.detach().abs()) < 1e-5 and float(out.loss.detach()) == pytest.approx(float(out.nelbo.detach()), abs=1e-5)
    out2 = posttrain_loss(model, x, sampling_steps=8, rollout=2, generator=torch.Generator().manual_seed(1))
    assert out2.rollout == 2 and float(out2.kl.detach()) >= 0
    with pytest.raises(ConfigError, match="rollout"):
        posttrain_loss(model, x, sampling_steps=2, rollout_choices=(2,))


def test_t_anelbo_decreases_on_a_tiny_corpus():
    torch.manual_seed(0)
    model = tadm().train()
    g = torch.Generator().manual_seed(0)
    # a tiny corpus with structure: each row alternates two random tokens (a masked token is a copy)
    a, b = torch.randint(4, V, (64, 1), generator=g), torch.randint(4, V, (64, 1), generator=g)
    corpus = torch.where(torch.arange(16) % 2 == 0, a, b)

    def evaluate():
        with torch.no_grad():
            return float(t_anelbo(model, corpus, gamma=3e-3, generator=torch.Generator().manual_seed(123),
                                  sampling_steps=16).loss)

    first = evaluate()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for i in range(80):
        batch = corpus[(i * 16) % 64:(i * 16) % 64 + 16]
        loss = t_anelbo(model, batch, gamma=3e-3, generator=g, sampling_steps=16)
        opt.zero_grad()
        loss.loss.backward()
        opt.step()
    last = evaluate()
    assert last < 0.85 * first, (first, last)
    assert loss.age is not None and loss.anchor_loss is not None


def test_t_anelbo_gamma_needs_the_logits_bottleneck():
    model = tadm(anchor_bottleneck="hidden")
    x = torch.randint(4, V, (2, 8))
    t_anelbo(model, x, gamma=0.0)  # self-supervised works
    with pytest.raises(ConfigError, match="anchor_logits"):
        t_anelbo(model, x, gamma=3e-3)


def test_save_and_from_pretrained_round_trip(tmp_path):
    model = perturb_fusion(tadm(fusion_size=48))
    z_old, z = noisy(seed=4), noisy(seed=5)
    with torch.no_grad():
        ref = model(z, anchor_input_ids=z_old).logits
    model.save_pretrained(tmp_path)
    assert type(AutoConfig.from_pretrained(tmp_path)) is TADMConfig
    for auto in (AutoModelForMaskedLM, AutoModel):
        loaded = auto.from_pretrained(tmp_path).eval()
        assert type(loaded) is TADM and loaded.config.fusion_size == 48
        with torch.no_grad():
            assert torch.equal(loaded(z, anchor_input_ids=z_old).logits, ref)
    from anchored_reasoning.sampling import load_masked_diffusion_model

    assert type(load_masked_diffusion_model(str(tmp_path))) is TADM  # the eval backend's loader: native, not wrapped


# ------------------------------------------------------------------------------------ trainer
@pytest.fixture(scope="module")
def corpus_and_base(tmp_path_factory):
    from anchored_reasoning.train.pipelines.diffusion import build_tokenizer

    root = tmp_path_factory.mktemp("tadm")
    words = "the cat sat on a mat while seven red birds flew over the quiet river near an old mill".split()
    g = torch.Generator().manual_seed(0)
    lines = [" ".join(words[i] for i in torch.randint(0, len(words), (12,), generator=g).tolist()) for _ in range(300)]
    text = root / "corpus.txt"
    text.write_text("\n".join(lines) + "\n")
    tok = build_tokenizer({"tokenizer": "train", "tokenizer_vocab_size": 300}, lines, root / "tok")
    torch.manual_seed(0)
    adlm = ADLM(ADLMConfig.from_preset("tiny", vocab_size=len(tok), mask_token_id=tok.mask_token_id, pad_token_id=tok.pad_token_id,
                                       eos_token_id=tok.eos_token_id, hidden_size=32, intermediate_size=64,
                                       num_attention_heads=2, max_position_embeddings=64, num_hidden_layers=2))
    adlm.save_pretrained(root / "adlm")
    tok.save_pretrained(root / "adlm")
    return text, root / "adlm"


def test_posttrain_recipe_trains_only_the_fusion(corpus_and_base, tmp_path):
    from anchored_reasoning.train import get_trainer

    text, adlm_dir = corpus_and_base
    out = get_trainer("tadm")("tadm_posttrain_tiny", [
        f"output_dir={tmp_path / 'post'}", f"model.base={adlm_dir}", "model.shared_layers=1", f"data.text_file={text}",
        f"data.valid_text_file={text}", "data.seq_len=32", "data.ppl_max_blocks=4", "data.ppl_refresh_every=[1,3]",
        "training.max_steps=3", "training.per_device_train_batch_size=4", "training.stale_sampling_steps=8",
        "training.logging_steps=1"])
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["objective"] == "posttrain" and summary["global_steps"] == 3
    assert set(summary["valid_perplexity_bound"]) == {"K=1", "K=3"}
    assert 0 < summary["trainable_parameters"] < summary["parameters"]
    assert any("kl" in row for row in summary["log_history"])
    src = ADLM.from_pretrained(adlm_dir)
    trained = AutoModelForMaskedLM.from_pretrained(out)
    assert isinstance(trained, TADM)
    copy = TADM.from_diffusion_model(src, shared_layers=1)
    after = trained.state_dict()
    for key, value in copy.state_dict().items():
        if not key.startswith("fusion."):
            assert torch.equal(value, after[key]), key
    assert not torch.equal(copy.fusion.delta_out.weight, trained.fusion.delta_out.weight)


def test_pretrain_recipe_runs_and_validates_keys(corpus_and_base, tmp_path):
    from anchored_reasoning.train.pipelines.tadm import resolve_recipe, run

    text, _ = corpus_and_base
    with pytest.raises(ConfigError, match="stale_k_choice"):
        resolve_recipe("tadm_pretrain_tiny", ["training.stale_k_choice=[1]"])
    out = run("tadm_pretrain_tiny", [
        f"output_dir={tmp_path / 'pre'}", f"data.text_file={text}", "data.valid_text_file=null", "data.seq_len=32",
        "model.config.max_position_embeddings=64", "model.tokenizer_vocab_size=300", "training.max_steps=2",
        "training.per_device_train_batch_size=4"])
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["objective"] == "t_anelbo" and summary["layers"] == {"shared": 1, "anchor": 3, "denoiser": 1}
    assert any("mean_cache_age" in row for row in summary["log_history"])
    with pytest.raises(ConfigError, match="model.base"):
        run("tadm_pretrain_tiny", [f"output_dir={tmp_path / 'bad'}", "training.tadm_objective=posttrain",
                                   f"data.text_file={text}"])
