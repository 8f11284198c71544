"""lm-evaluation-harness support for diffusion LMs: ``--model anchored_diffusion``.

lm-eval has no model class for masked diffusion LMs; this one serves our MDLM/ADLM/TADM checkpoints
and external ones (LLaDA, Dream) through :func:`~anchored_reasoning.sampling.load_masked_diffusion_model`:

* ``generate_until``: the library's samplers through :class:`~anchored_reasoning.backends.diffusion.DiffusionBackend`
  (so the same prompts give the same text as ``anchored-reasoning eval --backend diffusion``). The
  sampler and its options are model args: ``sampler=low_confidence,steps=32,block_length=8,
  anchor_refresh_every=3,kv_cache=prefix,...`` (any :class:`~anchored_reasoning.sampling.SamplerConfig` field).
* ``loglikelihood``: a Monte-Carlo ELBO of the continuation given the context, as LLaDA and Dream
  evaluate: each of ``mc_num`` samples masks ``l`` of the ``L`` continuation tokens (``l`` stratified
  over 1..L, positions uniform), the context stays clean, and the estimate is the mean of
  ``(L / l) * sum of log p(token)`` over the masked positions: a lower bound on ``log p(continuation | context)``.
  ``is_greedy`` (with ``greedy_check=true``) is whether greedy low-confidence decoding of the
  continuation window (one token per step) reproduces it.
* ``loglikelihood_rolling``: the same ELBO on a whole document (empty context); a document longer
  than the model's positions is split into chunks scored with up to ``rolling_context`` tokens of the
  preceding text as clean context.

Draws are seeded from ``seed`` and the request's tokens, so a score does not depend on the order or
batching of requests. A request the model cannot serve (context + continuation or + generation window
beyond its positions) raises :class:`~anchored_reasoning.errors.DataError` naming the request.

Run the real CLI with this class registered::

    python -m anchored_reasoning.eval.lm_eval_cli run --model anchored_diffusion \\
        --model_args pretrained=runs/my_adlm,sampler=low_confidence,steps=32,mc_num=64 --tasks ...

or in Python ``lm_eval.simple_evaluate(model=AnchoredDiffusionLM(pretrained=...), tasks=[...])``.
Needs the ``[lm-eval]`` extra (``pip install anchored-reasoning[lm-eval]``).
"""
from __future__ import annotations

import logging
import zlib
from typing import Any

import torch

from ..errors import ConfigError, DataError

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("anchored_reasoning.eval.lm_eval_model needs lm-evaluation-harness: "
                      "pip install 'anchored-reasoning[lm-eval]'") from exc

logger = logging.getLogger(__name__)


