"""DiffusionBackend: the eval runner's backend for masked diffusion LMs."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from anchored_reasoning.errors import BackendError, ConfigError
from anchored_reasoning.types import Prompt, SamplingSpec

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from anchored_reasoning.testing import train_tiny_tokenizer

    return train_tiny_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=300)


class Scripted(nn.Module):
    """A 'diffusion model' that predicts a fixed continuation: position P+i -> script[i] (then EOS).
    Lets the tests know exactly what any sampler must produce."""

    def __init__(self, script: list[int], eos: int, mask: int, vocab: int, max_len: int = 64):
        super().__init__()
        self.script, self.eos, self.vocab = script, eos, vocab
        self.config = type("C", (), {"mask_token_id": mask, "max_position_embeddings": max_len})()
        self.dummy = nn.Parameter(torch.zeros(1))
        self.prompt_len: int | None = None
        self.calls = 0

    def forward(self, input_ids, attention_mask=None):
        self.calls += 1
        b, l = input_ids.shape
        logits = torch.full((b, l, self.vocab), -10.0)
        start = self.prompt_len
        for pos in range(start, l):
            i = pos - start
            tgt = self.script[i] if i < len(self.script) else self.eos
            logits[:, pos, tgt] = 10.0 - 0.01 * i  # earlier positions slightly more confident
        return type("O", (), {"logits": logits})()


def backend_for(tok, text: str, prompt: str, **opts):
    from anchored_reasoning.backends.diffusion import DiffusionBackend

    script = tok(text, add_special_tokens=False)["input_ids"]
    model = Scripted(script, tok.eos_token_id, tok.mask_token_id, len(tok), max_len=opts.pop("max_len", 64))
    model.prompt_len = len(tok(prompt)["input_ids"])
    return DiffusionBackend(model, tokenizer=tok, device="cpu", **opts), model


@pytest.mark.parametrize("sampler", ["low_confidence", "threshold", "ancestral", "remdm", "random"])
def test_every_sampler_reproduces_the_scripted_text_and_cuts_at_eos(tok, sampler):
    prompt = "Question: what is 2 + 2?\n"
    backend, _ = backend_for(tok, "The answer is 4.", prompt, sampler=sampler, steps=16, block_length=8)
    [[c]] = backend.generate([Prompt(prompt)], SamplingSpec(max_new_tokens=24))
    assert c.text == "The answer is 4."
    assert c.n_tokens == len(tok("The answer is 4.", add_special_tokens=False)["input_ids"])
    assert c.finish_reason == "stop" and c.seconds >= 0


def test_completions_carry_nfe_and_tokens_per_forward(tok):
    """Each completion's meta counts its batch's model calls (NFE) and tokens per forward (TPF); the
    threshold sampler decodes several confident positions per call, so its TPF exceeds one-per-step's."""
    from anchored_reasoning.eval.report import summarize

    prompt = "Question: what is 2 + 2?\n"
    one, model = backend_for(tok, "The answer is 4.", prompt, sampler="low_confidence", steps=16)
    [[c]] = one.generate([Prompt(prompt), Prompt(prompt)], SamplingSpec(max_new_tokens=16))[:1]
    assert c.meta["nfe"] == c.meta["batch_nfe"] == model.calls == 16 and c.meta["batch_rows"] == 2
    assert c.meta["decoded_tokens"] == 16 and c.meta["tokens_per_forward"] == 1.0
    fast, model = backend_for(tok, "The answer is 4.", prompt, sampler="threshold", threshold=0.5, steps=16)
    [[t]] = fast.generate([Prompt(prompt)], SamplingSpec(max_new_tokens=16))
    assert t.text == c.text and t.meta["nfe"] == model.calls < 16
    assert t.meta["tokens_per_forward"] == pytest.approx(t.meta["decoded_tokens"] / t.meta["nfe"]) and t.meta["tokens_per_forward"] > 1
    records = [{"id": str(i), "sample": 0, "correct": True, "tokens": x.n_tokens, "meta": x.meta} for i, x in enumerate([c, t])]
    den = summarize(records)["denoiser"]
    assert den["nfe_mean"] == (16 + t.meta["nfe"]) / 2 and den["samples"] == 2
    assert den["tokens_per_forward"] == pytest.approx(32 / (16 + t.meta["nfe"]))
    assert "denoiser" not in summarize([{"id": "a", "sample": 0, "correct": True, "tokens": 3}])


