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
