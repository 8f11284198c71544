"""TADM post-training on SFT data keeps the base model's fixed response window (training.response_length),
and the small-ProsQA recipes of benchmarks/tadm_speed.py --prosqa resolve and run."""
import json

import pytest
import torch

torch.set_num_threads(1)

SIZE = {"num_nodes": 7, "min_hops": 1, "max_hops": 2, "neg_depth": "any"}  # the recipes pin Coconut's draw


@pytest.fixture(scope="module")
def sft_adlm(tmp_path_factory):
    """A tiny ADLM SFT'd for 2 steps on small generated ProsQA with the benchmark's recipe."""
    from anchored_reasoning.train.pipelines import diffusion as dtrain

    out = tmp_path_factory.mktemp("prosqa") / "adlm"
    dtrain.run("diffusion_sft_prosqa_small_adlm", [
        f"output_dir={out}", "data.train.n=40", "training.max_steps=2", "training.per_device_train_batch_size=4",
        "model.config.hidden_size=32", "model.config.intermediate_size=64", "model.config.max_position_embeddings=256",
        "data.max_length=256", "model.tokenizer_vocab_size=300", "training.response_length=16"])
    return out


def test_posttrain_on_sft_rows_pads_every_response_to_the_window(sft_adlm, tmp_path, monkeypatch):
    from anchored_reasoning.train.pipelines import tadm as ttrain

    seen = []
    original = ttrain.TADMTrainer.compute_loss

    def spy(self, model, inputs, *args, **kwargs):
        labels, attention = inputs["labels"], inputs["attention_mask"]
        for row_labels, row_attention in zip(labels, attention):
            # labelled positions per row: the response, EOS-padded to the window
            seen.append((int((row_labels != -100).sum()), int(row_attention.sum())))
        return original(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(ttrain.TADMTrainer, "compute_loss", spy)
    out = ttrain.run("tadm_posttrain_prosqa_small", [
        f"output_dir={tmp_path / 'tadm'}", f"model.base={sft_adlm}", "data.train.n=40", "data.max_length=256",
        "training.max_steps=2", "training.per_device_train_batch_size=4", "training.response_length=16",
        "training.stale_sampling_steps=16"])
    assert seen and all(n == 16 for n, _ in seen), seen  # without the window: the batch's longest response (~13 tokens here)
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["objective"] == "posttrain" and summary["global_steps"] == 2
    assert 0 < summary["trainable_parameters"] < summary["parameters"]
    meta = json.loads((out / "anchored_reasoning.json").read_text())
    assert meta["method"] == "nocot" and meta["task"] == "prosqa"


def test_small_prosqa_recipes_use_the_demo_problem_size():
    from anchored_reasoning.train.pipelines.diffusion import resolve_recipe as sft_recipe
    from anchored_reasoning.train.pipelines.tadm import resolve_recipe as tadm_recipe

    sft = sft_recipe("diffusion_sft_prosqa_small_adlm")
    post = tadm_recipe("tadm_posttrain_prosqa_small")
    for recipe in (sft, post):
        assert recipe["data"]["train"]["params"] == SIZE
        assert recipe["method"]["name"] == "nocot"
    assert sft["model"]["arch"] == "adlm" and sft["training"]["anchored"] is True
    assert post["training"]["tadm_objective"] == "posttrain"
    assert post["training"]["response_length"] == sft["training"]["response_length"]
    assert post["training"]["stale_sampling_steps"] == sft["training"]["response_length"]


def test_the_benchmarks_timed_pass_grades_every_problem_and_reports_the_anchor_reuse(sft_adlm, tmp_path):
    """tadm_speed.prosqa_eval and diffusion_reasoning.evaluate share benchmarks.common.timed_pass: a
    fresh greedy pass that writes one record per problem and says how often the anchor was recomputed."""
    import argparse

    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from anchored_reasoning.eval.methods import build_method
    from anchored_reasoning.generators.prosqa import generate_dataset
    from benchmarks import diffusion_reasoning as dr
    from benchmarks import tadm_speed

    tok = AutoTokenizer.from_pretrained(sft_adlm)
    model = AutoModelForMaskedLM.from_pretrained(sft_adlm).eval()
    method = build_method(None, str(sft_adlm))
    examples = generate_dataset(3, seed=5, split="t", **SIZE)
    args = argparse.Namespace(prosqa_gen_length=16, prosqa_eval_batch=2, window=16, eval_batch=2)
    with torch.no_grad():
        every, secs = tadm_speed.prosqa_eval(model, tok, method, examples, 1, tmp_path / "k1", args)
        cached, _ = tadm_speed.prosqa_eval(model, tok, method, examples, 4, tmp_path / "k4", args)
        summary, correct, _ = dr.evaluate(model, tok, method, examples, {"anchor_refresh_every": 4}, tmp_path / "dr", args)
    assert every["accuracy"]["n"] == cached["accuracy"]["n"] == 3 and secs > 0
    assert every["anchor_refresh_fraction"] is None  # K = 1: no anchor cache at all
    assert 0 < cached["anchor_refresh_fraction"] < 1.0
    assert len(correct) == 3 and summary["accuracy"]["mean"] == sum(correct) / 3
    assert summary["anchor_refresh_fraction"] == cached["anchor_refresh_fraction"]
