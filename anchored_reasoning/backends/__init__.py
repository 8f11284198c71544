"""Generation backends. The eval runner talks to any object that satisfies :class:`Backend`.

Built-in names (resolved lazily, so optional extras are imported only when asked for):
``hf`` (local transformers AR model), ``diffusion`` (our masked diffusion samplers),
``openai`` (any OpenAI-compatible server), ``vllm`` (in-process vLLM).
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, Protocol, runtime_checkable

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.types import Completion, Prompt, SamplingSpec


@runtime_checkable
class Backend(Protocol):
    """Generate ``spec.n`` completions for each prompt, in prompt order.

    ``generate`` returns one list of ``spec.n`` :class:`Completion` per prompt. Stop strings
    are cut from the returned text (the text ends before the stop string). ``describe``
    returns a JSON-able dict that identifies the model and settings (it goes into the run's
    config, so a resumed run can check it talks to the same thing).

    A backend may also take ``on_progress`` (a :data:`ProgressFn`) as a keyword of ``generate`` and
    report while a call runs; :func:`generate_with_progress` passes it only to backends that do.
    """

    name: str

    def generate(self, prompts: list[Prompt], spec: SamplingSpec) -> list[list[Completion]]: ...

    def describe(self) -> dict[str, Any]: ...


#: ``on_progress(done_samples, new_tokens)``: called by a backend during ``generate`` with what happened
#: since its previous call: samples (of ``len(prompts) * spec.n``) that finished, tokens generated. Over
#: one ``generate`` call the ``done_samples`` add up to its sample count. Reporting changes no output.
ProgressFn = Callable[[int, int], None]


def takes_progress(backend: Any) -> bool:
    """Whether ``backend.generate`` takes the ``on_progress`` keyword."""
    try:
        params = inspect.signature(backend.generate).parameters
    except (TypeError, ValueError):
        return False
    return "on_progress" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def generate_with_progress(backend: Any, prompts: list[Prompt], spec: SamplingSpec,
                           on_progress: ProgressFn | None) -> list[list[Completion]]:
    """``backend.generate(prompts, spec)``, with ``on_progress`` where the backend takes it."""
    if on_progress is not None and takes_progress(backend):
        return backend.generate(prompts, spec, on_progress=on_progress)
    return backend.generate(prompts, spec)


# name -> "module:factory"; factories take (model: str, **options) and return a Backend.
_BACKENDS: dict[str, str] = {
    "hf": "anchored_reasoning.backends.hf:HFBackend",
    "diffusion": "anchored_reasoning.backends.diffusion:DiffusionBackend",
    "openai": "anchored_reasoning.backends.openai_compat:OpenAIBackend",
    "vllm": "anchored_reasoning.backends.vllm_backend:VLLMBackend",
    "diffusion_gemma": "anchored_reasoning.backends.diffusion_gemma:DiffusionGemmaBackend",  # + TADM anchor cache
}


def register_backend(name: str, target: str) -> None:
    """Register a backend factory by import path ``"package.module:Factory"``."""
    _BACKENDS[name] = target


def list_backends() -> list[str]:
    """The registered backend names (``hf``, ``diffusion``, ``vllm``, ``openai``, ...), for :func:`get_backend`."""
    return sorted(_BACKENDS)


def get_backend(name: str, model: str, **options: Any) -> Backend:
    """Build backend ``name`` for ``model`` (a path, a Hub id, an alias or a URL, by backend)."""
    try:
        target = _BACKENDS[name]
    except KeyError:
        raise ConfigError(f"unknown backend {name!r}; known: {', '.join(list_backends())}") from None
    module_name, _, attr = target.partition(":")
    factory = getattr(importlib.import_module(module_name), attr)
    return factory(model, **options)


def build_backend(name: str, model: str, *, seed: int | None = None, **options: Any) -> Backend:
    """:func:`get_backend` for an evaluation: the run's ``seed`` goes to a backend that takes one (hf,
    diffusion, vllm seed their sampling with it) and is left out for one that does not (None: the backend's
    own default); an option the backend does not take is a ConfigError naming the options given. The
    ``eval`` command builds its backend here from its flags, a suite from its ``backend_args``."""
    try:
        if seed is not None:
            try:
                return get_backend(name, model, seed=seed, **options)
            except TypeError as exc:
                if "seed" not in str(exc):
                    raise
        return get_backend(name, model, **options)
    except TypeError as exc:
        raise ConfigError(
            f"backend {name!r} does not accept these options {sorted(options)}: {exc}. Check the names "
            "(--backend-arg KEY=VALUE on the command line, backend_args in a suite; docs/evaluation.md)"
        ) from None


def cut_at_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """Cut ``text`` before the earliest stop string. Returns (text, whether a stop was found)."""
    cut = len(text)
    for s in stop:
        if s:
            i = text.find(s)
            if i != -1 and i < cut:
                cut = i
    return text[:cut], cut < len(text)


def left_pad(ids: list[list[int]], pad_id: int):
    """Left-pad token-id rows into ``(input_ids, attention_mask)`` long tensors (an empty row is all padding)."""
    import torch

    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for r, x in enumerate(ids):
        if x:
            input_ids[r, width - len(x) :] = torch.tensor(x, dtype=torch.long)
            mask[r, width - len(x) :] = 1
    return input_ids, mask


def per_prompt_samples(results: dict[tuple[int, int], Completion], n_prompts: int, n: int, *,
                       shared: bool) -> list[list[Completion]]:
    """Results keyed by ``(prompt index, sample index)`` as one list of ``n`` samples per prompt.

    ``shared``: only sample 0 of each prompt was generated (a deterministic decode stands for all
    ``n``); it is repeated ``n`` times, each copy carrying ``1/n`` of its seconds so totals stay true.
    """
    out: list[list[Completion]] = []
    for pi in range(n_prompts):
        if shared:
            c = results[(pi, 0)]
            share = c.seconds / n
            out.append([Completion(c.text, c.n_tokens, share, c.finish_reason, meta=c.meta) for _ in range(n)])
        else:
            out.append([results[(pi, si)] for si in range(n)])
    return out
