"""benchmarks/tadm_budget_sweep.py: its document check accepts every gold document and refuses broken ones,
the intervals are sound, and a tiny run writes the JSON the docs describe."""
import json

import pytest
import torch

torch.set_num_threads(1)

from benchmarks import tadm_budget_sweep as tbs  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from anchored_reasoning.models.zoo import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("logic-gpt2"))


def test_gold_documents_are_valid_and_broken_ones_are_not(tok):
    rows = tbs.packed_sequences(tok, 4, 256, seed=3)
    assert rows.shape == (4, 257) and torch.all(rows[:, 0] == tok.eos_token_id)
    docs = [d for row in rows.tolist() for d in tbs.documents(row, tok.eos_token_id)]
    assert len(docs) >= 16 and all(tbs.valid_document(tok.decode(d)) for d in docs)
    good = "Rex is a lempus. Every lempus is a fompus. Max is a vumpus.\nRex is a lempus. Every lempus is a fompus. Rex is a fompus."
    assert tbs.valid_document(good)
    assert not tbs.valid_document(good.replace("Rex is a fompus.", "Max is a fompus."))  # does not follow
    assert not tbs.valid_document(good.replace("Every lempus is a fompus. Rex", "Every vumpus is a fompus. Rex", 1))
    assert not tbs.valid_document(good.replace("\n", " "))  # no derivation
    assert not tbs.valid_document(good + "\nRex is a lempus.")  # two newlines
    assert not tbs.valid_document(good.replace("Max is a vumpus.", "Max vumpus lempus."))  # no sentence
    # the last, cut document of a row (no closing EOS) is not counted
    assert tbs.documents([2, 5, 6, 2, 7, 8], 2) == [[5, 6]]


def test_bootstrap_intervals_cover_the_estimate_and_pair_with_k1():
    rows = [{"docs": 10, "valid": v, "nll": 20.0 + v, "judged_tokens": 100, "entropy": 3.0} for v in (6, 7, 8, 9)]
    ref = [{**r, "valid": 10} for r in rows]
    out = tbs.bootstrap(rows, ref, reps=500)
    assert out["valid_share"] == pytest.approx(0.75)
    lo, hi = out["valid_share_ci95"]
    assert 0.6 <= lo <= 0.75 <= hi <= 0.9
    assert out["valid_share_minus_k1"] == pytest.approx(-0.25)
    assert out["valid_share_minus_k1_ci95"][1] < 0
    assert out["gen_ppl_ci95"][0] <= out["gen_ppl"] <= out["gen_ppl_ci95"][1]


def test_a_tiny_run_writes_the_sweep(tmp_path):
    out = tmp_path / "sweep.json"
    tbs.main(["--workdir", str(tmp_path / "w"), "--out", str(out), "--length", "64", "--hidden", "32",
              "--train-steps", "2", "--train-sequences", "8", "--batch", "2", "--samples", "2", "--budgets", "8",
              "--ks", "1", "4", "--bound-sequences", "2", "--bound-t-samples", "1"])
    d = json.loads(out.read_text())
    rows = d["results"]["T=8"]
    assert set(rows) == {"1", "4"} and d["training"]["steps"] == 2 and d["finished"] is True
    assert rows["1"]["nfe"] == rows["4"]["nfe"] == 8
    assert rows["4"]["layer_calls_per_sample"] == 8 * 2 + 2 * 2 < rows["1"]["layer_calls_per_sample"] == 8 * 4
    assert rows["4"]["anchor_refresh_fraction"] == pytest.approx(0.25)
    assert "valid_share_minus_k1_ci95" in rows["4"] and d["setup"]["gold"]["valid_share"] == 1.0
    assert {"load_average_at_start", "load_average_at_end", "torch_threads"} <= set(d["machine"])
    with pytest.raises(SystemExit):
        tbs.parse_args(["--ks", "2", "4"])  # the reference K = 1 comes first