def test_stop_strings_cut_text_and_token_count(tok):
    prompt = "Question: what?\n"
    backend, _ = backend_for(tok, "Step one. ### 4 and more", prompt, steps=24)
    [[c]] = backend.generate([Prompt(prompt)], SamplingSpec(max_new_tokens=24, stop=["###"]))
    assert c.text == "Step one. " and c.finish_reason == "stop"
    full = tok("Step one. ### 4 and more", add_special_tokens=False)["input_ids"]
    assert 0 < c.n_tokens < len(full)
    assert "###" in tok.decode(full[: c.n_tokens]) and "###" not in tok.decode(full[: c.n_tokens - 1])


def test_no_eos_in_window_is_length_finish(tok):
    prompt = "Question: what?\n"
    backend, _ = backend_for(tok, "a b c d e f g h i j k l m n o p", prompt, steps=8)
    [[c]] = backend.generate([Prompt(prompt)], SamplingSpec(max_new_tokens=8))
    assert c.finish_reason == "length" and c.n_tokens == 8


def test_n_samples_and_gen_length_cap(tok):
    prompt = "Question: what?\n"
    backend, _ = backend_for(tok, "The answer is 4.", prompt, gen_length=12, steps=12)
    out = backend.generate([Prompt(prompt), Prompt(prompt)], SamplingSpec(max_new_tokens=100, n=3))
    assert [len(x) for x in out] == [3, 3]
    assert backend.sampler_config(backend.window(5, SamplingSpec(max_new_tokens=100)), SamplingSpec(), 0).gen_length == 12
    assert backend.window(5, SamplingSpec(max_new_tokens=6)) == 6


def test_too_long_prompts_are_errors_or_documented_shrink(tok):
    prompt = "Question: what is two plus two, please tell me?\n"
    n = len(tok(prompt)["input_ids"])
    backend, _ = backend_for(tok, "4", prompt, max_len=n + 4)
    with pytest.raises(BackendError, match="exceeds the model's context"):
        backend.generate([Prompt(prompt)], SamplingSpec(max_new_tokens=8))
    shrink, _ = backend_for(tok, "4", prompt, max_len=n + 4, fit="shrink")
    [[c]] = shrink.generate([Prompt(prompt)], SamplingSpec(max_new_tokens=8))
    assert c.text == "4"
    full, _ = backend_for(tok, "4", prompt, max_len=n, fit="shrink")
    with pytest.raises(BackendError, match="fills the model's whole context"):
        full.generate([Prompt(prompt)], SamplingSpec(max_new_tokens=8))
    # truncate keeps the prompt's last tokens; the scripted model then starts its answer right after them
    trunc, model = backend_for(tok, "4", prompt, max_len=n, fit="truncate")
    model.prompt_len = n - 4
    [[c]] = trunc.generate([Prompt(prompt)], SamplingSpec(max_new_tokens=4))
    assert c.text == "4" and c.finish_reason == "stop"
    with pytest.raises(BackendError, match="leaves no room"):
        trunc.generate([Prompt(prompt)], SamplingSpec(max_new_tokens=n + 1))


