"""benchmarks/hf_batching: its raw ``model.generate`` side decodes the texts the backend gives (so its ratio compares
the same work), on a tiny local model."""
from __future__ import annotations

import pytest
import torch

from anchored_reasoning.backends.hf import HFBackend
from anchored_reasoning.testing import make_tiny_causal_lm
from anchored_reasoning.types import Prompt, SamplingSpec
from benchmarks.hf_batching import raw_generate

torch.set_num_threads(1)


@pytest.mark.parametrize("batch", [1, 3])
def test_raw_generate_gives_the_backend_texts(tmp_path, batch):
    backend = HFBackend(str(make_tiny_causal_lm(tmp_path)), batch_size=batch, device="cpu")
    prompts = [Prompt("def add(a, b):"), Prompt("The quick brown fox jumps over the lazy dog and"), Prompt("x")]
    ours = [c[0].text for c in backend.generate(prompts, SamplingSpec(max_new_tokens=12))]
    encoded = [backend.encode(p) for p in prompts]
    texts, tokens = raw_generate(backend, encoded, batch, 12)
    assert texts == ours and 0 < tokens <= 36


# --- the length-bucketed prompt pass (backends/hf_prefill.py) ---------------------------------------------------

from anchored_reasoning.backends import hf_prefill  # noqa: E402
from anchored_reasoning.backends.hf_prefill import plan_buckets  # noqa: E402


@pytest.mark.parametrize("lengths, groups", [
    ([200, 190, 100, 95, 90, 30, 10], [[0, 1], [2, 3, 4], [5, 6]]),  # three length bands: three passes
    ([120, 118, 117, 115], [[0, 1, 2, 3]]),                           # similar lengths: one pass
    ([10, 150, 12, 140], [[1, 3], [2, 0]]),                           # any order in, longest first out
    ([5], [[0]]),
    ([], []),
])
def test_plan_buckets_groups_rows_by_length(lengths, groups):
    assert plan_buckets(lengths) == groups


def test_plan_buckets_keeps_one_pass_when_splitting_saves_little():
    # a split saves 2 * 20 = 40 padded tokens, under the cost of one more call plus MIN_SAVING of the 400
    assert plan_buckets([100, 100, 80, 80], overhead=32) == [[0, 1, 2, 3]]
    assert len(plan_buckets([100, 100, 20, 20], overhead=32)) == 2


def test_bucketed_prompt_pass_keeps_texts_and_order(tmp_path, monkeypatch):
    backend = HFBackend(str(make_tiny_causal_lm(tmp_path)), batch_size=8, device="cpu")
    words = "the quick brown fox jumps over the lazy dog and then".split()
    # lengths far apart (one, 12 ... 130 tokens) in no order: the prompt pass splits into buckets
    prompts = [Prompt(" ".join(words * k)) for k in (1, 9, 2, 8, 1, 3, 12, 5)] + [Prompt("x")]
    calls = []
    real = hf_prefill.bucketed_prefill

    def spy(model, ids, pad):
        cache = real(model, ids, pad)
        calls.append(cache is not None)
        return cache

    monkeypatch.setattr("anchored_reasoning.backends.hf.bucketed_prefill", spy)
    spec = SamplingSpec(max_new_tokens=16)
    bucketed = backend.generate(prompts, spec)
    assert calls == [True, False]  # the first batch of 8 is bucketed; the last (one prompt) is not
    backend.bucket_prefill = False
    plain = backend.generate(prompts, spec)
    assert [c[0].text for c in bucketed] == [c[0].text for c in plain]
    assert [c[0].n_tokens for c in bucketed] == [c[0].n_tokens for c in plain]
    one_by_one = [backend.generate([p], spec)[0][0].text for p in prompts]  # the caller's order comes back
    assert [c[0].text for c in bucketed] == one_by_one
