"""The diffusion forced choice (eval.choice.masked_choice), the AR-initialised starts (models.ar_init.build_start,
the logic-*-shift aliases) and the diffusion reasoning benchmark's pooling (benchmarks/diffusion_reasoning.py)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from anchored_reasoning.eval.choice import masked_choice
from anchored_reasoning.generators.prosqa import generate_dataset, ladder_size
from anchored_reasoning.models.ar_init import build_start
from anchored_reasoning.models.assets import LOGIC_SHIFT_DIR
from benchmarks import diffusion_reasoning as bench


@pytest.fixture(scope="module")
def problems():
    return generate_dataset(60, seed=4242, split="t", **ladder_size(1))


@pytest.fixture(scope="module")
def shifted_mdlm():
    model, tok, copied = build_start("mdlm", "ar", init_from=LOGIC_SHIFT_DIR, shift_logits=True, seed=0)
    return model.eval(), tok, copied


class Oracle(torch.nn.Module):
    """Puts all its mass at every position on one option of the problem it is asked (the right or the wrong one)."""

    def __init__(self, tok, examples, right: bool):
        super().__init__()
        self.tok, self.right = tok, right
        self.metas = [ex.meta for ex in examples]

    def forward(self, input_ids):
        text = self.tok.decode(input_ids[0])
        meta = next(m for m in self.metas if any(f"Is {m['entity']} a {x} or {y}?" in text for x, y in (
            (m["answer_concept"], m["neg_concept"]), (m["neg_concept"], m["answer_concept"]))))
        word = meta["answer_concept"] if self.right else meta["neg_concept"]
        logits = torch.zeros(1, input_ids.shape[1], len(self.tok))
        logits[..., self.tok(" " + word, add_special_tokens=False)["input_ids"][0]] = 10.0
        return type("Out", (), {"logits": logits})()


def test_masked_choice_reads_the_masked_object(shifted_mdlm, problems):
    _, tok, _ = shifted_mdlm
    assert masked_choice(Oracle(tok, problems, right=True), tok, problems) == 1.0
    assert masked_choice(Oracle(tok, problems, right=False), tok, problems) == 0.0


def test_the_ar_lookup_carries_over_only_with_the_output_shift(shifted_mdlm, problems):
    """Zero-shot, before any diffusion training: the AR-initialised MDLM with both shifts picks the
    answer well above chance; without the output shift the copied head is one position off."""
    model, tok, copied = shifted_mdlm
    unshifted = build_start("mdlm", "ar", init_from=LOGIC_SHIFT_DIR, shift_logits=False, seed=0)[0].eval()
    with_shift, without = masked_choice(model, tok, problems), masked_choice(unshifted, tok, problems)
    assert copied > 40
    assert with_shift >= 0.6, with_shift
    assert with_shift >= without + 0.1, (with_shift, without)


def test_masked_choice_refuses_what_it_cannot_score(shifted_mdlm, problems):
    model, tok, _ = shifted_mdlm
    bare = dataclasses.replace(problems[0], meta={})
    with pytest.raises(ValueError, match="entity"):
        masked_choice(model, tok, [bare])
    with pytest.raises(ValueError, match="cot"):
        masked_choice(model, tok, problems, method="pause")


def test_build_start_copies_the_anchor_network_and_seeds_the_rest():
    a0, _, n = build_start("adlm", "ar", init_from=LOGIC_SHIFT_DIR, shift_logits=True, seed=0)
    a1, _, _ = build_start("adlm", "ar", init_from=LOGIC_SHIFT_DIR, shift_logits=True, seed=1)
    assert n > 40 and a0.config.shift_logits and a0.config.token_shift
    assert torch.equal(a0.anchor.layers[0].qkv.weight, a1.anchor.layers[0].qkv.weight)  # copied from the AR model
    assert not torch.equal(a0.denoiser.layers[0].qkv.weight, a1.denoiser.layers[0].qkv.weight)  # fresh, seeded
    with pytest.raises(ValueError, match="arch"):
        build_start("gpt", "ar")


def fake_seed(seed: int, correct: dict[str, list[bool]], tps: dict[str, float]) -> dict:
    return {"seed": seed, "held_out_ids": [f"p{i}" for i in range(len(next(iter(correct.values()))))],
            "rows": {k: {"accuracy": sum(v) / len(v), "no_answer": 0, "correct": v, "tokens_per_s": tps[k]}
                     for k, v in correct.items()},
            "forced_choice": {"mdlm": 0.7, "adlm": 0.6}, "budget": {}, "settings": {}, "command": "x", "date": "2026-12-02",
            "machine": "cpu"}


def test_aggregate_pools_seeds_and_checks_the_goal():
    n = 40
    names = ["mdlm:1", "adlm:1"] + [f"tadm:{k}" for k in bench.KS] + [f"adlm_stale:{k}" for k in bench.KS[1:]] \
        + [f"tadm_m:{k}" for k in bench.KS] + ["mdlm_block4:none", "mdlm_block4:prefix"]
    base = [i % 2 == 0 for i in range(n)]  # 0.5
    better = [True] * n
    correct = {k: base for k in names}
    correct["mdlm:1"] = better
    tps = {k: 100.0 for k in names}
    tps["tadm:3"] = 160.0
    tps["tadm_m:3"], tps["mdlm_block4:prefix"] = 120.0, 250.0
    correct["tadm_m:3"] = [True] * (n - 2) + [False] * 2  # 0.95 against the MDLM's 1.0
    out = bench.aggregate([fake_seed(0, correct, tps), fake_seed(1, correct, tps)])
    assert out["table"]["mdlm:1"]["accuracy"] == 1.0 and out["table"]["adlm:1"]["accuracy"] == 0.5
    assert out["table"]["adlm:1"]["vs_chance"] == "at" and out["table"]["mdlm:1"]["vs_chance"] == "above"
    t = next(t for t in out["paired_tests"] if t["a"] == "adlm:1" and t["b"] == "mdlm:1")
    assert t["diff"] == -0.5 and t["ci95"][1] < 0 and all(p < 1e-3 for p in t["mcnemar_p_per_seed"])
    g = out["goal_check"]["adlm_tadm"]
    assert g["speedup"] == pytest.approx(1.6) and g["speed_met"] and g["accuracy_within_1_point"]
    assert g["reference_vs_chance"] == "at"  # the accuracy part says nothing when the reference is at chance
    m = out["goal_check"]["mdlm_tadm"]
    assert m["speedup"] == pytest.approx(1.2) and not m["speed_met"]
    assert m["accuracy_diff"] == pytest.approx(-0.05) and not m["accuracy_within_1_point"]
    assert out["table"]["mdlm_block4:prefix"]["speedup_vs_uncached"] == pytest.approx(2.5)
    assert any(t["a"] == "mdlm_block4:prefix" and t["b"] == "mdlm_block4:none" for t in out["paired_tests"])
    other = fake_seed(2, correct, tps)
    other["held_out_ids"][0] = "elsewhere"
    with pytest.raises(ValueError, match="different problems"):
        bench.aggregate([fake_seed(0, correct, tps), other])


def test_the_shifted_start_aliases_build_once_and_load(tmp_path, monkeypatch, problems):
    from transformers import AutoModelForMaskedLM

    from anchored_reasoning.models.zoo import resolve_model

    monkeypatch.setenv("ANCHORED_REASONING_CACHE", str(tmp_path))
    path = resolve_model("logic-mdlm-shift")
    assert path.startswith(str(tmp_path)) and resolve_model("logic-mdlm-shift") == path
    model = AutoModelForMaskedLM.from_pretrained(path).eval()
    ref, tok, _ = build_start("mdlm", "ar", init_from=LOGIC_SHIFT_DIR, shift_logits=True, seed=0)
    assert model.config.shift_logits and model.config.token_shift == ref.config.token_shift
    ids = tok(problems[0].question, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, ref.eval()(input_ids=ids).logits)


def test_diffusion_sft_on_a_space_joined_backbone_warns_of_newline_steps(tmp_path, monkeypatch, caplog):
    """The diffusion backbones were pretrained on logic-gpt2's documents (steps joined by a space): their cards
    say so, the logic-*-shift starts carry logic-gpt2-shift's, and diffusion SFT that leaves a multi-step CoT at
    the newline default is warned before any model is built; setting the option silences it."""
    import json
    import logging

    from anchored_reasoning.train.data.logic_text import STEP_SEPARATOR
    from anchored_reasoning.train.pipelines.diffusion import run
    from anchored_reasoning.train.data.separator import backbone_step_separator

    monkeypatch.setenv("ANCHORED_REASONING_CACHE", str(tmp_path / "cache"))
    for alias in ("logic-mdlm", "logic-adlm", "logic-mdlm-shift"):
        assert backbone_step_separator(alias) == STEP_SEPARATOR == " ", alias
    card = json.loads((tmp_path / "cache" / "models" / "logic-mdlm-shift" / "backbone.json").read_text())
    assert card["init_from"] == "logic-gpt2-shift" and "MDLM" in card["what"]

    base = ["model.name=logic-mdlm", "model.tokenizer=logic-mdlm", "model.preset=null", "model.config=null",
            "data.train.params.min_hops=3", "data.train.params.max_hops=3", "data.train.n=8", "data.valid=null",
            "training.max_steps=1", "training.per_device_train_batch_size=4"]
    with caplog.at_level(logging.WARNING, logger="anchored_reasoning.train.pipelines.diffusion"):
        run("diffusion_sft_prosqa_mdlm", [f"output_dir={tmp_path / 'newline'}", *base])
    warned = [r.getMessage() for r in caplog.records if "step_separator" in r.getMessage()]
    assert len(warned) == 1 and "'logic-mdlm'" in warned[0] and "step_separator to ' '" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="anchored_reasoning.train.pipelines.diffusion"):
        run("diffusion_sft_prosqa_mdlm", [f"output_dir={tmp_path / 'space'}", *base, 'method.options={step_separator: " "}'])
    assert not [r for r in caplog.records if "step_separator" in r.getMessage()]
