"""The tadm_gemma trainer (train/pipelines/tadm_gemma.py, train/trainers/tadm_gemma_trainer.py): only the
fusion trains, the post-training loss, the recipes
(dry runs, bad values before any model loads) and a 2-step run through `anchored-reasoning train`."""
import json

import pytest
import torch

torch.set_num_threads(1)

from anchored_reasoning.errors import ConfigError  # noqa: E402

TINY = {"hidden_size": 32, "num_layers": 6, "canvas_length": 8, "intermediate_size": 64}
SMALL = ["model.tiny.hidden_size=32", "model.tiny.canvas_length=8", "data.train.n=8", "training.denoising_steps=4",
         "training.per_device_train_batch_size=2", "training.logging_steps=1"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny saved DiffusionGemma, its frozen copy split for TADM, a fresh fusion and a few rows."""
    from anchored_reasoning.generators.prosqa import generate_dataset
    from anchored_reasoning.models.diffusion_gemma import load_diffusion_gemma, make_tiny_diffusion_gemma
    from anchored_reasoning.models.tadm_gemma import AnchorFusion, TADMDiffusionGemma
    from anchored_reasoning.train.data.tadm_gemma_data import example_rows

    examples = generate_dataset(8, seed=0, num_nodes=10, min_hops=2)
    path = make_tiny_diffusion_gemma(tmp_path_factory.mktemp("base") / "m", texts=[e.question for e in examples], **TINY)
    model, tok = load_diffusion_gemma(str(path))
    model.requires_grad_(False)
    tadm = TADMDiffusionGemma(model)
    rows = example_rows(examples, "prosqa", "cot", tok, 8, 128, seed=0)
    return model, tok, tadm, rows, lambda: AnchorFusion.for_model(model, tadm.split, fusion_dim=32, num_heads=2, seed=0)


def test_only_the_fusion_trains(setup, tmp_path):
    from datasets import Dataset

    from anchored_reasoning.train.trainers.tadm_gemma_trainer import TADMGemmaConfig, TADMGemmaTrainer
    from anchored_reasoning.train.data.tadm_gemma_data import ContextCanvasCollator

    model, tok, tadm, rows, new_fusion = setup
    fusion = new_fusion()
    base_before = {k: v.clone() for k, v in model.state_dict().items()}
    fusion_before = {k: v.clone() for k, v in fusion.state_dict().items()}
    args = TADMGemmaConfig(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=2, denoising_steps=4,
                           warmup_steps=1, learning_rate=1e-2, save_strategy="no", disable_tqdm=True,
                           logging_steps=1)
    assert (args.learning_rate, args.adam_beta1, args.adam_beta2) == (1e-2, 0.95, 0.99)  # the paper's betas by default
    assert args.lr_scheduler_kwargs == {"min_lr_rate": 0.1} and args.weight_decay == 1e-4
    trainer = TADMGemmaTrainer(model=fusion, args=args, train_dataset=Dataset.from_list(rows),
                               data_collator=ContextCanvasCollator(tok.pad_token_id), tadm=tadm)
    trainer.train()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in base_before.items())  # bitwise frozen
    changed = [k for k, v in fusion.state_dict().items() if not torch.equal(v, fusion_before[k])]
    assert "o_proj.weight" in changed  # the zero-initialised projection moved
    optimised = sum(p.numel() for g in trainer.optimizer.param_groups for p in g["params"])
    assert optimised == sum(p.numel() for p in fusion.parameters()) == 6 * 32 * 32 + 2 * 32
    assert {"ce", "kl", "rollout"} <= set(trainer.state.log_history[0])


def test_loss_with_a_fresh_anchor_and_untrained_fusion_has_zero_kl(setup):
    from anchored_reasoning.train.trainers.tadm_gemma_trainer import TADMGemmaConfig, posttrain_loss
    from anchored_reasoning.train.data.tadm_gemma_data import ContextCanvasCollator

    model, tok, tadm, rows, new_fusion = setup
    fusion = new_fusion()
    batch = ContextCanvasCollator(tok.pad_token_id)(rows[:3])
    cfg = TADMGemmaConfig(output_dir="/tmp/unused", rollout_choices=[0], rollout_probs=[1.0], denoising_steps=4)
    torch.manual_seed(0)
    parts = posttrain_loss(tadm, fusion, batch, cfg)
    assert parts["rollout"] == 0 and float(parts["kl"]) == 0.0 and float(parts["ce"]) > 0  # student == teacher
    cfg = TADMGemmaConfig(output_dir="/tmp/unused", rollout_choices=[2], rollout_probs=[1.0], denoising_steps=4)
    torch.manual_seed(0)
    parts = posttrain_loss(tadm, fusion, batch, cfg)
    assert parts["rollout"] == 2 and float(parts["kl"]) > 0  # a stale anchor departs from the teacher
    parts["loss"].backward()
    assert fusion.o_proj.weight.grad is not None and float(fusion.o_proj.weight.grad.abs().sum()) > 0


@pytest.mark.parametrize("recipe", ["tadm_gemma_tiny", "tadm_gemma_posttrain"])
def test_recipes_dry_run(recipe, capsys):
    from anchored_reasoning.cli import main

    assert main(["train", recipe, "--dry-run"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["trainer"] == "tadm_gemma"
    if recipe == "tadm_gemma_posttrain":  # the paper's settings
        t = shown["training"]
        assert (t["learning_rate"], t["adam_beta1"], t["adam_beta2"], t["weight_decay"], t["warmup_steps"]) == \
            (1.5e-4, 0.95, 0.99, 1e-4, 100)
        assert t["rollout_choices"] == [0, 1, 2] and t["rollout_probs"] == [0.34, 0.33, 0.33]
        assert t["self_conditioning_prob"] == 0.5 and shown["model"]["split"] == [2, 20, 8]
        m = shown["model"]
        assert (m["fusion_kind"], m["fusion_dim"], m["fusion_heads"]) == ("paired", 256, 4)  # appendix C.1


@pytest.mark.parametrize("override, message", [
    ("training.rollout_probs=[1.0]", r"training.rollout_probs=\[1.0\] must be one weight"),
    ("training.self_conditioning_prob=2", r"training.self_conditioning_prob=2 must be in \[0, 1\]"),
    ("training.learning_rate=abc", r"training.learning_rate='abc': expected"),
    ("model.fusion_dims=8", r"unknown recipe key 'model.fusion_dims'; did you mean 'fusion_dim'"),
    ("model.split=[1,2]", r"model.split=\[1, 2\] must be three integers"),
    ("model.name=x", r"exactly one of name .* or tiny"),
])
def test_bad_recipe_values_fail_before_anything_loads(override, message, tmp_path):
    from anchored_reasoning.train.pipelines.tadm_gemma import run

    with pytest.raises(ConfigError, match=message):
        run("tadm_gemma_tiny", [f"output_dir={tmp_path / 'out'}", override])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("override, message", [
    ("model.tiny.hidden_sise=8", r"unknown recipe key 'model.tiny.hidden_sise'; did you mean 'hidden_size'"),
    ("model.tiny=5", r"recipe key 'model.tiny' must be a mapping"),
    ("method.name=cot", r"unknown recipe key 'method'"),  # the method is data.method here
    ("data.train.genrator=prosqa", r"unknown recipe key 'data.train.genrator'; did you mean 'generator'"),
])
def test_recipe_keys_are_the_sections_dataclass(override, message, tmp_path):
    """The keys come from recipes.sections.TADMGemmaRecipe (one schema for every trainer kind)."""
    from anchored_reasoning.train.pipelines.tadm_gemma import TADMGemmaPipeline, run
    from anchored_reasoning.train.recipes.sections import RECIPES, key_tree

    assert TADMGemmaPipeline.kind in RECIPES and "fusion_dim" in key_tree("tadm_gemma")["model"]
    with pytest.raises(ConfigError, match=message):
        run("tadm_gemma_tiny", [f"output_dir={tmp_path / 'out'}", override])
    assert not (tmp_path / "out").exists()


def test_split_or_model_that_does_not_fit_fails_before_loading(tmp_path, monkeypatch):
    from transformers import DiffusionGemmaForBlockDiffusion

    from anchored_reasoning.testing import make_tiny_causal_lm
    from anchored_reasoning.train.pipelines.tadm_gemma import run

    monkeypatch.setattr(DiffusionGemmaForBlockDiffusion, "from_pretrained",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("weights loaded")))
    with pytest.raises(ConfigError, match=r"shared=2 \+ anchor=20 \+ denoiser=8 = 30 layers does not fit .* 6 decoder"):
        run("tadm_gemma_tiny", [f"output_dir={tmp_path / 'a'}", "model.split=[2,20,8]"])
    llama = make_tiny_causal_lm(tmp_path / "llama")
    with pytest.raises(ConfigError, match="model.name .* is a 'llama' checkpoint, not a DiffusionGemma"):
        run("tadm_gemma_tiny", [f"output_dir={tmp_path / 'b'}", "model.tiny=null", f"model.name={llama}"])
    assert not (tmp_path / "a" / "base").exists()


def test_tiny_recipe_trains_two_steps_through_the_cli_and_evaluates(tmp_path, capsys):
    from anchored_reasoning.backends import get_backend
    from anchored_reasoning.cli import main
    from anchored_reasoning.generators.prosqa import generate_dataset
    from anchored_reasoning.types import Prompt, SamplingSpec

    out = tmp_path / "run"
    args = ["train", "tadm_gemma_tiny", f"output_dir={out}", "training.max_steps=2", "training.save_steps=1", *SMALL]
    assert main(args) == 0
    assert f"checkpoint: {out}" in capsys.readouterr().out
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["global_steps"] == 2 and summary["split"] == {"shared": 1, "anchor": 3, "denoiser": 2}
    assert summary["fusion_parameters"] == 6 * 32 * 64 + 2 * 32 < summary["base_parameters"]
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "diffusion_gemma_anchor_fusion" and config["base_model"] == str((out / "base").resolve())
    assert (out / "checkpoint-2" / "model.safetensors").is_file()
    assert main(args) == 0  # a finished run: nothing to do
    assert json.loads((out / "train_summary.json").read_text())["session"] == 1

    backend = get_backend("diffusion_gemma", str(out), steps=4, anchor_refresh_every=3)
    assert backend.describe()["tadm"]["fusion"]["parameters"] == summary["fusion_parameters"]
    ex = generate_dataset(1, seed=5, num_nodes=10, min_hops=2)[0]
    [[completion]] = backend.generate([Prompt(ex.question)], SamplingSpec(max_new_tokens=16))
    assert completion.meta["nfe"] == 8 and completion.meta["anchor_refreshes"] == 2 * 2  # 2 canvases, ceil(4/3)
    assert completion.meta["fusion_calls"] == 8 and completion.meta["anchor_refresh_every"] == 3


def test_benchmark_task_and_its_canvas_scores():
    from benchmarks.tadm_gemma import FIRST_WORD, canvas_scores, task_rows

    rows = task_rows(6, words=10, canvas=5, seed=0)
    ctx = torch.tensor([r["context"] for r in rows])
    gold = torch.tensor([r["canvas"] for r in rows])
    valid, follow = canvas_scores(ctx, gold, 10)
    assert valid == [1.0] * 6 and follow == [1.0] * 6  # every gold canvas follows its one step
    start = FIRST_WORD + 3
    mixed = torch.tensor([[FIRST_WORD + 4, FIRST_WORD + 5, FIRST_WORD + 7, FIRST_WORD + 9, FIRST_WORD + 1]])  # s=1 twice, then s=2
    valid, follow = canvas_scores(torch.tensor([[FIRST_WORD - 1, start]]), mixed, 10)
    assert valid == [0.0] and follow == [2 / 5]
