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


def test_partial_calls_leave_out_all_padding_columns_with_the_same_tokens():
    """A call on the rows still running skips the left-padding columns none of them uses; tokens stay the same."""
    import torch
    from transformers import AutoTokenizer

    from anchored_reasoning.backends import left_pad
    from anchored_reasoning.models.zoo import resolve_model
    from anchored_reasoning.sampling import SamplerConfig, load_masked_diffusion_model, make_model_fn, sample

    torch.set_num_threads(1)
    path = resolve_model("logic-mdlm")
    model = load_masked_diffusion_model(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    texts = ["Every wumpus is a yumpus. Every yumpus is a rempus. Every rempus is a gorpus. Alex is a wumpus. "
             "Is Alex a gorpus or a sterpus?\n[BoR]", "Sam is a lempus. Is Sam a lempus?\n[BoR]"]
    ids, mask = left_pad([list(tok(t)["input_ids"]) for t in texts], tok.pad_token_id)
    cfg = SamplerConfig(steps=16, gen_length=16, block_length=4, temperature=0.0, remasking="threshold", threshold=0.9,
                        eos_token_id=tok.eos_token_id)
    full_mask = torch.cat([mask, torch.ones(2, cfg.gen_length, dtype=mask.dtype)], 1)
    widths = []
    real_forward = model.forward

    def forward(*args, **kwargs):
        widths.append(kwargs["input_ids"].shape[1])
        return real_forward(*args, **kwargs)

    model.forward = forward
    trimmed, _ = sample(model, ids, cfg, attention_mask=mask, model_fn=make_model_fn(model, full_mask))
    full_width = ids.shape[1] + cfg.gen_length
    partial = [w for w in widths if w < full_width]
    assert partial, "no call ran the short row alone: the test needs a partial call"
    assert all(w == full_width - int((mask[1] == 0).sum()) for w in partial)  # the short row alone, no padding
    widths.clear()
    plain, _ = sample(model, ids, cfg, attention_mask=mask, model_fn=make_model_fn(model, full_mask, trim_padding=False))
    assert widths and all(w == full_width for w in widths)
    assert torch.equal(trimmed, plain)
