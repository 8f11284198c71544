"""benchmarks/diffusion_batching on the shipped logic-mdlm, two prompts: the JSON it writes holds tokens/s, the
speed-up and the rows identical to one at a time for every sampler and batch size."""
from __future__ import annotations

import json

from benchmarks.diffusion_batching import main


def test_writes_speed_and_identity_per_sampler_and_batch(tmp_path):
    out = tmp_path / "d.json"
    assert main(["--n", "3", "--batch-sizes", "1", "3", "--repeats", "1", "--gen-length", "8", "--block-length", "4",
                 "--samplers", "threshold", "low_confidence+prefix_cache", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["results"]) == {"threshold", "low_confidence+prefix_cache"}
    assert result["machine"]["threads"] >= 1 and len(result["machine"]["loadavg_1min_before_after"]) == 2
    for entry in result["results"].values():
        assert entry["batch_1"]["speedup_over_batch_1"] == 1.0
        assert entry["batch_3"]["rows_identical_to_batch_1"] == "3/3" and entry["batch_3"]["tokens_per_second"] > 0
        assert entry["batch_3"]["model_rows"] <= entry["batch_3"]["model_calls"] * 3
