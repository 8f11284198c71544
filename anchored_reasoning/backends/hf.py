"""Local Hugging Face transformers backend for autoregressive models.

>>> from anchored_reasoning.backends import get_backend
>>> backend = get_backend("hf", "smollm2-135m", batch_size=16)
>>> backend.generate([Prompt("2+2=")], SamplingSpec(max_new_tokens=8))

How it generates:

* prompts (times ``spec.n`` samples when sampling) are sorted by token length and cut into
  batches of ``batch_size`` rows, left-padded, and decoded together with ``model.generate``;
  results come back in the caller's order; a batch's prompt pass runs in groups of similar length
  (:mod:`~anchored_reasoning.backends.hf_prefill`), so a short prompt does not pay the longest one's padding;
* greedy decoding (``temperature <= 0``) is plain argmax; ``n`` greedy samples are one
  generation, copied;
* sampling (temperature / top-p) is done by our own logits processor with one
  ``torch.Generator`` per row, seeded from (seed, prompt tokens, sample index), so a sample
  does not depend on which other prompts share its batch: rerunning a subset (a resumed run)
  draws the same samples, up to floating-point differences of padded batches;
* stop strings end a row early (a stopping criterion decodes each row's tail) and are cut from
  the returned text; EOS / pad / BOS tokens are removed, other special tokens kept (trained
  formats use them);
* each completion reports its generated-token count and a fair share of its batch's wall
  time (every decoding step's time is split among the rows still running in it);
* ``on_progress(done_samples, new_tokens)`` (optional, :data:`~anchored_reasoning.backends.ProgressFn`)
  hears after every decoding step how many tokens the running rows generated and how many rows
  finished (EOS or a stop string); rows cut at ``max_new_tokens`` count as done when their batch ends.
"""
from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path
from typing import Any

from anchored_reasoning.backends import ProgressFn, cut_at_stop, left_pad, per_prompt_samples
from anchored_reasoning.backends.hf_prefill import bucketed_prefill
from anchored_reasoning.backends.latent import generation_inputs
from anchored_reasoning.errors import BackendError, ConfigError
from anchored_reasoning.models.zoo import resolve_model
from anchored_reasoning.types import Completion, Prompt, SamplingSpec

log = logging.getLogger(__name__)
_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)

_CHAT_MODES = {"auto": "auto", "on": True, "true": True, "yes": True, "off": False, "false": False, "no": False}


def _parse_chat(chat: Any) -> bool | str:
    if isinstance(chat, bool):
        return chat
    key = str(chat).strip().lower()
    if key not in _CHAT_MODES:
        raise ConfigError(f"backend option chat={chat!r}: use auto, on or off")
    return _CHAT_MODES[key]