def test_sampled_rows_do_not_depend_on_the_batch(tok, tmp_path):
    from anchored_reasoning.backends.diffusion import DiffusionBackend
    from anchored_reasoning.models import MDLM, MDLMConfig

    torch.manual_seed(0)
    model = MDLM(MDLMConfig.from_preset("tiny", vocab_size=len(tok), mask_token_id=tok.mask_token_id,
                                        hidden_size=32, num_attention_heads=2, intermediate_size=64))
    backend = DiffusionBackend(model, tokenizer=tok, sampler="ancestral", steps=8, device="cpu")
    spec = SamplingSpec(max_new_tokens=8, temperature=1.0, n=2, seed=3)
    a = backend.generate([Prompt("Question: one?\n"), Prompt("Question: two, longer prompt?\n")], spec)
    b = backend.generate([Prompt("Question: two, longer prompt?\n")], spec)
    assert [c.text for c in a[1]] == [c.text for c in b[0]]
    assert backend.describe()["sampler"] == "ancestral"
    json.dumps(backend.describe())


def test_bad_options(tok):
    from anchored_reasoning.backends.diffusion import DiffusionBackend

    model = Scripted([], tok.eos_token_id, tok.mask_token_id, len(tok))
    with pytest.raises(ConfigError, match="unknown option"):
        DiffusionBackend(model, tokenizer=tok, temprature=1.0)
    with pytest.raises(ConfigError, match="remasking"):
        DiffusionBackend(model, tokenizer=tok, sampler="beam")
    with pytest.raises(ConfigError, match="needs tokenizer"):
        DiffusionBackend(model)
    with pytest.raises(ConfigError, match="fit"):
        DiffusionBackend(model, tokenizer=tok, fit="cut")


@pytest.mark.slow
def test_prosqa_sft_then_runner_end_to_end(tmp_path):
    """A tiny ADLM fine-tuned (ANELBO) on generated ProsQA, evaluated through the runner, resumed."""
    from anchored_reasoning.backends import get_backend
    from anchored_reasoning.eval.methods import build_method
    from anchored_reasoning.eval.records import load_records
    from anchored_reasoning.eval.runner import run_eval
    from anchored_reasoning.train.data.data_sources import generate_examples
    from anchored_reasoning.train.pipelines.diffusion import run

    ckpt = run("diffusion_tiny_test", [f"output_dir={tmp_path / 'ckpt'}", "training.max_steps=20",
                                       "data.train.n=128", "training.per_device_train_batch_size=16",
                                       "training.learning_rate=3.0e-3"])
    backend = get_backend("diffusion", str(ckpt), sampler="low_confidence", steps=32, block_length=16, batch_size=4)
    assert backend.gen_length == 48  # the response window it was fine-tuned with (anchored_reasoning.json)
    method = build_method(None, ckpt)
    assert method.name == "cot"
    examples = generate_examples("prosqa", 6, 99, {"num_nodes": 6, "min_hops": 1, "max_hops": 2}, split="heldout")
    out = tmp_path / "eval"
    summary = run_eval("prosqa", backend, method, out_dir=out, examples=examples, max_new_tokens=48, progress=False)
    assert summary["counts"]["samples"] == 6 and summary["backend"] == "diffusion"
    records = load_records(out / "records.jsonl")
    assert len(records) == 6
    assert all(r["prompt"].endswith("[BoR]") and r["tokens"] <= 48 for r in records)
    # (whether 20 steps teach it anything is not the point here; tests/test_diffusion_trainer.py checks learning)
    assert all((r["tokens"] == 0) == (r["completion"] == "") and r["finish_reason"] in ("stop", "length") for r in records)
    assert all(1 <= r["meta"]["nfe"] <= 32 and r["meta"]["batch_rows"] <= 4 for r in records)
    assert summary["denoiser"]["samples"] == 6 and summary["denoiser"]["tokens_per_forward"] > 0
    again = run_eval("prosqa", backend, method, out_dir=out, examples=examples, max_new_tokens=48, progress=False)
    assert len(load_records(out / "records.jsonl")) == 6 and again["accuracy"] == summary["accuracy"]
