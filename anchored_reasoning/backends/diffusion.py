"""Masked-diffusion backend: the eval runner's ``Backend`` for MDLM/ADLM checkpoints (and LLaDA/Dream
style models through :mod:`anchored_reasoning.sampling.adapters`).

>>> from anchored_reasoning.backends import get_backend
>>> backend = get_backend("diffusion", "runs/adlm-prosqa", sampler="low_confidence", steps=32, block_length=16)
>>> backend.generate([Prompt("Is Tom a lempus or a gorpus?\\n[BoR]")], SamplingSpec(max_new_tokens=64))

    anchored-reasoning eval --task prosqa --model runs/adlm-prosqa --backend diffusion \\
        --backend-arg sampler=remdm --backend-arg steps=64 --out runs/eval-adlm

How a prompt becomes a completion:

* the prompt is tokenized exactly as the diffusion trainer tokenizes SFT prompts
  (``tokenizer(text)``; with ``chat=auto`` and chat ``messages``, the tokenizer's chat template);
* ``gen_length`` mask tokens are appended and denoised by the sampler (``sampler``: ``ancestral``,
  ``low_confidence``, ``random``, ``remdm`` or ``threshold``; see
  :mod:`anchored_reasoning.sampling.samplers`). ``gen_length`` is the backend option when given,
  else the window the checkpoint was fine-tuned with (``gen_length`` in its ``anchored_reasoning.json``,
  from ``training.response_length``), capped by the run's ``max_new_tokens``; otherwise ``max_new_tokens``. ``steps`` defaults to
  ``gen_length`` (one token per step); ``block_length`` defaults to one block;
* the text is cut at the first EOS, then at the earliest stop string; ``n_tokens`` counts the
  generated tokens up to that point (EOS excluded); ``finish_reason`` is ``"stop"`` when EOS or a
  stop string ended it, else ``"length"``;
* a prompt whose length plus ``gen_length`` exceeds the model's context raises
  :class:`~anchored_reasoning.errors.BackendError`, unless ``fit`` says otherwise: ``shrink``
  shortens the generation window to what fits (a prompt that fills the whole context is still an
  error); ``truncate`` keeps the *last* ``context - gen_length`` prompt tokens (the question's end
  and the answer cue survive). Both are logged as warnings and recorded as ``finish_reason``
  ``"shrunk"`` / ``"truncated_prompt"`` when the completion did not end by itself;
* determinism: greedy decoding with a deterministic sampler (``low_confidence`` / ``threshold`` at
  temperature 0) runs prompts in batches; any sampler that draws random numbers (temperature > 0,
  ``ancestral``, ``random``, ``remdm``) runs each (prompt, sample) row alone with a seed derived
  from (seed, prompt tokens, sample index), so a row's output never depends on its batch
  (a resumed run draws the same samples);
* ``on_progress(done_samples, new_tokens)`` (optional, :data:`~anchored_reasoning.backends.ProgressFn`)
  hears after every denoising step how many positions were unmasked in it, and each batch's samples
  when the batch ends;
* every :class:`~anchored_reasoning.types.Completion` carries ``meta`` (the runner writes it into each
  record): ``nfe`` (the model calls the row was in; greedy, a call skips the batch's rows whose block
  is done), ``batch_nfe`` (its batch's calls), ``steps``, ``gen_length``, ``decoded_tokens`` (window positions the model decoded, positions filled with EOS
  after an ended row excluded), ``tokens_per_forward`` (``decoded_tokens / nfe``, the dllm
  leaderboard's TPF) and ``batch_rows``; a run's summary aggregates them under ``denoiser``.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from anchored_reasoning.backends import ProgressFn, cut_at_stop, left_pad, per_prompt_samples
from anchored_reasoning.checkpoints import read_checkpoint_meta
from anchored_reasoning.errors import BackendError, ConfigError, DataError
from anchored_reasoning.types import Completion, Prompt, SamplingSpec

log = logging.getLogger(__name__)

FIT_POLICIES = ("error", "shrink", "truncate")
_DETERMINISTIC_GREEDY = ("low_confidence", "threshold")


class DiffusionBackend:
    """Generation with a masked diffusion LM and one of the library's samplers.

    ``model``: a checkpoint directory / Hub id (loaded with
    :func:`~anchored_reasoning.sampling.load_masked_diffusion_model`) or an already built model
    (then pass ``tokenizer``). Other keyword options are :class:`SamplerConfig` fields
    (``eta``, ``t_on``, ``t_off``, ``alpha_on``, ``threshold``, ``top_k``, ``stop_at_eos``,
    ``anchor_refresh_every``, ``anchor_refresh_below``, ``kv_cache``). With an anchor cache,
    :attr:`anchor_refresh_fraction` is the share of rows x model calls that ran the anchor network.
    """

    name = "diffusion"

    def __init__(
        self,
        model: Any,
        *,
        sampler: str = "low_confidence",
        steps: int | None = None,
        gen_length: int | None = None,
        block_length: int | None = None,
        batch_size: int = 16,
        device: str | None = None,
        dtype: str | None = None,
        tokenizer: Any = None,
        chat: bool | str = "auto",
        fit: str = "error",
        seed: int = 0,
        trust_remote_code: bool = False,
        mask_token_id: int | None = None,
        **sampler_options: Any,
    ) -> None:
        import torch

        from anchored_reasoning.sampling import SamplerConfig

        if int(batch_size) < 1:
            raise ConfigError(f"backend option batch_size={batch_size!r} must be >= 1")
        if fit not in FIT_POLICIES:
            raise ConfigError(f"backend option fit={fit!r}: choose one of {FIT_POLICIES}")
        for key, value in (("steps", steps), ("gen_length", gen_length), ("block_length", block_length)):
            if value is not None and int(value) < 1:
                raise ConfigError(f"backend option {key}={value!r} must be >= 1")
        known = {f.name for f in dataclasses.fields(SamplerConfig)} - {"remasking", "steps", "gen_length", "block_length",
                                                                         "temperature", "top_p", "seed", "eos_token_id"}
        unknown = set(sampler_options) - known
        if unknown:
            raise ConfigError(f"diffusion backend: unknown option(s) {sorted(unknown)}; sampler options are {sorted(known)}")
        self.batch_size = int(batch_size)
        self._refreshed = [0, 0]  # anchor-network rows x calls, rows x calls (anchor-cached batches)
        self.steps = int(steps) if steps is not None else None
        self.gen_length = int(gen_length) if gen_length is not None else None
        self.block_length = int(block_length) if block_length is not None else None
        self.fit = fit
        self.seed = int(seed)
        self.chat_mode = chat
        self.sampler_options = {"stop_at_eos": True, **sampler_options}
        self.base_config = SamplerConfig(remasking=sampler, **{k: v for k, v in sampler_options.items() if k != "stop_at_eos"})
        self.sampler = self.base_config.remasking
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        torch_dtype = {None: None, "auto": None, "float32": torch.float32, "fp32": torch.float32,
                       "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16}
        if dtype not in torch_dtype:
            raise ConfigError(f"backend option dtype={dtype!r}: use auto, float32, bfloat16 or float16")
        if isinstance(model, (str,)) or hasattr(model, "__fspath__"):
            from transformers import AutoTokenizer

            from anchored_reasoning.models.zoo import resolve_model
            from anchored_reasoning.sampling import load_masked_diffusion_model

            self.model_arg = str(model)
            self.model_path = resolve_model(str(model))
            try:
                self.model = load_masked_diffusion_model(self.model_path, trust_remote_code=trust_remote_code,
                                                         dtype=torch_dtype[dtype], mask_token_id=mask_token_id)
                self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(self.model_path, trust_remote_code=trust_remote_code)
            except OSError as exc:
                raise BackendError(f"could not load diffusion model {self.model_arg!r} ({self.model_path}): {exc}. "
                                   "Give a checkpoint directory written by `anchored-reasoning train` or a reachable Hub id.") from exc
        else:
            if tokenizer is None:
                raise ConfigError("DiffusionBackend(model=<a model object>) needs tokenizer=...")
            self.model_arg = type(model).__name__
            self.model_path = None
            self.model = model
            self.tokenizer = tokenizer
        self.model.to(self.device)
        self.model.eval()
        tok = self.tokenizer
        if tok.eos_token_id is None:
            raise ConfigError(f"the tokenizer of {self.model_arg} has no EOS token; diffusion outputs are cut at EOS")
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        from anchored_reasoning.sampling import model_info

        self.mask_token_id, self.max_length = model_info(self.model)
        self.strip_ids = {i for i in (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, self.mask_token_id) if i is not None}
        if self.gen_length is None and self.model_path is not None:
            trained = (read_checkpoint_meta(self.model_path) or {}).get("gen_length")
            if trained:  # the fixed response window the checkpoint was fine-tuned to fill
                self.gen_length = int(trained)
        self._revision = None
        if self.model_path is not None:
            from anchored_reasoning.backends.hf import local_fingerprint

            self._revision = local_fingerprint(self.model_path)
        log.info("diffusion backend: %s on %s, sampler %s, batch size %d", self.model_arg, self.device, self.sampler, self.batch_size)

    # -- helpers --------------------------------------------------------------------------
    def encode(self, prompt: Prompt) -> list[int]:
        tok = self.tokenizer
        use_chat = bool(prompt.messages) and self.chat_mode not in (False, "off", "false", "no") and getattr(tok, "chat_template", None)
        if use_chat:
            text = tok.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=False)
            return list(tok(text, add_special_tokens=False)["input_ids"])
        return list(tok(prompt.text)["input_ids"])

    def fit_prompt(self, ids: list[int], spec: SamplingSpec) -> tuple[list[int], int, str | None]:
        """(prompt ids, generation window, adjustment or None) for one prompt (see the module doc)."""
        gen = min(self.gen_length, spec.max_new_tokens) if self.gen_length else spec.max_new_tokens
        if self.fit == "truncate" and self.max_length is not None and len(ids) + gen > self.max_length:
            keep = self.max_length - gen
            if keep < 1:
                raise BackendError(f"the generation window {gen} leaves no room for a prompt in the model's context "
                                   f"({self.max_length}); lower max_new_tokens / gen_length")
            log.warning("prompt of %d tokens truncated to its last %d to fit the context of %d with a window of %d",
                        len(ids), keep, self.max_length, gen)
            return ids[-keep:], gen, "truncated_prompt"
        window = self.window(len(ids), spec)
        return ids, window, ("shrunk" if window < gen else None)

    def window(self, prompt_len: int, spec: SamplingSpec) -> int:
        """The generation window for a prompt of ``prompt_len`` tokens (see the module doc)."""
        gen = min(self.gen_length, spec.max_new_tokens) if self.gen_length else spec.max_new_tokens
        if self.max_length is None:
            return gen
        if prompt_len >= self.max_length:
            raise BackendError(f"the prompt is {prompt_len} tokens and fills the model's whole context "
                               f"({self.max_length}); nothing can be generated. Shorten the prompt.")
        if prompt_len + gen > self.max_length:
            if self.fit == "shrink":
                log.warning("prompt of %d tokens: generation window shrunk from %d to %d to fit the context of %d",
                            prompt_len, gen, self.max_length - prompt_len, self.max_length)
                return self.max_length - prompt_len
            raise BackendError(
                f"prompt of {prompt_len} tokens + generation window {gen} exceeds the model's context "
                f"({self.max_length}); lower max_new_tokens / gen_length, or pass --backend-arg fit=shrink "
                "(shorter window) or fit=truncate (keep the prompt's end)")
        return gen

    def sampler_config(self, gen_length: int, spec: SamplingSpec, seed: int):
        steps = self.steps or gen_length
        block = self.block_length if self.block_length and self.block_length < gen_length else None
        if block is not None:
            n_blocks = -(-gen_length // block)
            steps = max(steps, n_blocks)
        return self.base_config.replace(
            steps=max(1, steps), gen_length=gen_length, block_length=block, temperature=max(0.0, spec.temperature),
            top_p=spec.top_p if spec.top_p > 0 else 1.0, seed=seed, eos_token_id=self.tokenizer.eos_token_id,
            stop_at_eos=bool(self.sampler_options.get("stop_at_eos", True)),
        )

    def describe(self) -> dict[str, Any]:
        cfg = dataclasses.asdict(self.base_config)
        for key in ("steps", "gen_length", "block_length", "temperature", "top_p", "seed", "eos_token_id"):
            cfg.pop(key, None)
        return {
            "backend": self.name,
            "model": self.model_path or self.model_arg,
            "model_arg": self.model_arg,
            "revision": self._revision,
            "sampler": self.sampler,
            "steps": self.steps,
            "gen_length": self.gen_length,
            "block_length": self.block_length,
            "fit": self.fit,
            "sampler_options": {**cfg, "stop_at_eos": bool(self.sampler_options.get("stop_at_eos", True))},
            "device": str(self.device),
            "batch_size": self.batch_size,
        }

    def _random(self, spec: SamplingSpec) -> bool:
        return not spec.greedy or self.sampler not in _DETERMINISTIC_GREEDY

    # -- generation -----------------------------------------------------------------------
    def generate(self, prompts: list[Prompt], spec: SamplingSpec, *,
                 on_progress: ProgressFn | None = None) -> list[list[Completion]]:
        from anchored_reasoning.backends.hf import row_seed

        if spec.n < 1:
            raise ConfigError(f"n={spec.n}: ask for at least one sample per prompt")
        if spec.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens={spec.max_new_tokens}: must be >= 1")
        fitted = [self.fit_prompt(self.encode(p), spec) for p in prompts]  # every prompt checked before any work
        encoded = [f[0] for f in fitted]
        windows = [f[1] for f in fitted]
        adjusted = [f[2] for f in fitted]
        random_rows = self._random(spec)
        copies = spec.n if random_rows else 1
        report = _StepReport(on_progress, spec.n // copies) if on_progress is not None else None
        rows = [(pi, si) for pi in range(len(prompts)) for si in range(copies)]
        rows.sort(key=lambda r: (-len(encoded[r[0]]), windows[r[0]], r))
        results: dict[tuple[int, int], Completion] = {}
        if random_rows:  # one row per call: a row's draws never depend on its batch
            for pi, si in rows:
                seed = row_seed(spec.seed, encoded[pi], si)
                results[(pi, si)] = self._generate_batch([encoded[pi]], windows[pi], spec, seed, [spec.stop], report)[0]
        else:
            groups: dict[int, list[tuple[int, int]]] = {}
            for r in rows:
                groups.setdefault(windows[r[0]], []).append(r)
            for window, members in groups.items():
                for start in range(0, len(members), self.batch_size):
                    batch = members[start : start + self.batch_size]
                    outs = self._generate_batch([encoded[pi] for pi, _ in batch], window, spec, spec.seed,
                                                [spec.stop] * len(batch), report)
                    results.update(zip(batch, outs))
        for (pi, si), c in results.items():
            if adjusted[pi] and c.finish_reason == "length":
                c.finish_reason = adjusted[pi]
        return per_prompt_samples(results, len(prompts), spec.n, shared=copies == 1)

    def _generate_batch(self, ids: list[list[int]], gen_length: int, spec: SamplingSpec, seed: int,
                        stops: list[list[str]], report: "_StepReport | None" = None) -> list[Completion]:
        import torch

        from anchored_reasoning.sampling import sample

        input_ids, mask = left_pad(ids, self.tokenizer.pad_token_id)
        width = input_ids.shape[1]
        cfg = self.sampler_config(gen_length, spec, seed)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        callback = report.batch(width, self.mask_token_id) if report is not None else None
        try:
            out, _stats = sample(self.model, input_ids.to(self.device), cfg,
                                 attention_mask=mask.to(self.device) if not bool(mask.all()) else None, callback=callback)
        except (ConfigError, DataError) as exc:
            raise BackendError(f"diffusion sampling failed: {exc}") from exc
        if report is not None:
            report.finished(len(ids))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        share = (time.perf_counter() - t0) / len(ids)
        if _stats.row_calls:
            self._refreshed[0] += _stats.anchor_rows
            self._refreshed[1] += _stats.row_calls
        gen = out[:, width:].tolist()
        return [self._finish(tokens, stop, share, _row_meta(_stats, r, len(ids)))
                for r, (tokens, stop) in enumerate(zip(gen, stops))]

    @property
    def anchor_refresh_fraction(self) -> float | None:
        """Rows x model calls that ran the anchor network, over rows x calls, over every batch so far
        with an anchor cache (1/K for K-periodic refresh); None when none had one."""
        return self._refreshed[0] / self._refreshed[1] if self._refreshed[1] else None

    def _finish(self, tokens: list[int], stop: list[str], seconds: float, meta: dict[str, Any] | None = None) -> Completion:
        """Cut at the first EOS, then at the earliest stop string; count the tokens kept."""
        eos = self.tokenizer.eos_token_id
        ended = eos in tokens
        kept = tokens[: tokens.index(eos)] if ended else tokens
        decode = lambda toks: self.tokenizer.decode([t for t in toks if t not in self.strip_ids], skip_special_tokens=False)
        text, stopped = cut_at_stop(decode(kept), stop)
        n_tokens = len(kept)
        if stopped:  # the fewest tokens whose text already holds the stop string
            for k in range(1, len(kept) + 1):
                if cut_at_stop(decode(kept[:k]), stop)[1]:
                    n_tokens = k
                    break
        return Completion(text=text, n_tokens=n_tokens, seconds=seconds, finish_reason="stop" if (ended or stopped) else "length",
                          meta=meta)


def _row_meta(stats: Any, row: int, rows: int) -> dict[str, Any]:
    """Row ``row``'s denoiser counters (the module doc): NFE is the model calls it was in (a call skips
    rows whose block is done); ``decoded_tokens`` the window positions the model decoded (EOS fill
    excluded); ``tokens_per_forward`` their ratio (the dllm leaderboard's TPF); ``batch_nfe`` its
    batch's calls."""
    decoded = stats.gen_length - stats.filled_after_eos[row]
    nfe = stats.calls_of_row[row]
    return {"nfe": nfe, "batch_nfe": stats.nfe, "steps": stats.steps, "gen_length": stats.gen_length,
            "decoded_tokens": decoded, "tokens_per_forward": decoded / nfe if nfe else None, "batch_rows": rows}


class _StepReport:
    """Turns the sampler's per-step callback into ``on_progress`` calls: the positions unmasked since
    the previous step (a re-masked one counts once, when first revealed), and a batch's rows times
    ``weight`` (samples per row) when it ends."""

    def __init__(self, on_progress: ProgressFn, weight: int) -> None:
        self.on_progress = on_progress
        self.weight = weight
        self._seen = 0

    def batch(self, prompt_width: int, mask_id: int):
        self._seen = 0

        def step(_step: int, x) -> None:
            decoded = int((x[:, prompt_width:] != mask_id).sum())
            if decoded > self._seen:
                self.on_progress(0, (decoded - self._seen) * self.weight)
                self._seen = decoded
        return step

    def finished(self, rows: int) -> None:
        self.on_progress(rows * self.weight, 0)


__all__ = ["DiffusionBackend", "FIT_POLICIES"]
