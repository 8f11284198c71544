"""DiffusionGemma backend: the eval runner's ``Backend`` for ``DiffusionGemmaForBlockDiffusion``
checkpoints, sampled by the model's own block-diffusion ``generate``, optionally with TADM's anchor cache.

    anchored-reasoning eval --task gsm8k --method cot --model google/diffusiongemma-26B-A4B-it \\
        --backend diffusion_gemma --backend-arg dtype=bfloat16 --max-new-tokens 1024 --out runs/dg-gsm8k
    anchored-reasoning eval --task gsm8k --method cot --model runs/tadm_gemma_posttrain \\
        --backend diffusion_gemma --backend-arg anchor_refresh_every=3 --out runs/tadm-gsm8k-k3

``model``: a DiffusionGemma checkpoint (folder or Hub id), or a fusion folder written by the
``tadm_gemma`` trainer (its base model is read from the fusion's config, or given as ``base=``).
Anything else is refused from its config before weights load. Options:

* ``anchor_refresh_every`` (K, >= 1): with a fusion, TADM's cached sampling; without one and K > 1,
  naive stale reuse (``split`` picks the layers, default the paper's proportions); K = 1 without a
  fusion is the base model's ``generate`` itself. ``fusion=<folder>`` adds a fusion to a base ``model``.
* ``anchor_refresh_below`` (tau in (0, 1]): also refresh the anchor at a step whose next decision is a hard
  one (the library's confidence-triggered refresh, in DiffusionGemma's terms: see
  :mod:`anchored_reasoning.models.tadm_gemma`); K stays the maximum staleness.
* ``steps`` (default 48) denoising steps per canvas, ``adaptive_stopping`` (default false: the paper's
  fixed budget; true: the model's stable-and-confident stop), ``t_min`` / ``t_max`` / ``entropy_bound``
  (the model's temperature schedule and acceptance bound; default: the checkpoint's generation config).
* The sampler is stochastic by design (uniform-noise canvas, sampled proposals); the run's
  ``temperature`` is not used. Each (prompt, sample) row runs alone, seeded from (seed, prompt tokens,
  sample index), so a row's output never depends on its batch and a resumed run draws the same.
* ``max_new_tokens`` is rounded up to whole canvases by ``generate``; the text is cut at the first EOS
  (padding dropped), then at the earliest stop string.

Every :class:`~anchored_reasoning.types.Completion` carries ``meta``: the call's NFE (decoder passes),
anchor refreshes, decoder / anchor layer calls, the base model's layer calls for the same steps, fusion
calls and canvases (:class:`~anchored_reasoning.models.tadm_gemma.CallCounters`), and K; the runner
writes them into each record.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from anchored_reasoning.backends import ProgressFn, cut_at_stop
from anchored_reasoning.errors import BackendError, ConfigError
from anchored_reasoning.types import Completion, Prompt, SamplingSpec

log = logging.getLogger(__name__)


def _resolve(model: str, base: str | None) -> tuple[str, str | None]:
    """(base checkpoint, fusion folder or None) for the ``model`` / ``base`` options, from configs only."""
    from anchored_reasoning.models.diffusion_gemma import check_diffusion_gemma, config_model_type
    from anchored_reasoning.models.tadm_gemma import AnchorFusionConfig
    from anchored_reasoning.models.zoo import resolve_model

    path = resolve_model(model)
    if config_model_type(path) == AnchorFusionConfig.model_type:
        base = base or AnchorFusionConfig.from_pretrained(path).base_model
        if not base:
            raise ConfigError(f"fusion {path} names no base model; pass --backend-arg base=<DiffusionGemma checkpoint>")
        check_diffusion_gemma(resolve_model(base), "base model")
        return resolve_model(base), path
    if base is not None:
        raise ConfigError(f"base={base!r} is for a fusion folder as --model; {model!r} is no fusion")
    check_diffusion_gemma(path)
    return path, None


class DiffusionGemmaBackend:
    """Generation with a DiffusionGemma (see the module doc). ``model`` may also be a loaded
    ``DiffusionGemmaForBlockDiffusion`` (then pass ``tokenizer``)."""

    name = "diffusion_gemma"

    def __init__(self, model: Any, *, fusion: str | None = None, base: str | None = None,
                 anchor_refresh_every: int = 1, anchor_refresh_below: float | None = None, split: Any = None, steps: int = 48, adaptive_stopping: bool = False,
                 t_min: float | None = None, t_max: float | None = None, entropy_bound: float | None = None,
                 device: str | None = None, dtype: str | None = None, tokenizer: Any = None, chat: bool | str = "auto",
                 seed: int = 0, batch_size: int = 1) -> None:
        import torch

        from anchored_reasoning.models.diffusion_gemma import load_diffusion_gemma, torch_dtype
        from anchored_reasoning.models.tadm_gemma import TADMDiffusionGemma, load_fusion

        if not isinstance(anchor_refresh_every, int) or isinstance(anchor_refresh_every, bool) or anchor_refresh_every < 1:
            raise ConfigError(f"backend option anchor_refresh_every={anchor_refresh_every!r} must be an integer >= 1 "
                              "(1: the anchor network at every denoising step, K: every K steps)")
        from anchored_reasoning.sampling.cache import check_refresh_below

        check_refresh_below(anchor_refresh_below, "backend option anchor_refresh_below")
        if not isinstance(steps, int) or steps < 1:
            raise ConfigError(f"backend option steps={steps!r} must be an integer >= 1")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"backend option batch_size={batch_size!r} must be an integer >= 1")
        if not isinstance(adaptive_stopping, bool):
            raise ConfigError(f"backend option adaptive_stopping={adaptive_stopping!r} must be true or false")
        torch_dtype(dtype)  # a bad dtype fails before anything loads
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.steps, self.adaptive_stopping, self.seed, self.chat_mode = steps, adaptive_stopping, int(seed), chat
        self.batch_size = batch_size  # chunk size for the runner; rows are generated one at a time
        self.sampling = {k: v for k, v in (("t_min", t_min), ("t_max", t_max)) if v is not None}
        if entropy_bound is not None:
            from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

            try:
                self.sampling["sampler_config"] = EntropyBoundSamplerConfig(entropy_bound=float(entropy_bound))
            except ValueError as exc:
                raise ConfigError(f"backend option entropy_bound={entropy_bound!r}: {exc}") from None
        if isinstance(model, (str, Path)):
            self.model_arg = str(model)
            base_path, fusion_path = _resolve(str(model), base)
            if split is not None and not fusion and fusion_path is None:  # a split that does not fit: before loading
                from transformers import AutoConfig

                from anchored_reasoning.models.diffusion_gemma import LayerSplit

                LayerSplit.for_model(AutoConfig.from_pretrained(base_path), split)
            fusion_path = fusion_path or (str(Path(fusion).resolve()) if fusion else None)
            if fusion_path is not None:
                load_fusion(fusion_path)  # a wrong fusion folder fails before the base model loads
            try:
                self.model, self.tokenizer = load_diffusion_gemma(base_path, dtype=dtype)
            except OSError as exc:
                raise BackendError(f"could not load DiffusionGemma {base_path!r}: {exc}") from exc
            self.model_path, self.fusion_path = base_path, fusion_path
        else:
            if tokenizer is None:
                raise ConfigError("DiffusionGemmaBackend(model=<a model object>) needs tokenizer=...")
            if type(model).__name__ != "DiffusionGemmaForBlockDiffusion":
                raise ConfigError(f"the diffusion_gemma backend needs a DiffusionGemmaForBlockDiffusion, got {type(model).__name__}")
            self.model_arg, self.model_path, self.fusion_path = type(model).__name__, None, fusion
            self.model, self.tokenizer = model, tokenizer
        self.model.to(self.device).eval()
        fusion_model = load_fusion(self.fusion_path, device=str(self.device)) if self.fusion_path else None
        # K = 1 without a fusion is the model's own generate; otherwise the cached sampler (its checks run here)
        cached = fusion_model is not None or anchor_refresh_every != 1 or split is not None or anchor_refresh_below is not None
        self.tadm = TADMDiffusionGemma(self.model, fusion_model, split=split, anchor_refresh_every=anchor_refresh_every,
                                       anchor_refresh_below=anchor_refresh_below) if cached else None
        if self.tokenizer.eos_token_id is None:
            raise ConfigError(f"the tokenizer of {self.model_arg} has no EOS token; outputs are cut at EOS")
        self.strip_ids = {i for i in (self.tokenizer.pad_token_id, self.tokenizer.bos_token_id) if i is not None}
        self._nfe = 0
        self.model.lm_head.register_forward_hook(self._count_step)  # one LM-head call per decoder pass
        log.info("diffusion_gemma backend: %s on %s, %s", self.model_arg, self.device,
                 "base model" if self.tadm is None else self.tadm.describe())

    def _count_step(self, *_args) -> None:
        self._nfe += 1

    # -- helpers --------------------------------------------------------------------------
    def encode(self, prompt: Prompt) -> list[int]:
        tok = self.tokenizer
        use_chat = bool(prompt.messages) and self.chat_mode not in (False, "off", "false", "no") and getattr(tok, "chat_template", None)
        if use_chat:
            text = tok.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=False)
            return list(tok(text, add_special_tokens=False)["input_ids"])
        return list(tok(prompt.text)["input_ids"])

    def generation_kwargs(self, max_new_tokens: int) -> dict[str, Any]:
        from anchored_reasoning.models.diffusion_gemma import paper_generation_kwargs

        kwargs: dict[str, Any] = {"max_new_tokens": int(max_new_tokens), **self.sampling,
                                  "pad_token_id": self.tokenizer.pad_token_id, "eos_token_id": self.tokenizer.eos_token_id}
        if self.adaptive_stopping:
            kwargs["max_denoising_steps"] = self.steps
        else:
            kwargs.update(paper_generation_kwargs(self.steps))
        return kwargs

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name, "model": self.model_path or self.model_arg, "model_arg": self.model_arg,
            "fusion": self.fusion_path, "steps": self.steps, "adaptive_stopping": self.adaptive_stopping,
            "sampling": {k: (v.entropy_bound if k == "sampler_config" else v) for k, v in self.sampling.items()},
            "tadm": None if self.tadm is None else self.tadm.describe(),
            "canvas_length": int(self.model.config.canvas_length), "device": str(self.device),
        }

    # -- generation -----------------------------------------------------------------------
    def generate(self, prompts: list[Prompt], spec: SamplingSpec, *,
                 on_progress: ProgressFn | None = None) -> list[list[Completion]]:
        from anchored_reasoning.backends.hf import row_seed

        if spec.n < 1:
            raise ConfigError(f"n={spec.n}: ask for at least one sample per prompt")
        if spec.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens={spec.max_new_tokens}: must be >= 1")
        encoded = [self.encode(p) for p in prompts]
        limit = int(self.model.config.get_text_config().max_position_embeddings)
        canvas = int(self.model.config.canvas_length)
        for ids in encoded:  # every prompt checked before any work
            need = len(ids) + -(-spec.max_new_tokens // canvas) * canvas
            if need > limit:
                raise BackendError(f"a prompt of {len(ids)} tokens + {spec.max_new_tokens} new tokens (whole canvases of "
                                   f"{canvas}) exceeds the model's {limit} positions; lower max_new_tokens")
        out: list[list[Completion]] = []
        for ids in encoded:
            row = []
            for si in range(spec.n):
                row.append(self._generate_row(ids, spec, row_seed(spec.seed, ids, si)))
                if on_progress is not None:
                    on_progress(1, row[-1].n_tokens)
            out.append(row)
        return out

    def _generate_row(self, ids: list[int], spec: SamplingSpec, seed: int) -> Completion:
        import torch

        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        torch.manual_seed(seed)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._nfe = 0
        t0 = time.perf_counter()
        try:
            if self.tadm is None:
                result = self.model.generate(input_ids, **self.generation_kwargs(spec.max_new_tokens))
            else:
                result = self.tadm.generate(input_ids, **self.generation_kwargs(spec.max_new_tokens))
        except ValueError as exc:  # transformers' generation-config checks
            raise BackendError(f"DiffusionGemma generate failed: {exc}") from exc
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - t0
        meta = self._meta()
        return self._finish(result.sequences[0, len(ids):].tolist(), spec.stop, seconds, meta)

    def _meta(self) -> dict[str, Any]:
        if self.tadm is not None:
            counts = self.tadm.counters.to_dict()
        else:
            layers = int(self.model.config.get_text_config().num_hidden_layers)
            counts = {"nfe": self._nfe, "anchor_refreshes": None, "decoder_layer_calls": self._nfe * layers,
                      "anchor_layer_calls": None, "base_decoder_layer_calls": self._nfe * layers, "fusion_calls": 0,
                      "canvases": None, "confidence_refreshes": None}
        return {**counts, "anchor_refresh_every": None if self.tadm is None else self.tadm.refresh_every,
                "anchor_refresh_below": None if self.tadm is None else self.tadm.refresh_below}

    def _finish(self, tokens: list[int], stop: list[str], seconds: float, meta: dict[str, Any]) -> Completion:
        eos = self.tokenizer.eos_token_id
        ended = eos in tokens
        kept = [t for t in (tokens[: tokens.index(eos)] if ended else tokens) if t not in self.strip_ids]
        decode = lambda toks: self.tokenizer.decode(toks, skip_special_tokens=False)
        text, stopped = cut_at_stop(decode(kept), stop)
        n_tokens = len(kept)
        if stopped:  # the fewest tokens whose text already holds the stop string
            n_tokens = next(k for k in range(1, len(kept) + 1) if cut_at_stop(decode(kept[:k]), stop)[1])
        return Completion(text=text, n_tokens=n_tokens, seconds=seconds,
                          finish_reason="stop" if (ended or stopped) else "length", meta=meta)


__all__ = ["DiffusionGemmaBackend"]
