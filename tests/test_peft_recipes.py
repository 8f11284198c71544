"""The GPU LoRA recipes (train/gsm8k_qwen25_{acot,cot}_lora.yaml) run as written on a CPU, with a tiny Qwen2 config
standing in for Qwen2.5-0.5B-Instruct, fp32 instead of bf16 and a few GSM8K-shaped problems: the recipe validates,
the adapter trains the format's new token rows, and the folder evaluates."""
from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("peft", reason="the peft extra is not installed: pip install 'anchored-reasoning[peft]'")

from anchored_reasoning.types import Example  # noqa: E402

torch.set_num_threads(1)

#: what a CPU changes in the GPU recipe: the model, fp32, two steps, a small validation
CPU = ["model.dtype=null", "training.bf16=false", "training.max_steps=2", "training.effective_batch_size=4",
       "training.per_device_train_batch_size=4", "training.generation_eval_samples=2",
       "training.generation_max_new_tokens=4", "training.generation_eval_steps=1", "training.curriculum_min_steps_per_stage=1",
       "training.warmup_steps=0", "training.save_every_minutes=null"]


def problems(n: int, offset: int = 0) -> list[Example]:
    out = []
    for i in range(offset, offset + n):
        a, b, c = 3 + i, 5 + 2 * i, 1 + i % 3
        out.append(Example(id=f"q{i}", question=f"Tom has {a} apples and buys {b} more. He eats {c}. How many are left?",
                           answer=str(a + b - c), steps=[f"{a} + {b} = {a + b}", f"{a + b} - {c} = {a + b - c}"],
                           meta={"task": "gsm8k"}))
    return out


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from anchored_reasoning.testing import train_tiny_tokenizer

    out = tmp_path_factory.mktemp("qwen2")
    texts = [f"{ex.question} {' '.join(ex.steps)} {ex.answer}" for ex in problems(40)]
    tok = train_tiny_tokenizer(out, texts=texts, vocab_size=300)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(out)
    return out


@pytest.mark.parametrize("recipe", ["gsm8k_qwen25_acot_lora", "gsm8k_qwen25_cot_lora"])
def test_the_gpu_lora_recipe_runs_on_a_cpu_with_a_small_qwen2(recipe, tiny_qwen2, tmp_path):
    from anchored_reasoning.train import recipes
    from anchored_reasoning.train.pipelines import ar

    resolved = recipes.resolve(recipe, [])
    assert resolved["model"]["name"] == "Qwen/Qwen2.5-0.5B-Instruct" and resolved["training"]["bf16"] is True
    assert resolved["peft"] == {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": "all-linear",
                                "train_new_tokens": True}
    out = ar.run_with_examples(recipe, problems(16), problems(2, offset=100),
                               [*CPU, f"model.name={tiny_qwen2}", f"output_dir={tmp_path / 'run'}"])
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 16 and set(config["trainable_token_indices"]) == {"model.embed_tokens"}
    meta = json.loads((out / "anchored_reasoning.json").read_text())
    assert meta["peft"]["base"]["model_type"] == "qwen2" and meta["task"] == "gsm8k"
    assert meta["method"] == recipe.split("_")[2]
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["global_steps"] == 2 and list((out / "validation").glob("step-*/records.jsonl"))
