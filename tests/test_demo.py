"""The demo end to end at a tiny budget (seconds of training per method): outputs exist and are well-formed."""
from __future__ import annotations

import json
import math

import pytest

from anchored_reasoning import demo

pytestmark = pytest.mark.slow


def test_demo_runs_end_to_end_at_a_tiny_budget(tmp_path, monkeypatch, capsys):
    import torch

    torch.set_num_threads(1)
    data = __import__("os").environ.get("ANCHORED_REASONING_DATA")
    out = tmp_path / "demo"
    from anchored_reasoning.cli import main

    argv = ["demo", "--out", str(out), "--budget-minutes", "0.2", "--train-n", "200", "--eval-n", "12", "--real-n", "6",
            "--threads", "1"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| method |" in printed and "| acot |" in printed

    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["methods"]) == demo.DEMO_METHODS
    for name, r in summary["methods"].items():
        g = r["generated"]
        assert g["n"] == 12, name
        assert sorted(g["by_hops"]) == ["1", "2", "3"] and sum(h["n"] for h in g["by_hops"].values()) == 12
        pr = r["probe"]
        assert pr["swapped"]["n"] == 12 and 0.0 <= pr["flip_rate"]["mean"] <= 1.0
        assert set(pr["by_hops"]) == {"1", "2", "3"}
        assert 0.0 <= g["accuracy"] <= 1.0
        assert g["mean_generated_tokens"] > 0 and not math.isnan(g["mean_generated_tokens"])
        assert r["steps"] >= 1
        assert (out / name / "model" / "anchored_reasoning.json").is_file()
        assert (out / name / "eval_generated" / "records.jsonl").is_file()
        meta = json.loads((out / name / "model" / "anchored_reasoning.json").read_text())
        assert meta["method"] == name and meta["task"] == "prosqa"
        if name == "anchor_chain":  # the written anchors: the search's nodes with its back-ups marked
            assert meta["method_options"]["revisits"] is True and meta["method_options"]["mark_backups"] is True
        if data:
            assert r["real_prosqa"]["n"] == 6
    assert summary["scale"]["train_seconds_per_method"] > 0
    assert max(summary["surface_rules_on_held_out"].values()) <= 1.0  # scored on the held-out problems
    assert "Binding probe" in printed and "answer flips" in printed
    assert "Written anchors vs CoT:" in printed  # the take-away line: accuracy and tokens of the two
    assert summary["methods"]["acot"]["stages_planned"] > 1  # the curriculum was scheduled
    assert (out / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| method |" in (out / "results.md").read_text()

    # a rerun with the same settings reuses the checkpoints and evaluations (no retraining)
    before = (out / "acot" / "model" / "model.safetensors").stat().st_mtime
    assert main(argv) == 0
    assert (out / "acot" / "model" / "model.safetensors").stat().st_mtime == before
    # other settings into the same folder are refused, not mixed
    assert main([*argv[:-2], "--seed", "3"]) == 1


def test_method_recipe_fine_tunes_the_backbone_or_trains_from_scratch(tmp_path):
    on = demo.method_recipe("acot", demo.DemoSettings(), None, tmp_path / "a", 10.0)
    assert on["model"] == {"name": "logic-gpt2-search"}
    assert on["method"]["options"] == {"k": 3, "remove_steps_per_stage": 1, "step_separator": " "}
    # explicit options (the depth ladder's) still get the settings' separator; one they name themselves wins
    given = demo.method_recipe("acot", demo.DemoSettings(), None, tmp_path / "a", 10.0, options={"k": 4})
    assert given["method"]["options"] == {"k": 4, "step_separator": " "}
    mine = demo.method_recipe("cot", demo.DemoSettings(), None, tmp_path / "a", 10.0, options={"step_separator": "\n"})
    assert mine["method"]["options"] == {"step_separator": "\n"}
    off = demo.method_recipe("acot", demo.DemoSettings(backbone=None), tmp_path / "tok", tmp_path / "b", 10.0)
    assert off["model"] == {"preset": "gpt2-tiny", "tokenizer": str(tmp_path / "tok")}
    with pytest.raises(ValueError):
        demo.method_recipe("acot", demo.DemoSettings(backbone=None), None, tmp_path / "c", 10.0)


def test_parse_backbone_turns_none_words_into_from_scratch():
    assert demo.parse_backbone("logic-gpt2") == "logic-gpt2"
    assert demo.parse_backbone("runs/bb") == "runs/bb"
    for word in ("none", "None", "scratch", "", None):
        assert demo.parse_backbone(word) is None


def test_methods_train_one_per_core_at_most_one_per_method(monkeypatch):
    monkeypatch.setattr(demo.os, "cpu_count", lambda: 2)
    assert demo.demo_workers(demo.DemoSettings(threads=1)) == 2
    assert demo.demo_workers(demo.DemoSettings(threads=2)) == 1  # two threads already fill both cores
    assert demo.demo_workers(demo.DemoSettings(methods=["cot"], threads=1)) == 1
    assert demo.demo_workers(demo.DemoSettings(workers=3, threads=1)) == 3
    monkeypatch.setattr(demo.os, "cpu_count", lambda: 16)
    assert demo.demo_workers(demo.DemoSettings(threads=1)) == len(demo.DEMO_METHODS)


def test_binding_line_gives_the_flips_at_the_shallowest_and_deepest_depth():
    from anchored_reasoning.demo_report import verdict

    def method(acc, flips):
        return {"generated": {"accuracy": acc, "accuracy_ci95": [acc - 0.05, acc + 0.05],
                              "by_hops": {h: {"accuracy": acc, "accuracy_ci95": [acc - 0.1, acc + 0.1]} for h in ("1", "2", "3")}},
                "probe": {"flip_rate": {"mean": sum(flips) / 3},
                          "by_hops": {h: {"flip_rate": {"mean": f}} for h, f in zip(("1", "2", "3"), flips)}}}

    lines = verdict({"chance": 0.5, "methods": {"nocot": method(0.6, [0.85, 0.2, 0.12]), "cot": method(0.7, [0.95, 0.5, 0.3])}})
    line = next(x for x in lines if x.startswith("Binding probe"))
    assert "at 1 hop: nocot 0.85, cot 0.95" in line and "at 3 hops: nocot 0.12, cot 0.30" in line
    assert "no method reads the asked entity reliably" in line


def test_the_verdict_opens_with_the_written_anchors_against_cot():
    from anchored_reasoning.demo_report import verdict

    def gen(acc, lo, hi, tokens):
        return {"generated": {"accuracy": acc, "accuracy_ci95": [lo, hi], "mean_generated_tokens": tokens}}

    above = verdict({"chance": 0.5, "methods": {"cot": gen(0.80, 0.75, 0.85, 90.0), "anchor_chain": gen(0.92, 0.88, 0.95, 30.0)}})
    assert above[0] == ("Written anchors vs CoT: 0.92 vs 0.80 (above CoT beyond both 95% intervals) at 30.0 vs 90.0 "
                        "tokens (0.33x CoT's).")
    level = verdict({"chance": 0.5, "methods": {"cot": gen(0.80, 0.75, 0.85, 40.0), "anchor_chain": gen(0.78, 0.72, 0.83, 30.0)}})
    assert "level with CoT within their 95% intervals" in level[0] and "(0.75x CoT's)" in level[0]
    below = verdict({"chance": 0.5, "methods": {"cot": gen(0.97, 0.95, 0.99, 34.0), "anchor_chain": gen(0.68, 0.62, 0.74, 25.0)}})
    assert "below CoT beyond both 95% intervals" in below[0]


def test_demo_trains_on_the_written_search_and_holds_out_plain_problems():
    """The default trace writes the training problems' reasoning as the depth-first search (with back-ups);
    ``trace="forward"`` keeps the dataset's proof. Held-out problems are the same either way."""
    from anchored_reasoning.generators.traces import prosqa_dfs

    train, held = demo.make_data(demo.DemoSettings(train_n=60, eval_n=6))
    assert all(ex.meta["trace"] == "dfs" for ex in train)
    assert any(s.startswith("Back to ") for ex in train for s in ex.steps)
    assert all(ex.steps[0].startswith(ex.meta["entity"] + " is a ") for ex in train)
    plain, held_plain = demo.make_data(demo.DemoSettings(train_n=60, eval_n=6, trace="forward"))
    assert [ex.question for ex in plain] == [ex.question for ex in train]
    assert all(ex.steps == prosqa_dfs(p) for ex, p in zip(train, plain))
    assert not any(s.startswith("Back to ") for ex in plain for s in ex.steps)
    assert [(ex.question, ex.steps) for ex in held] == [(ex.question, ex.steps) for ex in held_plain]
