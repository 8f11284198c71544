"""LoRA / QLoRA training (train/peft_setup.py): the recipe's ``peft:`` section is checked with the recipe, QLoRA and
missing target modules are refused before work starts, and under LoRA the anchoring format's new token rows
train while the base weights stay frozen (recipe path, Python API, GRPO). A tiny offline Llama, seconds."""
from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("peft", reason="the peft extra is not installed: pip install 'anchored-reasoning[peft]'")

from anchored_reasoning.errors import ConfigError  # noqa: E402
from anchored_reasoning.train import peft_setup, recipes  # noqa: E402

torch.set_num_threads(1)

SIZE = dict(num_nodes=6, min_hops=1, max_hops=2, neg_depth="any")
#: tiny_test (a from-scratch preset) turned into a fine-tune of the tiny Llama at ``model.name``
ON_LLAMA = ["model.preset=null", "model.tokenizer=null", "model.config=null", "training.curriculum=false",
            "method.options.remove_steps_per_stage=0", "training.generation_eval=false"]


@pytest.fixture(scope="module")
def examples():
    import anchored_reasoning as ar

    return ar.generate("prosqa", n=32, seed=0, **SIZE)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, examples):
    from anchored_reasoning.testing import make_tiny_causal_lm

    texts = [f"{ex.question} {' '.join(ex.steps)} {ex.answer}" for ex in examples]
    return make_tiny_causal_lm(tmp_path_factory.mktemp("tiny"), texts=texts, hidden_size=32, vocab_size=400)


# ---------------------------------------------------------------------------------------------
# the recipe section, checked before any work

def test_the_peft_section_names_unknown_keys_and_bad_values():
    with pytest.raises(ConfigError, match=r"unknown recipe key 'peft\.rank'.*"):
        recipes.resolve("tiny_test", ["peft.rank=8"])
    with pytest.raises(ConfigError, match=r"unknown recipe key 'peft\.lora_alpa'; did you mean 'lora_alpha'"):
        recipes.resolve("tiny_test", ["peft.lora_alpa=8"])
    with pytest.raises(ConfigError, match=r"peft\.r=0: expected an integer >= 1"):
        recipes.resolve("tiny_test", ["peft.r=0"])
    with pytest.raises(ConfigError, match=r"peft\.lora_dropout=1\.5: expected a number in \[0, 1\)"):
        recipes.resolve("tiny_test", ["peft.lora_dropout=1.5"])
    with pytest.raises(ConfigError, match=r"peft\.bnb_4bit_quant_type='nf5'.*did you mean 'nf4'"):
        recipes.resolve("tiny_test", ["peft.bnb_4bit_quant_type=nf5"])
    ok = recipes.resolve("tiny_test", ["peft.r=8", "peft.target_modules=[c_attn]", "peft.lora_alpha=1e1"])
    assert ok["peft"] == {"r": 8, "target_modules": ["c_attn"], "lora_alpha": 10.0}


def test_peft_on_a_diffusion_trainer_is_refused_naming_where_it_applies():
    with pytest.raises(ConfigError, match=r"'peft' \(LoRA\) applies to the ar and grpo trainers.*diffusion trainer"):
        recipes.resolve("diffusion_tiny_test", ["peft.r=4"], trainer="diffusion")
    with pytest.raises(ConfigError, match="starts from a diffusion checkpoint"):
        peft_setup.check_runtime({"r": 4}, diffusion=True)


def test_qlora_is_refused_before_any_data_loads(tmp_path, monkeypatch):
    from anchored_reasoning.train.pipelines import ar

    def no_data(*a, **k):
        raise AssertionError("data loaded before the QLoRA check")

    monkeypatch.setattr(ar, "load_split", no_data)
    real = peft_setup.importlib.util.find_spec
    with pytest.raises(ConfigError, match=r"load_in_4bit=true \(QLoRA\).*bitsandbytes.*not installed"):
        monkeypatch.setattr(peft_setup.importlib.util, "find_spec", lambda n: None if n == "bitsandbytes" else real(n))
        ar.run("tiny_test", ["peft.load_in_4bit=true", f"output_dir={tmp_path / 'a'}"])
    # with bitsandbytes importable but no CUDA device (this CPU): refused for the GPU
    monkeypatch.setattr(peft_setup.importlib.util, "find_spec", lambda n: object() if n == "bitsandbytes" else real(n))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"QLoRA\) needs a CUDA GPU.*peft\.load_in_4bit=false"):
        ar.run("tiny_test", ["peft.load_in_4bit=true", f"output_dir={tmp_path / 'b'}"])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_lora_without_the_peft_package_names_the_extra(monkeypatch):
    real = peft_setup.importlib.util.find_spec
    monkeypatch.setattr(peft_setup.importlib.util, "find_spec", lambda n: None if n == "peft" else real(n))
    with pytest.raises(ConfigError, match=r"needs the peft package: pip install 'anchored-reasoning\[peft\]'"):
        peft_setup.check_runtime({"r": 8})
    peft_setup.check_runtime(None)  # no section: a full fine-tune needs nothing


