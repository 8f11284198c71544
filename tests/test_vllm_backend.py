"""The vllm backend.

* With a fake ``vllm`` module injected into ``sys.modules``: SamplingSpec -> SamplingParams
  mapping, LLM construction options, chat vs text routing and output unpacking (runs everywhere).
* With the real vLLM (only where it is importable, i.e. a GPU machine with the ``vllm`` extra):
  the same code path a GPU user runs, on a tiny local model, against the HF backend.
"""
from __future__ import annotations

import importlib.util
import sys
import types
from dataclasses import dataclass, field

import pytest

from anchored_reasoning.errors import BackendError, ConfigError
from anchored_reasoning.types import Prompt, SamplingSpec


@dataclass
class FakeOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str = "length"


@dataclass
class FakeRequestOutput:
    outputs: list[FakeOutput]


class FakeSamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class FakeLLM:
    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls = []

    def _answer(self, key: str, params: FakeSamplingParams) -> FakeRequestOutput:
        n = params.kwargs["n"]
        # reversed on purpose: the backend must sort by index
        outs = [FakeOutput(k, f"{key}#{k} STOP after", list(range(k + 1))) for k in reversed(range(n))]
        return FakeRequestOutput(outs)

    def generate(self, prompts, params, use_tqdm=True):
        self.calls.append(("generate", list(prompts), params))
        return [self._answer(p, params) for p in prompts]

    def chat(self, conversations, params, use_tqdm=True):
        self.calls.append(("chat", list(conversations), params))
        return [self._answer(c[-1]["content"], params) for c in conversations]


@pytest.fixture
def fake_vllm(monkeypatch):
    mod = types.ModuleType("vllm")
    mod.LLM = FakeLLM
    mod.SamplingParams = FakeSamplingParams
    monkeypatch.setitem(sys.modules, "vllm", mod)
    return mod


def test_missing_vllm_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    from anchored_reasoning.backends.vllm_backend import VLLMBackend

    with pytest.raises(BackendError, match=r"pip install 'anchored-reasoning\[vllm\]'"):
        VLLMBackend("some/model")


def test_llm_options_are_passed(fake_vllm):
    from anchored_reasoning.backends import get_backend

    b = get_backend("vllm", "/ckpt", tensor_parallel_size=2, data_parallel_size=4, dtype="bfloat16",
                    gpu_memory_utilization=0.5, max_model_len=4096, seed=3, enforce_eager=True, batch_size=64)
    assert b.batch_size == 64  # the runner's chunk size, not an engine option
    assert b.llm.kwargs == {
        "model": "/ckpt", "tensor_parallel_size": 2, "data_parallel_size": 4, "dtype": "bfloat16",
        "gpu_memory_utilization": 0.5, "seed": 3, "trust_remote_code": False, "max_model_len": 4096,
        "enforce_eager": True,
    }
    assert b.describe() == {"backend": "vllm", "model": "/ckpt", "dtype": "bfloat16", "max_model_len": 4096, "mode": "auto"}
    with pytest.raises(ConfigError):
        get_backend("vllm", "/ckpt", gpu_memory_utilization=1.5)


def test_sampling_spec_maps_to_sampling_params(fake_vllm):
    from anchored_reasoning.backends.vllm_backend import VLLMBackend

    b = VLLMBackend("/ckpt")
    spec = SamplingSpec(max_new_tokens=33, temperature=0.6, top_p=0.9, n=3, stop=["STOP"], seed=7)
    out = b.generate([Prompt("alpha"), Prompt("beta")], spec)
    kind, prompts, params = b.llm.calls[0]
    assert kind == "generate" and prompts == ["alpha", "beta"]
    assert params.kwargs == {"n": 3, "temperature": 0.6, "top_p": 0.9, "max_tokens": 33, "seed": 7, "stop": ["STOP"]}
    assert [[c.text for c in row] for row in out] == [["alpha#0 ", "alpha#1 ", "alpha#2 "], ["beta#0 ", "beta#1 ", "beta#2 "]]
    assert [c.n_tokens for c in out[0]] == [1, 2, 3]
    assert all(c.finish_reason == "stop" and c.seconds >= 0 for row in out for c in row)


def test_greedy_asks_one_sample_and_copies(fake_vllm):
    from anchored_reasoning.backends.vllm_backend import VLLMBackend

    b = VLLMBackend("/ckpt")
    out = b.generate([Prompt("alpha")], SamplingSpec(max_new_tokens=5, temperature=0.0, top_p=0.5, n=4))
    params = b.llm.calls[0][2]
    assert params.kwargs == {"n": 1, "temperature": 0.0, "top_p": 1.0, "max_tokens": 5, "seed": 0}
    assert [c.text for c in out[0]] == ["alpha#0 STOP after"] * 4


def test_chat_prompts_go_through_llm_chat_in_order(fake_vllm):
    from anchored_reasoning.backends.vllm_backend import VLLMBackend

    b = VLLMBackend("/ckpt")
    prompts = [Prompt("raw1"), Prompt("x", messages=[{"role": "user", "content": "chat1"}]), Prompt("raw2")]
    out = b.generate(prompts, SamplingSpec(max_new_tokens=5))
    assert [row[0].text for row in out] == ["raw1#0 STOP after", "chat1#0 STOP after", "raw2#0 STOP after"]
    assert [c[0] for c in b.llm.calls] == ["generate", "chat"]
    b2 = VLLMBackend("/ckpt", mode="completions")
    b2.generate(prompts, SamplingSpec(max_new_tokens=5))
    assert [c[0] for c in b2.llm.calls] == ["generate"]


HAVE_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_VLLM, reason="vllm is not installed (pip install 'anchored-reasoning[vllm]' on a CUDA machine)")
def test_real_vllm_matches_hf_greedy(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("vllm is installed but torch sees no CUDA device")
    from anchored_reasoning.backends.hf import HFBackend
    from anchored_reasoning.backends.vllm_backend import VLLMBackend
    from anchored_reasoning.testing import make_tiny_causal_lm

    path = str(make_tiny_causal_lm(tmp_path / "tiny"))
    prompts = [Prompt("Question: 1 + 2 ="), Prompt("Every wumpus is a")]
    spec = SamplingSpec(max_new_tokens=12)
    vb = VLLMBackend(path, dtype="float32", gpu_memory_utilization=0.2, max_model_len=256, enforce_eager=True)
    got = vb.generate(prompts, spec)
    want = HFBackend(path, dtype="float32").generate(prompts, spec)
    assert [r[0].text for r in got] == [r[0].text for r in want]
    sampled = vb.generate(prompts, SamplingSpec(max_new_tokens=8, temperature=1.0, n=3, seed=1))
    assert all(len(r) == 3 and all(0 < c.n_tokens <= 8 for c in r) for r in sampled)
