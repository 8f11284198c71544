"""The paper's paired-attention fusion (models/tadm_fusion.py, ``fusion_kind: paired``): the identity at a
fresh anchor (untrained and trained), a correction only where the canvas changed, the cached sampler passing
C0, training only the fusion, folders that keep their kind, and a bad kind refused before loading."""
import json

import pytest
import torch

torch.set_num_threads(1)

from anchored_reasoning.errors import ConfigError  # noqa: E402
from anchored_reasoning.models.diffusion_gemma import LayerSplit, paper_generation_kwargs  # noqa: E402
from anchored_reasoning.models.tadm_fusion import (  # noqa: E402
    AnchorFusion,
    PairedAnchorFusion,
    fusion_parameters,
    load_fusion,
    make_fusion,
    paired_parameters,
)
from anchored_reasoning.models.tadm_gemma import TADMDiffusionGemma  # noqa: E402

GEN = dict(max_new_tokens=32, **paper_generation_kwargs(6))  # 2 canvases of 16, 6 steps each
SPLIT = LayerSplit.proportional(6)


@pytest.fixture(scope="module")
def model():
    from transformers import DiffusionGemmaForBlockDiffusion

    from anchored_reasoning.models.diffusion_gemma import tiny_diffusion_gemma_config

    torch.manual_seed(0)
    return DiffusionGemmaForBlockDiffusion(tiny_diffusion_gemma_config(300)).eval()


def _perturbed(model, seed=1):
    """A paired fusion with every weight random and non-zero (W_up and the mixer included), gates open."""
    fusion = make_fusion(model, SPLIT, fusion_kind="paired", fusion_dim=32, num_heads=4, seed=0)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in fusion.parameters():
            p.normal_(std=0.1)
        fusion.gate_bias.fill_(2.0)
    return fusion


def _generate(model, runner, ids, seed):
    torch.manual_seed(seed)
    return runner.generate(ids, **GEN).sequences


def test_paired_fusion_starts_as_the_identity_with_the_papers_init_and_size(model):
    fusion = make_fusion(model, SPLIT, fusion_kind="paired", fusion_dim=32, num_heads=4, seed=0)
    assert isinstance(fusion, PairedAnchorFusion) and fusion.config.fusion_kind == "paired"
    assert float(fusion.up_proj.weight.detach().abs().sum()) == 0.0 and float(fusion.gate_bias.detach()) == -3.0
    assert float(fusion.current_proj.weight.detach().abs().sum()) > 0  # the rest is random
    d = model.config.get_text_config().hidden_size
    assert fusion_parameters(fusion) == paired_parameters(d, 32) == 3 * d * 32 + 15 * 32 * 32 + 32 + 1
    assert paired_parameters(2816, 256) == 3_145_985  # DiffusionGemma-26B's hidden size: the paper's ~3.1M
    c, c0, h0 = torch.randn(3, 2, 16, d).unbind(0)
    assert torch.equal(fusion(c, h0, c0), h0)  # W_up = 0: H0 whatever the canvas did


def test_trained_paired_fusion_is_exact_at_a_fresh_anchor_and_corrects_a_stale_one(model):
    fusion = _perturbed(model)
    d = model.config.get_text_config().hidden_size
    c, c0, h0 = torch.randn(3, 2, 16, d, generator=torch.Generator().manual_seed(3)).unbind(0)
    assert torch.equal(fusion(c0, h0, c0), h0)  # C == C0 => M == 0 => H0 exactly
    assert torch.equal(fusion(c0.clone(), h0, c0), h0)  # equal values, not just the same tensor
    moved = fusion(c, h0, c0)
    assert not torch.equal(moved, h0) and float((moved - h0).abs().max()) > 1e-3
    changed = c0.clone()
    changed[:, 5] = c[:, 5]  # one position of the canvas changed: the correction reaches the others by attention
    out = fusion(changed, h0, c0)
    assert float((out - h0)[:, 5].abs().max()) > 0 and float((out - h0)[:, 0].abs().max()) > 0
    with pytest.raises(ConfigError, match="paired fusion needs anchor_current"):
        fusion(c, h0)
    assert torch.equal(fusion(c.bfloat16(), h0.bfloat16(), c.bfloat16()), h0.bfloat16())  # cast back to H0's dtype


def test_paired_fusion_at_k1_is_the_base_model_untrained_and_trained(model):
    ids = torch.randint(3, 300, (2, 9), generator=torch.Generator().manual_seed(2))
    base = _generate(model, model, ids, 5)
    for fusion in (make_fusion(model, SPLIT, fusion_kind="paired", fusion_dim=32, num_heads=4, seed=0), _perturbed(model)):
        tadm = TADMDiffusionGemma(model, fusion, anchor_refresh_every=1)
        assert torch.equal(_generate(model, tadm, ids, 5), base)
        assert tadm.counters.fusion_calls == tadm.counters.anchor_refreshes == 12
    assert tadm.describe()["fusion"]["kind"] == "paired"
    # a stale anchor: the trained fusion corrects it (C != C0), so it departs from naive stale reuse
    naive = _generate(model, TADMDiffusionGemma(model, None, split=SPLIT, anchor_refresh_every=3), ids, 5)
    stale = TADMDiffusionGemma(model, _perturbed(model), anchor_refresh_every=3)
    assert not torch.equal(_generate(model, stale, ids, 5), naive) and stale.counters.anchor_refreshes == 4


