"""benchmarks/train_throughput on a two-example batch: the three sides (ACoT trainer, TRL SFTTrainer, plain loop) each
take real optimizer steps, and the JSON holds their step times, tokens/s and ratios."""
from __future__ import annotations

import json

import torch

from benchmarks.train_throughput import build, main


def test_every_side_trains_and_the_json_holds_the_ratios(tmp_path):
    acot, trl, (plain, opt), acot_batch, lm_batch = build(2, tmp_path / "w")
    before = [p.detach().clone() for p in plain.parameters()]
    plain(**lm_batch).loss.backward()
    opt.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, plain.parameters()))
    assert set(lm_batch) == {"input_ids", "attention_mask", "labels"} and "anchor_labels" in acot_batch
    out = tmp_path / "t.json"
    assert main(["--batch-size", "2", "--repeats", "2", "--work", str(tmp_path / "w2"), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["step_ms_median"]) == {"acot", "trl_sft", "plain"}
    assert set(result["ratios_median_of_pairs"]) == {"acot_over_trl_sft", "acot_over_plain", "trl_sft_over_plain"}
    assert result["machine"]["threads"] >= 1 and result["batch"]["tokens"] > 0