def _truthy(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes", "on")


def request_seed(seed: int, *token_lists: list[int]) -> int:
    """A seed from ``seed`` and the request's tokens (stable across runs, orders and batches)."""
    crc = 0
    for toks in token_lists:
        crc = zlib.crc32(b"|" + ",".join(map(str, toks)).encode(), crc)
    return (int(seed) * 1_000_003 + crc) % (2 ** 63)


@torch.no_grad()
def mc_elbo(model: Any, context: list[int], continuation: list[int], *, mc_num: int = 32, batch_size: int = 32,
            seed: int = 0, mask_token_id: int | None = None, device: Any = None) -> float:
    """Monte-Carlo ELBO of ``log p(continuation | context)`` (see the module doc); deterministic per seed."""
    from ..sampling import model_info

    if not continuation:
        return 0.0
    if mc_num < 1 or batch_size < 1:
        raise ConfigError(f"mc_num={mc_num} and batch_size={batch_size} must be >= 1")
    mid = mask_token_id if mask_token_id is not None else model_info(model)[0]
    device = device or next(model.parameters()).device
    n_ctx, n = len(context), len(continuation)
    seq = torch.tensor(context + continuation, dtype=torch.long)
    target = torch.tensor(continuation, dtype=torch.long)
    gen = torch.Generator().manual_seed(request_seed(seed, context, continuation))
    u = float(torch.rand((), generator=gen))
    counts = [1 + min(n - 1, int((u + j) / mc_num * n)) for j in range(mc_num)]  # l stratified over 1..n
    total = 0.0
    for start in range(0, mc_num, batch_size):
        ls = counts[start:start + batch_size]
        rows = seq.repeat(len(ls), 1)
        masked = torch.zeros(len(ls), n, dtype=torch.bool)
        for r, l in enumerate(ls):
            masked[r, torch.randperm(n, generator=gen)[:l]] = True
        rows[:, n_ctx:] = torch.where(masked, torch.full_like(rows[:, n_ctx:], mid), rows[:, n_ctx:])
        out = model(input_ids=rows.to(device))
        logits = out.logits if hasattr(out, "logits") else out[0]
        logp = logits[:, n_ctx:].float().log_softmax(-1).gather(-1, target.to(logits.device).expand(len(ls), n).unsqueeze(-1))
        logp = logp.squeeze(-1).cpu()
        weight = torch.tensor([n / l for l in ls], dtype=torch.float64)
        total += float((weight * torch.where(masked, logp, torch.zeros_like(logp)).sum(-1).double()).sum())
    return total / mc_num


@register_model("anchored_diffusion")
class AnchoredDiffusionLM(LM):
    """lm-eval model over a masked diffusion LM (see the module doc).

    Model args: ``pretrained`` (checkpoint dir / alias / Hub id; or pass ``model`` and ``tokenizer``
    objects in Python), ``sampler``, ``steps``, ``gen_length`` (caps ``max_gen_toks``),
    ``block_length``, any SamplerConfig field, ``mc_num`` (ELBO samples, 32), ``mc_batch_size``,
    ``greedy_check`` (true), ``rolling_context``, ``batch_size`` (generation), ``device``, ``dtype``,
    ``trust_remote_code``, ``mask_token_id``, ``seed``, ``fit`` (the backend's prompt-fit policy).
    lm-eval's ``--batch_size`` / ``--device`` arrive as ``batch_size`` / ``device``."""

    def __init__(self, pretrained: Any = None, *, model: Any = None, tokenizer: Any = None,
                 sampler: str = "low_confidence", steps: int | None = None, gen_length: int | None = None,
                 block_length: int | None = None, mc_num: int = 32, mc_batch_size: int = 32, greedy_check: Any = True,
                 rolling_context: int | None = None, batch_size: Any = 8, max_batch_size: Any = None,
                 device: str | None = None, dtype: str | None = None, trust_remote_code: Any = False,
                 mask_token_id: int | None = None, seed: int = 0, fit: str = "error", **sampler_options: Any):
        super().__init__()
        from ..backends.diffusion import DiffusionBackend

        if (pretrained is None) == (model is None):
            raise ConfigError("anchored_diffusion: give pretrained=<checkpoint> (model_args) or model=<a model object>")
        bs = int(batch_size) if str(batch_size).isdigit() else 8  # lm-eval may pass "auto"
        opts = {k: v for k, v in sampler_options.items() if v is not None}
        self.backend = DiffusionBackend(
            model if model is not None else str(pretrained), tokenizer=tokenizer, sampler=sampler,
            steps=int(steps) if steps else None, gen_length=int(gen_length) if gen_length else None,
            block_length=int(block_length) if block_length else None, batch_size=bs, device=device, dtype=dtype,
            fit=fit, seed=int(seed), trust_remote_code=_truthy(trust_remote_code),
            mask_token_id=int(mask_token_id) if mask_token_id is not None else None, **opts)
        self.model, self.tokenizer = self.backend.model, self.backend.tokenizer
        self.mask_token_id, self.max_length = self.backend.mask_token_id, self.backend.max_length
        self.mc_num, self.mc_batch_size = int(mc_num), int(mc_batch_size)
        self.greedy_check, self.seed = _truthy(greedy_check), int(seed)
        if self.mc_num < 1 or self.mc_batch_size < 1:
            raise ConfigError(f"anchored_diffusion: mc_num={mc_num} and mc_batch_size={mc_batch_size} must be >= 1")
        self.rolling_context = int(rolling_context) if rolling_context is not None else (
            self.max_length // 2 if self.max_length else 0)
        self._device = self.backend.device

    # ------------------------------------------------------------------ tokens
    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Token ids of the context and the continuation; trailing spaces of the context move to the
        continuation and the split is taken from the joint encoding (as lm-eval's HF models do)."""
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        whole = self._encode(context + continuation)
        ctx = self._encode(context) if context else []
        return whole[:len(ctx)], whole[len(ctx):]

    def _check_fits(self, n_tokens: int, what: str, index: int, text: str) -> None:
        if self.max_length is not None and n_tokens > self.max_length:
            raise DataError(f"lm-eval request {index} ({what}: {text[:80]!r}...) needs {n_tokens} positions, more than "
                            f"the model's {self.max_length}; use a task with shorter contexts or a model with more "
                            "positions")

    # ------------------------------------------------------------------ lm-eval API
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        out = []
        for i, req in enumerate(requests):
            context, continuation = req.args[0], req.args[1]
            ctx, cont = self.encode_pair(context, continuation)
            self._check_fits(len(ctx) + len(cont), "context + continuation", i, context + continuation)
            if not cont:
                raise DataError(f"lm-eval request {i}: the continuation {continuation!r} has no tokens")
            ll = mc_elbo(self.model, ctx, cont, mc_num=self.mc_num, batch_size=self.mc_batch_size, seed=self.seed,
                         mask_token_id=self.mask_token_id, device=self._device)
            greedy = self._is_greedy(ctx, cont) if self.greedy_check else False
            out.append((ll, greedy))
            self.cache_hook.add_partial("loglikelihood", (context, continuation), (ll, greedy))
        return out

    def _is_greedy(self, ctx: list[int], cont: list[int]) -> bool:
        from ..sampling import SamplerConfig, sample

        cfg = SamplerConfig(remasking="low_confidence", steps=len(cont), gen_length=len(cont), temperature=0.0)
        ids, _ = sample(self.model, torch.tensor([ctx], dtype=torch.long, device=self._device), cfg)
        return ids[0, len(ctx):].tolist() == cont

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for i, req in enumerate(requests):
            text = req.args[0]
            toks = self._encode(text)
            if self.max_length is None or len(toks) <= self.max_length:
                ll = mc_elbo(self.model, [], toks, mc_num=self.mc_num, batch_size=self.mc_batch_size, seed=self.seed,
                             mask_token_id=self.mask_token_id, device=self._device)
            else:
                ll = sum(mc_elbo(self.model, ctx, chunk, mc_num=self.mc_num, batch_size=self.mc_batch_size,
                                 seed=self.seed, mask_token_id=self.mask_token_id, device=self._device)
                         for ctx, chunk in self.rolling_chunks(toks))
            out.append(ll)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), ll)
        return out

    def rolling_chunks(self, toks: list[int]) -> list[tuple[list[int], list[int]]]:
        """(clean context, scored chunk) pairs covering every token once, each within the model's positions."""
        m = self.max_length
        ctx_len = min(self.rolling_context, m - 1)
        chunks, pos = [([], toks[:m])], m
        while pos < len(toks):
            step = m - ctx_len
            chunks.append((toks[pos - ctx_len:pos], toks[pos:pos + step]))
            pos += step
        return chunks

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from ..types import Prompt, SamplingSpec

        groups: dict[tuple, list[int]] = {}
        specs: dict[tuple, SamplingSpec] = {}
        for i, req in enumerate(requests):
            context, kwargs = req.args[0], dict(req.args[1] or {})
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_toks = int(kwargs.pop("max_gen_toks", self.backend.gen_length or 256))
            temperature = float(kwargs.pop("temperature", 0.0) or 0.0)
            if not _truthy(kwargs.pop("do_sample", temperature > 0)):
                temperature = 0.0
            top_p = float(kwargs.pop("top_p", 1.0) or 1.0)
            if kwargs:
                logger.warning("anchored_diffusion: generation kwargs %s are not used by diffusion samplers", sorted(kwargs))
            window = min(self.backend.gen_length, max_toks) if self.backend.gen_length else max_toks
            if self.backend.fit == "error":
                self._check_fits(len(self.backend.encode(Prompt(text=context))) + window, "context + generation window",
                                 i, context)
            key = (tuple(until), max_toks, temperature, top_p)
            specs[key] = SamplingSpec(max_new_tokens=max_toks, temperature=temperature, top_p=top_p, stop=until,
                                      seed=self.seed)
            groups.setdefault(key, []).append(i)
        texts: list[str | None] = [None] * len(requests)
        for key, members in groups.items():
            completions = self.backend.generate([Prompt(text=requests[i].args[0]) for i in members], specs[key])
            for i, comps in zip(members, completions):
                texts[i] = comps[0].text
                self.cache_hook.add_partial("generate_until", requests[i].args, texts[i])
        return texts  # type: ignore[return-value]


__all__ = ["AnchoredDiffusionLM", "mc_elbo", "request_seed"]