def local_fingerprint(path: str | Path) -> str | None:
    """A cheap identity for a local checkpoint: sha256 over config.json and the size plus the
    first and last MiB of every weight file. None when ``path`` is not a local directory."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    h = hashlib.sha256()
    config = folder / "config.json"
    if config.is_file():
        h.update(config.read_bytes())
    for weights in sorted(list(folder.glob("*.safetensors")) + list(folder.glob("*.bin"))):
        size = weights.stat().st_size
        h.update(f"{weights.name}:{size}".encode())
        with open(weights, "rb") as f:
            h.update(f.read(1 << 20))
            if size > (1 << 20):
                f.seek(max(size - (1 << 20), 1 << 20))
                h.update(f.read(1 << 20))
    return "local-sha256:" + h.hexdigest()[:16]


def row_seed(seed: int, token_ids: list[int], sample_index: int) -> int:
    """The sampling seed of one (prompt, sample) row, independent of batching."""
    h = hashlib.sha256(f"{seed}:{sample_index}:".encode())
    h.update(",".join(map(str, token_ids)).encode())
    return int.from_bytes(h.digest()[:8], "little") & ((1 << 63) - 1)


class HFBackend:
    """Batched generation with a local ``AutoModelForCausalLM``.

    ``model`` is a local directory, a Hub id or an alias (``smollm2-135m``).
    ``device`` defaults to CUDA when available, else CPU; ``dtype="auto"`` means bfloat16 on
    CUDA and float32 on CPU. ``chat="auto"`` applies the tokenizer's chat template when it has
    one and the prompt carries chat ``messages``; ``"on"`` requires a template; ``"off"``
    always feeds ``Prompt.text``.
    """

    name = "hf"
    #: run each batch's prompt pass in length buckets (backends/hf_prefill.py); False: one padded pass
    bucket_prefill = True

    def __init__(
        self,
        model: str,
        *,
        device: str | None = None,
        dtype: str | None = None,
        batch_size: int = 16,
        chat: bool | str = "auto",
        trust_remote_code: bool = False,
        revision: str | None = None,
        seed: int = 0,
    ) -> None:
        import torch
        from transformers import AutoTokenizer

        if int(batch_size) < 1:
            raise ConfigError(f"backend option batch_size={batch_size!r} must be >= 1")
        self.model_arg = str(model)
        self.model_path = resolve_model(model)
        self.batch_size = int(batch_size)
        self.chat_mode = _parse_chat(chat)
        self.seed = int(seed)
        self.revision = revision
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"backend option device={device!r}, but torch sees no CUDA device; use device=cpu")
        self.dtype = self._pick_dtype(dtype)
        torch.manual_seed(self.seed)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(
                self.model_path, trust_remote_code=trust_remote_code, revision=revision
            )
            from anchored_reasoning.models.adapters import load_causal_lm  # a LoRA folder: its base + the adapter

            self.model = load_causal_lm(
                self.model_path, dtype=self.dtype, trust_remote_code=trust_remote_code, revision=revision
            )
        except OSError as exc:
            raise BackendError(
                f"could not load model {self.model_arg!r} (resolved to {self.model_path!r}): {exc}. "
                "Give a local checkpoint directory, an alias, or a Hub id reachable from this machine."
            ) from exc
        self.model.to(self.device)
        self.model.eval()
        self._setup(revision)

    @classmethod
    def from_loaded(cls, model: Any, tokenizer: Any, *, batch_size: int = 16, seed: int = 0, name: str = "in-memory") -> "HFBackend":
        """A backend around a model and tokenizer already in memory (e.g. during training, for
        validation through the same generation path as evaluation). The model stays on its device,
        in its dtype and mode; the caller puts it in eval mode."""
        import torch

        if int(batch_size) < 1:
            raise ConfigError(f"backend option batch_size={batch_size!r} must be >= 1")
        self = cls.__new__(cls)
        self.model_arg = self.model_path = str(name)
        self.batch_size, self.chat_mode, self.seed, self.revision = int(batch_size), False, int(seed), None
        self.model, self.tokenizer = model, tokenizer
        param = next(model.parameters(), None)
        self.device = param.device if param is not None else torch.device("cpu")
        self.dtype = param.dtype if param is not None else torch.float32
        self._setup(None)
        return self

    def _setup(self, revision: str | None) -> None:
        tok = self.tokenizer
        if tok.pad_token_id is None:
            if tok.eos_token_id is None:
                raise ConfigError(f"tokenizer of {self.model_path} has neither a pad nor an EOS token")
            tok.pad_token = tok.eos_token
        self.eos_ids = self._eos_ids()
        self.strip_ids = {i for i in (tok.pad_token_id, tok.bos_token_id, *self.eos_ids) if i is not None}
        if self.chat_mode is True and not getattr(tok, "chat_template", None):
            raise ConfigError(f"backend option chat=on, but the tokenizer of {self.model_path} has no chat template")
        self._revision = revision or getattr(self.model.config, "_commit_hash", None) or local_fingerprint(self.model_path)
        log.info("hf backend: %s on %s (%s), batch size %d", self.model_path, self.device, self.dtype, self.batch_size)

    # -- set-up helpers -------------------------------------------------------------------
    def _pick_dtype(self, dtype: str | None):
        import torch

        if dtype is None or dtype == "auto":
            return torch.bfloat16 if self.device.type == "cuda" else torch.float32
        table = {
            "float32": torch.float32, "fp32": torch.float32,
            "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
            "float16": torch.float16, "fp16": torch.float16,
        }
        if dtype not in table:
            raise ConfigError(f"backend option dtype={dtype!r}: use auto, float32, bfloat16 or float16")
        return table[dtype]

    def _eos_ids(self) -> list[int]:
        ids: list[int] = []
        for value in (getattr(self.model.generation_config, "eos_token_id", None), self.tokenizer.eos_token_id):
            if value is None:
                continue
            for v in value if isinstance(value, (list, tuple)) else [value]:
                if v not in ids:
                    ids.append(int(v))
        return ids

    def uses_chat(self, prompt: Prompt) -> bool:
        if not prompt.messages or self.chat_mode is False:
            return False
        return bool(getattr(self.tokenizer, "chat_template", None))

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids the model sees for ``prompt`` (chat-templated or raw text)."""
        tok = self.tokenizer
        if self.uses_chat(prompt):
            text = tok.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=False)
            return list(tok(text, add_special_tokens=False)["input_ids"])
        return list(tok(prompt.text)["input_ids"])

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "model": self.model_path,
            "model_arg": self.model_arg,
            "revision": self._revision,
            "dtype": str(self.dtype).replace("torch.", ""),
            "chat": self.chat_mode,
            "device": str(self.device),
            "batch_size": self.batch_size,
        }

    # -- generation -----------------------------------------------------------------------
    def generate(self, prompts: list[Prompt], spec: SamplingSpec, *,
                 on_progress: ProgressFn | None = None) -> list[list[Completion]]:
        if spec.n < 1:
            raise ConfigError(f"n={spec.n}: ask for at least one sample per prompt")
        if spec.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens={spec.max_new_tokens}: must be >= 1")
        encoded = [self.encode(p) for p in prompts]
        for i, ids in enumerate(encoded):
            if not ids:
                if self.tokenizer.bos_token_id is None:
                    raise ConfigError(f"prompt {i} is empty and the tokenizer has no BOS token to start from")
                encoded[i] = [self.tokenizer.bos_token_id]
        copies = 1 if spec.greedy else spec.n
        rows = [(pi, si) for pi in range(len(prompts)) for si in range(copies)]
        # Longest first: similar lengths share a batch (less padding), and an out-of-memory shows up at once.
        rows.sort(key=lambda r: (-len(encoded[r[0]]), r))
        results: dict[tuple[int, int], Completion] = {}
        limit = self.max_positions()
        if limit is not None:  # a prompt that fills the position table leaves no room: an empty, cut completion
            full = [r for r in rows if len(encoded[r[0]]) >= limit]
            if full:
                log.warning("%d prompt(s) of %d+ tokens fill the model's %d positions: nothing generated for them "
                            "(finish_reason 'length')", len(full), min(len(encoded[r[0]]) for r in full), limit)
            results.update((r, Completion(text="", n_tokens=0, seconds=0.0, finish_reason="length")) for r in full)
            rows = [r for r in rows if r not in results]
        weight = spec.n if spec.greedy else 1  # a greedy row stands for all n samples of its prompt
        if on_progress is not None and results:
            on_progress(len(results) * weight, 0)
        for start in range(0, len(rows), self.batch_size):
            batch = rows[start : start + self.batch_size]
            outs = self._generate_batch([encoded[pi] for pi, _ in batch], [si for _, si in batch], spec,
                                        on_progress, weight)
            results.update(zip(batch, outs))
        return per_prompt_samples(results, len(prompts), spec.n, shared=spec.greedy)

    def max_positions(self) -> int | None:
        """The length of a learned position table (GPT-2's ``n_positions``): generation cannot go past it. None
        for models without one (rotary position models state a length they can run past)."""
        value = getattr(getattr(self.model, "config", None), "n_positions", None)
        return value if isinstance(value, int) and value > 0 else None

    def _generate_batch(self, ids: list[list[int]], sample_idx: list[int], spec: SamplingSpec,
                        on_progress: ProgressFn | None = None, weight: int = 1) -> list[Completion]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        pad = self.tokenizer.pad_token_id
        input_ids, mask = left_pad(ids, pad)
        width = input_ids.shape[1]
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        tracker = _RowTracker(self.tokenizer, width, self.eos_ids, spec.stop, on_progress, weight)
        processors = LogitsProcessorList()
        if not spec.greedy:
            seeds = [row_seed(spec.seed, x, s) for x, s in zip(ids, sample_idx)]
            processors.append(_SeededSampler(seeds, spec.temperature, spec.top_p, self.device))
        budget = spec.max_new_tokens
        limit = self.max_positions()
        if limit is not None and width + budget > limit:  # past the position table the model cannot go
            budget = limit - width  # >= 1: generate() keeps prompts that fill the table out of batches
            _warn_once(f"positions-{limit}", f"max_new_tokens={spec.max_new_tokens} is cut to the room the model's "
                       f"{limit} positions leave a batch (here {budget}, its longest prompt having {width} tokens); "
                       "completions cut there end with finish_reason 'length' (said once)")
        config = GenerationConfig(
            max_new_tokens=budget,
            do_sample=False,  # sampling, when asked for, happens in _SeededSampler
            pad_token_id=pad,
            eos_token_id=self.eos_ids or None,
            bos_token_id=self.tokenizer.bos_token_id,
        )
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        try:
            with torch.inference_mode():
                # continuous thoughts (Coconut, backends/latent.py): <thought> embeddings filled by the latent passes
                prompt = generation_inputs(self.model, self.tokenizer, input_ids, mask) or {"input_ids": input_ids}
                if "past_key_values" not in prompt and self.bucket_prefill:  # the prompt pass in length buckets
                    prompt["past_key_values"] = bucketed_prefill(self.model, ids, pad)  # (hf_prefill.py)
                out = self.model.generate(
                    **prompt,
                    attention_mask=mask,
                    generation_config=config,
                    logits_processor=processors,
                    stopping_criteria=StoppingCriteriaList([tracker]),
                )
        except torch.cuda.OutOfMemoryError as exc:  # pragma: no cover - needs a GPU
            raise BackendError(
                f"CUDA out of memory generating a batch of {len(ids)} prompts (longest {width} tokens); "
                "lower --batch-size or --max-new-tokens"
            ) from exc
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        wall = time.perf_counter() - t0
        if on_progress is not None:  # the rows cut at the token budget are done now
            on_progress((len(ids) - len(tracker.finished_at)) * weight, 0)
        gen = out[:, width:].tolist()
        steps = len(gen[0]) if gen else 0
        lengths = [tracker.finished_at.get(r, steps) for r in range(len(ids))]
        shares = fair_shares(lengths, wall)
        completions = []
        for r, tokens in enumerate(gen):
            kept = [t for t in tokens[: lengths[r]] if t not in self.strip_ids]
            text = self.tokenizer.decode(kept, skip_special_tokens=False)
            text, stopped = cut_at_stop(text, spec.stop)
            if stopped or r in tracker.finished_at:
                reason = "stop"
            else:
                reason = "length"
            completions.append(Completion(text=text, n_tokens=lengths[r], seconds=shares[r], finish_reason=reason))
        return completions