def test_only_the_paired_fusion_trains(tmp_path):
    from datasets import Dataset

    from anchored_reasoning.generators.prosqa import generate_dataset
    from anchored_reasoning.models.diffusion_gemma import load_diffusion_gemma, make_tiny_diffusion_gemma
    from anchored_reasoning.train.data.tadm_gemma_data import ContextCanvasCollator, example_rows
    from anchored_reasoning.train.trainers.tadm_gemma_trainer import TADMGemmaConfig, TADMGemmaTrainer

    examples = generate_dataset(8, seed=0, num_nodes=10, min_hops=2)
    path = make_tiny_diffusion_gemma(tmp_path / "m", texts=[e.question for e in examples], hidden_size=32, num_layers=6,
                                     canvas_length=8, intermediate_size=64)
    model, tok = load_diffusion_gemma(str(path))
    model.requires_grad_(False)
    tadm = TADMDiffusionGemma(model)
    fusion = make_fusion(model, tadm.split, fusion_kind="paired", fusion_dim=16, num_heads=4, seed=0)
    base_before = {k: v.clone() for k, v in model.state_dict().items()}
    fusion_before = {k: v.clone() for k, v in fusion.state_dict().items()}
    args = TADMGemmaConfig(output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=2,
                           denoising_steps=4, warmup_steps=1, learning_rate=1e-2, save_strategy="no", disable_tqdm=True,
                           rollout_choices=[2], rollout_probs=[1.0])  # a stale anchor at every step: M != 0
    trainer = TADMGemmaTrainer(model=fusion, args=args, data_collator=ContextCanvasCollator(tok.pad_token_id), tadm=tadm,
                               train_dataset=Dataset.from_list(example_rows(examples, "prosqa", "cot", tok, 8, 128, seed=0)))
    trainer.train()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in base_before.items())  # bitwise frozen
    changed = {k for k, v in fusion.state_dict().items() if not torch.equal(v, fusion_before[k])}
    assert {"up_proj.weight", "current_proj.weight", "q_proj.weight", "gate_in.weight"} <= changed
    optimised = sum(p.numel() for g in trainer.optimizer.param_groups for p in g["params"])
    assert optimised == fusion_parameters(fusion) == paired_parameters(32, 16)


def test_a_fusion_folder_keeps_its_kind_and_an_old_one_loads_as_attention(model, tmp_path):
    paired = _perturbed(model)
    paired.save_pretrained(tmp_path / "paired")
    assert json.loads((tmp_path / "paired" / "config.json").read_text())["fusion_kind"] == "paired"
    loaded = load_fusion(str(tmp_path / "paired"))
    assert isinstance(loaded, PairedAnchorFusion) and not loaded.training
    assert all(torch.equal(v, paired.state_dict()[k]) for k, v in loaded.state_dict().items())
    assert float(loaded.gate_bias.detach()) == 2.0  # the saved value, not the init's -3
    AnchorFusion.for_model(model, SPLIT, seed=0).save_pretrained(tmp_path / "old")
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    del config["fusion_kind"]  # a folder written before the paired kind existed
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    old = load_fusion(str(tmp_path / "old"))
    assert type(old) is AnchorFusion and old.config.fusion_kind == "attention"


def test_a_bad_fusion_kind_is_refused_before_anything_loads(model, tmp_path, monkeypatch):
    from anchored_reasoning.train.pipelines.tadm_gemma import run

    with pytest.raises(ConfigError, match=r"recipe key model.fusion_kind='pairs' is no fusion kind; use one of attention, paired"):
        run("tadm_gemma_tiny", [f"output_dir={tmp_path / 'out'}", "model.fusion_kind=pairs"])
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="fusion_kind='cross' is no fusion kind"):
        make_fusion(model, SPLIT, fusion_kind="cross")
    AnchorFusion.for_model(model, SPLIT, seed=0).save_pretrained(tmp_path / "f")
    config = json.loads((tmp_path / "f" / "config.json").read_text())
    (tmp_path / "f" / "config.json").write_text(json.dumps({**config, "fusion_kind": "cross"}))
    monkeypatch.setattr(AnchorFusion, "from_pretrained", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    with pytest.raises(ConfigError, match="fusion_kind='cross' is no fusion kind"):
        load_fusion(str(tmp_path / "f"))
