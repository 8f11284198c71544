"""benchmarks/first_recipe.py: the README's first recipe graded per method, depth and seed, paired against CoT."""
from __future__ import annotations

import json

import pytest

from benchmarks import first_recipe


def _run(tmp_path, name, correct, tokens=10):
    folder = tmp_path / name / "validation" / "step-0000300"
    folder.mkdir(parents=True)
    (folder / "records.jsonl").write_text("".join(
        json.dumps({"id": i, "correct": c, "tokens": tokens}) + "\n" for i, c in correct.items()))
    (tmp_path / name / "train_summary.json").write_text("{}")


def test_depths_come_from_the_held_out_mix_and_the_paired_difference_is_against_cot(tmp_path):
    ids = [f"gen-valid{s}-{n}" for s in range(3) for n in range(4)]
    _run(tmp_path, "cot_s0", {i: 1 for i in ids}, tokens=30)
    _run(tmp_path, "nocot_s0", {i: int(i.startswith("gen-valid0")) for i in ids}, tokens=9)
    assert first_recipe.main(["--work-dir", str(tmp_path), "--seeds", "0", "--methods", "cot", "nocot", "--no-train",
                              "--out", str(tmp_path / "out.json")]) == 0
    result = json.loads((tmp_path / "out.json").read_text())
    nocot = result["methods"]["nocot"]
    assert nocot["accuracy"] == pytest.approx(4 / 12, abs=1e-3)
    assert nocot["by_hops"]["1"]["accuracy"] == 1.0 and nocot["by_hops"]["3"]["accuracy"] == 0.0
    assert nocot["minus_cot"]["only_cot_right"] == 8 and nocot["minus_cot"]["only_this_right"] == 0
    assert nocot["tokens_vs_cot"] == pytest.approx(0.3)
    assert result["chance"] == 0.5 and "date" in result and result["machine"]["threads"] >= 1
    assert "prosqa_search_cpu method.name=nocot" in result["commands"]["nocot"]


def test_without_training_the_finished_seeds_are_reported_and_a_method_with_none_is_refused(tmp_path):
    ids = [f"gen-valid{s}-0" for s in range(3)]
    _run(tmp_path, "cot_s0", {i: 1 for i in ids})
    assert first_recipe.main(["--work-dir", str(tmp_path), "--seeds", "0", "1", "--methods", "cot", "--no-train",
                              "--out", str(tmp_path / "out.json")]) == 0
    assert json.loads((tmp_path / "out.json").read_text())["methods"]["cot"]["seeds"] == [0]
    with pytest.raises(SystemExit, match="nocot: no finished run"):
        first_recipe.main(["--work-dir", str(tmp_path), "--seeds", "0", "--methods", "nocot", "--no-train"])