def fair_shares(lengths: list[int], wall: float) -> list[float]:
    """Split ``wall`` seconds among rows that ran ``lengths[i]`` decoding steps: the prompt pass
    is shared equally, and each later step's time among the rows still running in it."""
    rows = len(lengths)
    if rows == 0:
        return []
    weights = [1.0 / rows] * rows  # the first step (prompt pass + first token) is shared by all
    longest = max(lengths)
    for step in range(1, longest):
        active = [i for i, n in enumerate(lengths) if n > step]
        for i in active:
            weights[i] += 1.0 / len(active)
    total = sum(weights)
    return [wall * w / total for w in weights]


class _RowTracker:
    """Stopping criterion: marks a row done at EOS or when its decoded tail holds a stop string,
    and records how many tokens it had generated then (``finished_at``). With ``on_progress``, tells it
    after every step the tokens the running rows generated and the rows that finished (times ``weight``)."""

    def __init__(self, tokenizer, prompt_width: int, eos_ids: list[int], stop: list[str],
                 on_progress: ProgressFn | None = None, weight: int = 1) -> None:
        self.tokenizer = tokenizer
        self.prompt_width = prompt_width
        self.eos_ids = set(eos_ids)
        self.stop = [s for s in stop if s]
        # Every ordinary token decodes to at least one character, so this many tokens cover a stop string.
        self.window = max((len(s) for s in self.stop), default=0) + 2
        self.finished_at: dict[int, int] = {}
        self.on_progress = on_progress
        self.weight = weight

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        step = input_ids.shape[1] - self.prompt_width
        finished_before = len(self.finished_at)
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        last = input_ids[:, -1].tolist()
        for r in range(input_ids.shape[0]):
            if r in self.finished_at:
                done[r] = True
                continue
            if last[r] in self.eos_ids:
                self.finished_at[r] = step
                done[r] = True
            elif self.stop:
                start = max(self.prompt_width, input_ids.shape[1] - self.window)
                tail = self.tokenizer.decode(input_ids[r, start:].tolist(), skip_special_tokens=False)
                if any(s in tail for s in self.stop):
                    self.finished_at[r] = step
                    done[r] = True
        if self.on_progress is not None:  # every row running before this step generated one token in it
            self.on_progress((len(self.finished_at) - finished_before) * self.weight,
                             (input_ids.shape[0] - finished_before) * self.weight)
        return done


class _SeededSampler:
    """Logits processor that samples each row with its own generator (temperature, top-p) and
    returns scores that are -inf everywhere except the drawn token, so greedy selection in
    ``generate`` picks it. Makes samples independent of batch composition."""

    def __init__(self, seeds: list[int], temperature: float, top_p: float, device) -> None:
        import torch

        if not 0.0 < top_p <= 1.0:
            raise ConfigError(f"top_p={top_p}: must be in (0, 1]")
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.generators = []
        for s in seeds:
            g = torch.Generator(device=device)
            g.manual_seed(s)
            self.generators.append(g)

    def __call__(self, input_ids, scores):
        import torch

        probs = torch.softmax(scores.float() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            sorted_p, order = torch.sort(probs, dim=-1, descending=True)
            keep = (sorted_p.cumsum(-1) - sorted_p) < self.top_p  # the top token is always kept
            sorted_p = sorted_p * keep
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        chosen = torch.empty(scores.shape[0], dtype=torch.long, device=scores.device)
        for r, g in enumerate(self.generators):
            chosen[r] = torch.multinomial(probs[r], 1, generator=g)[0]
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, chosen[:, None], 0.0)
        return out
