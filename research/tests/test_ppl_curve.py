"""research/diffusion/adlm_ppl_curve.py: the trend fit finds a known slope and crossing, and a run scored at
several sizes resumes -- a longer curve continues from the last checkpoint with the scores it had."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from research.diffusion import adlm_ppl_curve as curve


def test_fit_trend_recovers_a_power_law_and_its_crossing():
    # ratio = 1.2 * (tokens / 1e6) ** -0.05  ->  crosses 0.92 at 1e6 * (1.2 / 0.92) ** 20
    pts = [(t, 1.2 * (t / 1e6) ** -0.05 * (1 + e)) for t, e in
           [(1e6, 0.001), (2e6, -0.001), (4e6, 0.0005), (8e6, -0.0005), (1.6e7, 0.0)]]
    fit = curve.fit_trend(pts)
    assert fit["slope_per_log_token"] == pytest.approx(-0.05, abs=2e-3)
    assert fit["slope_ci95"][0] < -0.05 < fit["slope_ci95"][1]
    assert fit["tokens_at_goal"] == pytest.approx(1e6 * (1.2 / 0.92) ** 20, rel=0.3)
    assert fit["extrapolated"] and fit["reading"] == "the ratio falls with size"


def test_fit_trend_flat_or_rising_never_crosses():
    rising = curve.fit_trend([(1e6, 1.0), (2e6, 1.02), (4e6, 1.04), (8e6, 1.06)])
    assert rising["tokens_at_goal"] is None and rising["reading"] == "the ratio rises with size"
    noisy = curve.fit_trend([(1e6, 1.0), (2e6, 1.03), (4e6, 0.98), (8e6, 0.97)])
    assert noisy["reading"] == "no trend beyond noise" and noisy["slope_per_log_token"] < 0
    assert noisy["tokens_at_goal"] is None  # a slope within noise gives no crossing


def test_t_interval_over_seeds():
    assert curve.t_interval([1.0]) is None
    lo, hi = curve.t_interval([0.9, 1.0, 1.1])
    assert lo < 1.0 < hi and math.isclose((lo + hi) / 2, 1.0)


def _run(tmp_path: Path, sizes: list[str], text: Path) -> dict:
    out = tmp_path / "curve.json"
    argv = ["--sizes", *sizes, "--seeds", "0", "--train-file", str(text), "--test-file", str(text),
            "--batch-size", "4", "--seq-len", "32", "--vocab", "300", "--width", "16", "--layers", "2", "--heads", "2",
            "--warmup", "2", "--test-tokens", "256", "--t-samples", "1", "--work-dir", str(tmp_path / "work"), "--out", str(out)]
    assert curve.main(argv) == 0
    return json.loads(out.read_text())


def test_curve_runs_and_a_longer_curve_resumes(tmp_path, caplog):
    text = tmp_path / "corpus.txt"
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "home"]
    text.write_text("\n".join(" ".join(words[(i * j) % len(words)] for j in range(12)) for i in range(300)) + "\n")
    first = _run(tmp_path, ["0.0005", "0.001"], text)
    assert first["setup"]["adlm_steps"] == [4, 8]
    pts = first["per_seed"][0]["points"]
    assert [p["million_tokens"] for p in pts] == [0.0005, 0.001]
    assert all(p["ratio"] == pytest.approx(p["ppl_adlm"] / p["ppl_mdlm"]) for p in pts)
    mdlm_scores = json.loads((tmp_path / "work" / "mdlm-0" / "scores.json").read_text())["scores"]
    r = first["setup"]["flops_ratio_adlm_over_mdlm"]
    assert set(mdlm_scores) == {"4", "8", str(round(4 * r)), str(round(8 * r))}

    caplog.set_level("INFO", logger="adlm_ppl_curve")
    second = _run(tmp_path, ["0.0005", "0.001", "0.002"], text)
    assert "adlm seed 0: resuming from checkpoint-8" in caplog.text
    pts2 = second["per_seed"][0]["points"]
    assert [p["ppl_adlm"] for p in pts2[:2]] == [p["ppl_adlm"] for p in pts]  # kept, not retrained
    assert len(pts2) == 3 and second["curve"][2]["million_tokens"] == 0.002
    assert (tmp_path / "curve.png").is_file()