def test_a_target_module_the_model_lacks_is_refused_before_training(tiny, tmp_path, monkeypatch):
    from transformers import Trainer

    from anchored_reasoning.train.pipelines import ar

    monkeypatch.setattr(Trainer, "train", lambda *a, **k: pytest.fail("training started"))
    with pytest.raises(ConfigError, match=r"'c_attn' not in this llama model; its linear layers are: .*q_proj"):
        ar.run("tiny_test", [*ON_LLAMA, f"model.name={tiny}", "peft.target_modules=[q_proj,c_attn]",
                             f"output_dir={tmp_path}"])


# ---------------------------------------------------------------------------------------------
# the new tokens train, the base does not

def test_lora_acot_trains_the_anchor_rows_and_leaves_the_base_frozen(tiny, examples, tmp_path):
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anchored_reasoning import AnchoredSFTConfig, AnchoredSFTTrainer

    model, tok = AutoModelForCausalLM.from_pretrained(tiny), AutoTokenizer.from_pretrained(tiny)
    args = AnchoredSFTConfig(output_dir=str(tmp_path), max_steps=30, per_device_train_batch_size=8, learning_rate=3e-2,
                             lr_scheduler_type="constant", logging_steps=5, report_to=[], disable_tqdm=True,
                             save_strategy="no", num_anchor_slots=2)
    trainer = AnchoredSFTTrainer(model=model, processing_class=tok, method="acot", task="prosqa", args=args,
                                 train_dataset=examples, peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    peft_model = trainer.model
    ant, old = tok.convert_tokens_to_ids("[ANT]"), tok.convert_tokens_to_ids("Every")
    assert ant in peft_model.peft_config["default"].trainable_token_indices["model.embed_tokens"]  # added for the caller
    rows = lambda: peft_model.get_input_embeddings().weight.detach().clone()  # noqa: E731 - with the trained rows
    frozen = lambda: {n: p.detach().clone() for n, p in peft_model.named_parameters() if not p.requires_grad}  # noqa: E731
    before_rows, before_frozen = rows(), frozen()
    trainer.train()
    after_rows, after_frozen = rows(), frozen()
    assert not torch.equal(before_rows[ant], after_rows[ant])  # the [ANT] row trained
    assert torch.equal(before_rows[old], after_rows[old])  # an old token's row did not
    assert before_frozen.keys() == after_frozen.keys() and len(before_frozen) > 10
    assert all(torch.equal(before_frozen[n], after_frozen[n]) for n in before_frozen)  # no base weight moved
    anchor = [h["anchor_loss"] for h in trainer.state.log_history if "anchor_loss" in h]
    # the anchor loss fell at every logging step (a random tiny base learns slowly: 6.0 -> 5.87 in 30 steps)
    assert len(anchor) == 6 and all(b < a for a, b in zip(anchor, anchor[1:])) and anchor[-1] < anchor[0] - 0.05, anchor


@pytest.fixture(scope="module")
def lora_run(tiny, tmp_path_factory):
    from anchored_reasoning.train.pipelines import ar

    return ar.run("tiny_test", [*ON_LLAMA, f"model.name={tiny}", "peft.r=4", "training.max_steps=3",
                                f"output_dir={tmp_path_factory.mktemp('lora') / 'run'}"])


def test_the_recipe_path_trains_a_lora_adapter_with_the_new_token_rows(tiny, lora_run):
    from safetensors.torch import load_file

    out = lora_run
    assert (out / "adapter_config.json").is_file() and not (out / "model.safetensors").exists()
    weights = load_file(str(out / "adapter_model.safetensors"))
    delta = [k for k in weights if "trainable_tokens_delta" in k]
    assert delta and weights[delta[0]].shape == (6, 32)  # [BoA] [ANT] [EoA] [BoR] [EoR] [PAUSE], hidden 32
    assert any("lora_A" in k for k in weights)
    meta = json.loads((out / "anchored_reasoning.json").read_text())
    assert meta["method"] == "acot" and meta["peft"]["base_model"] == str(tiny)
    assert meta["peft"]["base"]["hidden_size"] == 32 and meta["peft"]["r"] == 4
    assert "q_proj" in meta["peft"]["target_modules"]  # all-linear, by layer name
    summary = json.loads((out / "train_summary.json").read_text())
    assert 0 < meta["peft"]["trainable_parameters"] < summary["parameters"] / 4


def test_an_untied_head_trains_the_new_rows_too():
    import tempfile

    from transformers import LlamaConfig, LlamaForCausalLM

    from anchored_reasoning.methods import get_method
    from anchored_reasoning.testing import train_tiny_tokenizer
    from anchored_reasoning.train.pipelines.method_setup import prepare_for_method

    with tempfile.TemporaryDirectory() as d:
        tok = train_tiny_tokenizer(d, texts=["Every wumpus is a tumpus."] * 20, vocab_size=300)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    method = get_method("acot", style="trained", k=2)
    prepare_for_method(model, tok, method.added_tokens, method.added_token_inits)
    cfg = peft_setup.lora_config({"r": 2, "target_modules": ["q_proj"]}, model, tok, method.added_tokens)
    assert set(cfg.trainable_token_indices) == {"model.embed_tokens", "lm_head"}
    wrapped = peft_setup.wrap(model, cfg)
    trained = [n for n, p in wrapped.named_parameters() if p.requires_grad]
    assert any("lm_head" in n and "trainable_tokens" in n for n in trained)
    assert wrapped.get_output_embeddings().bias is None  # what TRL's fused head reads


def test_grpo_takes_the_peft_section_and_starts_from_a_lora_sft_run(lora_run, tmp_path):
    from anchored_reasoning.train.pipelines import grpo

    out = grpo.run("grpo_tiny_test", [f"model.name={lora_run}", "peft.r=2", "peft.target_modules=[q_proj]",
                                      "training.max_steps=1", f"output_dir={tmp_path}"])
    assert (out / "adapter_config.json").is_file() and not (out / "model.safetensors").exists()
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 2 and config["target_modules"] == ["q_proj"]
    meta = json.loads((out / "anchored_reasoning.json").read_text())
    assert meta["method"] == "acot" and meta["peft"]["base_model"] == str(lora_run)  # the SFT adapter, merged


def test_grpo_from_python_with_a_lora_config_trains_the_new_token_rows(tmp_path):
    """``AnchoredGRPOTrainer(..., peft_config=LoraConfig(...))``: the format's new rows train (TRL's own wrapping
    would leave [ANT] & co. frozen at their initialisation), the base stays frozen."""
    import tempfile

    from datasets import Dataset
    from peft import LoraConfig
    from transformers import LlamaConfig, LlamaForCausalLM

    from anchored_reasoning.methods import get_method
    from anchored_reasoning.testing import train_tiny_tokenizer
    from anchored_reasoning.train.pipelines.method_setup import prepare_for_method
    from anchored_reasoning.train.trainers.grpo_trainer import AnchoredGRPOConfig, AnchoredGRPOTrainer

    with tempfile.TemporaryDirectory() as d:
        tok = train_tiny_tokenizer(d, texts=["Every wumpus is a tumpus."] * 20, vocab_size=300)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    method = get_method("acot", style="trained", k=2)
    prepare_for_method(model, tok, method.added_tokens, method.added_token_inits)
    new_ids = peft_setup.new_token_ids(tok, method.added_tokens)
    args = AnchoredGRPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, num_generations=2,
                              max_completion_length=4, gamma=0.0)
    trainer = AnchoredGRPOTrainer(model=model, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                                  args=args, train_dataset=Dataset.from_list([{"prompt": "Every wumpus is"}] * 4),
                                  processing_class=tok, peft_config=LoraConfig(r=2, target_modules=["q_proj"],
                                                                               task_type="CAUSAL_LM"),
                                  added_tokens=method.added_tokens)
    config = trainer.model.peft_config["default"]
    assert sorted(config.trainable_token_indices["model.embed_tokens"]) == new_ids and len(new_ids) >= 5
    trained = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert any("trainable_tokens" in n for n in trained) and any("lora_A" in n for n in trained)
    assert not any(n.endswith("embed_tokens.base_layer.weight") or "q_proj.base_layer" in n for n in trained)
