"""In-process vLLM backend: ``vllm.LLM`` with ``SamplingParams``, tensor and data parallel.

>>> backend = get_backend("vllm", "Qwen/Qwen2.5-1.5B-Instruct", tensor_parallel_size=2)   # doctest: +SKIP

Needs the ``vllm`` extra (``pip install 'anchored-reasoning[vllm]'``, a CUDA GPU); vLLM is
imported when the backend is built, never when the package is imported. Prompts with chat
``messages`` go through ``LLM.chat`` (the model's chat template) when ``mode`` is ``auto`` or
``chat``; plain prompts through ``LLM.generate``. Greedy decoding (temperature 0) asks for one
sample per prompt and repeats it ``n`` times, since all greedy samples are the same.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from anchored_reasoning.backends import cut_at_stop
from anchored_reasoning.errors import BackendError, ConfigError
from anchored_reasoning.types import Completion, Prompt, SamplingSpec

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'anchored-reasoning[vllm]'"


def import_vllm():
    """Import vllm or raise a BackendError that says how to install it."""
    try:
        import vllm
    except ImportError as exc:
        raise BackendError(
            f"the vllm backend needs the `vllm` package, which is not importable here ({exc}). "
            f"Install it with `{INSTALL_HINT}` on a machine with a CUDA GPU, or use `--backend hf` "
            f"(local transformers) or `--backend openai` against a running server"
        ) from exc
    return vllm


def sampling_params_kwargs(spec: SamplingSpec) -> dict[str, Any]:
    """The ``vllm.SamplingParams`` keyword arguments that mean ``spec`` (one request per prompt)."""
    if spec.n < 1:
        raise ConfigError(f"SamplingSpec.n must be >= 1, got {spec.n}")
    kwargs: dict[str, Any] = {
        "n": 1 if spec.greedy else spec.n,
        "temperature": 0.0 if spec.greedy else float(spec.temperature),
        "top_p": 1.0 if spec.greedy else float(spec.top_p),
        "max_tokens": int(spec.max_new_tokens),
        "seed": int(spec.seed),
    }
    if spec.stop:
        kwargs["stop"] = list(spec.stop)
    return kwargs


class VLLMBackend:
    """Generate with an in-process ``vllm.LLM``.

    Args:
        model: a local checkpoint path or Hub id (aliases are resolved by the caller).
        tensor_parallel_size / data_parallel_size: GPUs per replica / number of replicas.
        dtype: ``auto``, ``bfloat16``, ``float16``, ``float32``.
        gpu_memory_utilization: fraction of each GPU vLLM may use.
        max_model_len: context length cap (None: the model's).
        seed: engine seed (per-request seeds come from ``SamplingSpec.seed``).
        mode: ``auto`` (chat when the prompt has messages), ``completions`` or ``chat``.
        batch_size: prompts the eval runner hands over per call (vLLM schedules them itself;
            larger is faster, a crash loses at most one call's samples).
        **engine_kwargs: passed to ``vllm.LLM`` unchanged (e.g. ``enforce_eager=True``).
    """

    name = "vllm"

    def __init__(
        self,
        model: str,
        *,
        tensor_parallel_size: int = 1,
        data_parallel_size: int = 1,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        seed: int = 0,
        trust_remote_code: bool = False,
        mode: str = "auto",
        batch_size: int = 256,
        **engine_kwargs: Any,
    ) -> None:
        if mode not in ("auto", "completions", "chat"):
            raise ConfigError(f"vllm backend: mode {mode!r} is not one of auto, completions, chat")
        if tensor_parallel_size < 1 or data_parallel_size < 1:
            raise ConfigError("vllm backend: tensor_parallel_size and data_parallel_size must be >= 1")
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ConfigError(f"vllm backend: gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        self.model = str(model)
        self.mode = mode
        self.batch_size = int(batch_size)
        self.dtype = dtype
        self.max_model_len = max_model_len
        self._vllm = import_vllm()
        llm_kwargs: dict[str, Any] = {
            "model": self.model,
            "tensor_parallel_size": int(tensor_parallel_size),
            "dtype": dtype,
            "gpu_memory_utilization": float(gpu_memory_utilization),
            "seed": int(seed),
            "trust_remote_code": bool(trust_remote_code),
        }
        if data_parallel_size != 1:
            llm_kwargs["data_parallel_size"] = int(data_parallel_size)
        if max_model_len is not None:
            llm_kwargs["max_model_len"] = int(max_model_len)
        llm_kwargs.update(engine_kwargs)
        self.llm_kwargs = llm_kwargs
        logger.info("vllm backend: loading %s (tp=%d, dp=%d, dtype=%s)", self.model, tensor_parallel_size, data_parallel_size, dtype)
        try:
            self.llm = self._vllm.LLM(**llm_kwargs)
        except Exception as exc:  # vLLM raises many kinds (CUDA, config, OOM); say where it came from
            raise BackendError(f"vllm could not load {self.model!r} with {llm_kwargs}: {type(exc).__name__}: {exc}") from exc

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "model": self.model, "dtype": self.dtype, "max_model_len": self.max_model_len, "mode": self.mode}

    def _use_chat(self, prompt: Prompt) -> bool:
        return self.mode == "chat" or (self.mode == "auto" and bool(prompt.messages))

    def generate(self, prompts: list[Prompt], spec: SamplingSpec) -> list[list[Completion]]:
        if not prompts:
            return []
        params = self._vllm.SamplingParams(**sampling_params_kwargs(spec))
        results: list[list[Completion] | None] = [None] * len(prompts)
        chat_idx = [i for i, p in enumerate(prompts) if self._use_chat(p)]
        text_idx = [i for i, p in enumerate(prompts) if not self._use_chat(p)]
        for indices, chat in ((text_idx, False), (chat_idx, True)):
            if not indices:
                continue
            t0 = time.perf_counter()
            if chat:
                conversations = [prompts[i].messages or [{"role": "user", "content": prompts[i].text}] for i in indices]
                outputs = self.llm.chat(conversations, params, use_tqdm=False)
            else:
                outputs = self.llm.generate([prompts[i].text for i in indices], params, use_tqdm=False)
            elapsed = time.perf_counter() - t0
            if len(outputs) != len(indices):
                raise BackendError(f"vllm returned {len(outputs)} outputs for {len(indices)} prompts")
            per_sample = elapsed / max(1, len(indices) * spec.n)
            for i, out in zip(indices, outputs):
                results[i] = self._unpack(out, spec, per_sample)
        return results  # type: ignore[return-value]

    @staticmethod
    def _unpack(request_output: Any, spec: SamplingSpec, seconds: float) -> list[Completion]:
        """One ``RequestOutput`` -> ``spec.n`` Completions (sorted by index, stop strings cut)."""
        outs = sorted(request_output.outputs, key=lambda o: getattr(o, "index", 0))
        samples = []
        for o in outs:
            text, cut = cut_at_stop(o.text, spec.stop)
            finish = "stop" if cut else getattr(o, "finish_reason", None)
            samples.append(Completion(text=text, n_tokens=len(o.token_ids), seconds=seconds, finish_reason=finish))
        if spec.greedy and len(samples) == 1:
            samples = samples * spec.n
        if len(samples) != spec.n:
            raise BackendError(f"vllm returned {len(samples)} samples for a prompt, expected n={spec.n}")
        return samples
