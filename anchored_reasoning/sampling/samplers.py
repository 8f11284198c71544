"""Samplers for masked diffusion LMs, all driven by one :class:`SamplerConfig`.

``sample(model, prompt_ids, config) -> (ids, stats)`` appends ``gen_length`` mask tokens to the
prompt and denoises them in ``steps`` steps, block by block (semi-autoregressive when
``block_length < gen_length``; steps are split evenly over blocks). ``config.remasking`` picks
the strategy:

* ``"ancestral"`` (MDLM): going from time t to s = t - 1/S, every masked position is revealed with
  probability (t - s)/t (linear alpha), its token drawn from the model. Locked-in.
* ``"low_confidence"`` / ``"random"`` (LLaDA): each step reveals a fixed share of the block's masks
  (the count split evenly over the block's steps), choosing the positions where the model is most
  confident (or at random). Locked-in.
* ``"remdm"`` (ReMDM-loop): MDLM until ``t_on``; then a loop phase holding alpha at ``alpha_on``
  where each decoded token of the block is re-masked with probability ``eta`` and masked ones
  revealed at the matching rate; then MDLM again from ``t_off`` down to 0.
* ``"threshold"`` (Fast-dLLM parallel decoding): each step reveals every masked position of the
  block whose confidence is at least ``threshold`` (at least one, and at least enough to finish the
  block within its step budget, so ``steps`` is an upper bound on forward calls). Locked-in.

**Committed tokens** never change: prompt tokens always; for the locked-in samplers every token
from the step that reveals it; for ``"remdm"`` a token is committed once no later step of its
block can re-mask (``stats.can_remask`` tells which steps can), and every token of a finished block.

**Model calls** go through ``model_fn(z, step) -> logits`` (B, L, V) (raw logits or log-probs; the
mask token is always excluded here). By default :func:`make_model_fn` calls
``model(input_ids=z, attention_mask=...)``; pass your own ``model_fn`` to insert an anchor cache
(TADM) or any other policy; ``anchor_refresh_every=K > 1`` does that for you with
:class:`~.cache.AnchorCacheModelFn` (the anchor is recomputed every K model calls), and
``anchor_refresh_below=tau`` also refreshes a row whose next token is a hard one (cache.py).
``kv_cache="prefix"``/``"dual"`` (our MDLM/ADLM/TADM only) uses :class:`~.kv_cache.KVCacheModelFn`,
Fast-dLLM's approximate KV cache: a full pass at each block's start, then only the block (and, for
"prefix", the masked suffix) is recomputed; it composes with ``anchor_refresh_every``. A block-aware
``model_fn`` gets ``start_block(start, end)`` before each block and may return logits from
position ``logits_offset`` on. The model is only called at steps that reveal at least one token, and
(greedy, default ``model_fn``) only on the rows that still hold masks in the current block: in a batch, a
row whose block is done (threshold decoding finishes rows at different steps; a row filled after EOS)
costs nothing until the next block, and the call leaves out the left-padding columns none of its rows uses.

**EOS.** Generation always fills all ``gen_length`` positions; cut the text at the first EOS
afterwards. With ``stop_at_eos=True`` (needs ``eos_token_id``), at each block boundary a row whose
decoded text already contains EOS has all its remaining positions set to EOS (counted in
``stats.filled_after_eos``); when every row is done the loop stops early.

``ids`` returned are the full sequences (B, P + gen_length): prompt, then the generated tokens.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..errors import ConfigError, DataError

logger = logging.getLogger(__name__)

ModelFn = Callable[[torch.Tensor, int], torch.Tensor]
REMASKING = ("ancestral", "low_confidence", "random", "remdm", "threshold")
_ALIASES = {"mdlm": "ancestral", "none": "ancestral", "llada": "low_confidence", "remdm_loop": "remdm",
            "fast_dllm": "threshold", "confidence_threshold": "threshold"}
LOCKED_IN = ("ancestral", "low_confidence", "random", "threshold")


@dataclass
class SamplerConfig:
    """Every sampler's settings. ``temperature=0`` is greedy (argmax); ``top_p``/``top_k`` filter the
    distribution before sampling; ReMDM uses ``eta``, ``t_on``, ``t_off``, ``alpha_on``; Fast-dLLM
    uses ``threshold``. ``block_length=None`` means one block of ``gen_length``."""

    remasking: str = "low_confidence"
    steps: int = 64
    gen_length: int = 64
    block_length: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    eta: float = 0.02
    t_on: float = 0.55
    t_off: float = 0.05
    alpha_on: float = 0.9
    threshold: float = 0.9
    seed: int = 0
    stop_at_eos: bool = False
    eos_token_id: int | None = None
    anchor_refresh_every: int = 1  # K: two-stage models (ADLM, TADM) reuse the anchor for K model calls
    # tau: also refresh a row's anchor at a step whose next token is predicted below this probability
    # (K stays the maximum staleness); see cache.py. None: K-periodic only
    anchor_refresh_below: float | None = None
    kv_cache: str = "none"  # "prefix" / "dual": Fast-dLLM's approximate KV cache per block (our models; kv_cache.py)

    def __post_init__(self) -> None:
        self.remasking = _ALIASES.get(self.remasking, self.remasking)
        checks = [
            (self.remasking in REMASKING, f"remasking={self.remasking!r}: choose one of {REMASKING}"),
            (self.gen_length >= 0, f"gen_length={self.gen_length} must be >= 0"),
            (self.steps >= 1, f"steps={self.steps} must be >= 1"),
            (self.block_length is None or self.block_length >= 1, f"block_length={self.block_length} must be >= 1"),
            (self.temperature >= 0, f"temperature={self.temperature} must be >= 0"),
            (0 < self.top_p <= 1, f"top_p={self.top_p} must be in (0, 1]"),
            (self.top_k >= 0, f"top_k={self.top_k} must be >= 0"),
            (0 <= self.eta <= 1, f"eta={self.eta} must be in [0, 1]"),
            (0 <= self.t_off < self.t_on <= 1, f"need 0 <= t_off ({self.t_off}) < t_on ({self.t_on}) <= 1"),
            (0 < self.alpha_on < 1, f"alpha_on={self.alpha_on} must be in (0, 1)"),
            (0 <= self.threshold <= 1, f"threshold={self.threshold} must be in [0, 1]"),
            (not self.stop_at_eos or self.eos_token_id is not None, "stop_at_eos=True needs eos_token_id"),
            (self.anchor_refresh_every >= 1, f"anchor_refresh_every={self.anchor_refresh_every} must be >= 1"),
            (self.kv_cache in ("none", "prefix", "dual"), f"kv_cache={self.kv_cache!r}: choose none, prefix or dual"),
            (self.anchor_refresh_below is None or 0 < self.anchor_refresh_below <= 1,
             f"anchor_refresh_below={self.anchor_refresh_below} must be in (0, 1] (or None)"),
            (self.anchor_refresh_below is None or self.kv_cache == "none",
             f"anchor_refresh_below with kv_cache={self.kv_cache!r}: the confidence-triggered refresh is not "
             "implemented for the KV cache; use anchor_refresh_every alone there"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(f"SamplerConfig: {msg}")

    def replace(self, **changes: Any) -> "SamplerConfig":
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"SamplerConfig has no field(s) {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    def blocks(self) -> list[tuple[int, int]]:
        """(start, end) of each block within the generated region."""
        bl = self.block_length or self.gen_length
        if self.gen_length == 0:
            return []
        return [(s, min(s + bl, self.gen_length)) for s in range(0, self.gen_length, bl)]


@dataclass
class SampleStats:
    """Per sampler step (one entry per step, one number per row): tokens revealed (mask -> token)
    and re-masked (token -> mask, ReMDM only); whether the step could re-mask; its block.
    ``nfe`` counts model calls, ``calls_of_row`` the calls each row was in (``model_rows`` their sum). For every row, ``sum(revealed) - sum(remasked) + filled_after_eos``
    equals ``gen_length``."""

    gen_length: int
    prompt_length: int
    revealed_per_step: list[list[int]] = field(default_factory=list)
    remasked_per_step: list[list[int]] = field(default_factory=list)
    can_remask: list[bool] = field(default_factory=list)
    block_of_step: list[int] = field(default_factory=list)
    filled_after_eos: list[int] = field(default_factory=list)
    nfe: int = 0
    calls_of_row: list[int] = field(default_factory=list)  # the model calls each row was in (done blocks skip)
    seconds: float = 0.0
    anchor_rows: int | None = None  # rows the anchor network ran on, summed over model calls (anchor cache only)
    row_calls: int | None = None  # rows x model calls (anchor cache only)

    @property
    def model_rows(self) -> int:
        """Rows the model ran on, summed over calls."""
        return sum(self.calls_of_row)

    @property
    def steps(self) -> int:
        return len(self.revealed_per_step)

    @property
    def anchor_refresh_fraction(self) -> float | None:
        """The share of rows x calls that ran the anchor network (1/K for K-periodic refresh); None
        without an anchor cache."""
        if self.row_calls is None:
            return None
        return self.anchor_rows / self.row_calls if self.row_calls else 0.0

    @property
    def tokens_per_second(self) -> float:
        return len(self.filled_after_eos) * self.gen_length / self.seconds if self.seconds > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "steps": self.steps, "model_rows": self.model_rows, "tokens_per_second": self.tokens_per_second,
                "anchor_refresh_fraction": self.anchor_refresh_fraction}


# --------------------------------------------------------------------------- model plumbing
def model_info(model: Any) -> tuple[int, int | None]:
    """(mask_token_id, max_length or None) from a model, its config, or an adapter."""
    cfg = getattr(model, "config", None)
    mid = getattr(model, "mask_token_id", None)
    if mid is None and cfg is not None:
        mid = getattr(cfg, "mask_token_id", None)
    if mid is None:
        raise ConfigError(f"{type(model).__name__} has no mask_token_id; wrap external checkpoints with "
                          "anchored_reasoning.sampling.adapters.MaskedDiffusionAdapter(model, mask_token_id=...)")
    max_len = getattr(model, "max_length", None)
    if max_len is None and cfg is not None:
        max_len = getattr(cfg, "max_position_embeddings", None)
    return int(mid), (int(max_len) if max_len is not None else None)


def make_model_fn(model: Any, attention_mask: torch.Tensor | None = None, *, trim_padding: bool = True) -> ModelFn:
    """The default ``model_fn``: one full forward pass per call, returning ``.logits``. With ``trim_padding``,
    leading columns that are padding in every row of the call (left padding of prompts longer than any row still
    running) are left out of the pass and come back as zero logits: positions count from each row's first real
    token, so the other positions' logits are the same."""

    def fn(z: torch.Tensor, step: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        mask = attention_mask if rows is None or attention_mask is None else attention_mask[rows]
        lead = int(mask.any(0).int().argmax()) if trim_padding and mask is not None else 0  # first column in use
        out = model(input_ids=z[:, lead:], attention_mask=mask[:, lead:]) if lead else model(input_ids=z, attention_mask=mask)
        logits = out.logits if hasattr(out, "logits") else (out[0] if isinstance(out, (tuple, list)) else out)
        return torch.nn.functional.pad(logits, (0, 0, lead, 0)) if lead else logits

    fn.takes_rows = True  # z may be a subset of the batch's rows (``rows``, their indices): see _run_block
    return fn


def _device_of(model: Any, fallback: torch.device) -> torch.device:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration, TypeError):
        return fallback


# --------------------------------------------------------------------------- token choice
def _filter(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > top_p  # keep the smallest prefix whose mass reaches top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), -math.inf)
    return logits


def _predict(logits: torch.Tensor, mask_id: int, cfg: SamplerConfig, gen: torch.Generator):
    """Token predictions and their confidence for (B, Lb, V) logits."""
    logits = logits.float().clone()
    logits[..., mask_id] = -math.inf
    if cfg.temperature == 0:
        probs = logits.softmax(-1)
        conf, tokens = probs.max(-1)
        return tokens, conf
    logits = _filter(logits / cfg.temperature, cfg.top_k, cfg.top_p)
    u = torch.rand(logits.shape, generator=gen, device=gen.device).to(logits.device).clamp_(1e-20, 1 - 1e-7)
    tokens = (logits - torch.log(-torch.log(u))).argmax(-1)  # Gumbel-max = a draw from softmax(logits)
    conf = logits.softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens, conf


def _rand(shape, gen: torch.Generator, device) -> torch.Tensor:
    return torch.rand(shape, generator=gen, device=gen.device).to(device)


def _remdm_alpha(t: float, cfg: SamplerConfig) -> float:
    """ReMDM-loop's alpha(t): 0 -> alpha_on on [t_on, 1], flat on [t_off, t_on], alpha_on -> 1 on [0, t_off]."""
    if t <= 0:
        return 1.0
    if t >= cfg.t_on:
        return cfg.alpha_on * (1 - t) / (1 - cfg.t_on) if cfg.t_on < 1 else cfg.alpha_on
    if t >= cfg.t_off:
        return cfg.alpha_on
    return cfg.alpha_on + (1 - cfg.alpha_on) * (cfg.t_off - t) / cfg.t_off


def _steps_per_block(cfg: SamplerConfig, n_blocks: int) -> list[int]:
    if cfg.steps < n_blocks:
        raise ConfigError(f"SamplerConfig: steps={cfg.steps} is fewer than the number of blocks ({n_blocks} = "
                          f"gen_length {cfg.gen_length} / block_length {cfg.block_length}); raise steps or block_length")
    base, extra = divmod(cfg.steps, n_blocks)
    return [base + (1 if b < extra else 0) for b in range(n_blocks)]


# --------------------------------------------------------------------------- the sampler
@torch.no_grad()
def sample(model: Any, prompt_ids: torch.Tensor, config: SamplerConfig | None = None, *,
           attention_mask: torch.Tensor | None = None, model_fn: ModelFn | None = None,
           callback: Callable[[int, torch.Tensor], None] | None = None, **overrides: Any):
    """Generate ``config.gen_length`` tokens after ``prompt_ids`` (B, P) (or (P,)); see the module doc.
    ``attention_mask`` (B, P) marks real prompt tokens (left padding = 0). ``callback(step, x)``
    runs after every step with the current sequences. Returns ``(ids (B, P + gen_length), SampleStats)``."""
    cfg = (config or SamplerConfig()).replace(**overrides) if overrides else (config or SamplerConfig())
    mask_id, max_len = model_info(model)
    if prompt_ids.dim() == 1:
        prompt_ids = prompt_ids.unsqueeze(0)
        attention_mask = attention_mask.unsqueeze(0) if attention_mask is not None else None
    bsz, plen = prompt_ids.shape
    real_prompt = attention_mask.bool() if attention_mask is not None else torch.ones_like(prompt_ids, dtype=torch.bool)
    if (prompt_ids.eq(mask_id) & real_prompt).any():
        raise DataError(f"the prompt contains the mask token (id {mask_id}); prompts must be clean text")
    if max_len is not None and plen + cfg.gen_length > max_len:
        what = ("the prompt alone fills the model's whole context" if plen >= max_len
                else f"prompt length {plen} + gen_length {cfg.gen_length} = {plen + cfg.gen_length} exceeds it")
        raise ConfigError(f"sample: the model's max length is {max_len} and {what}; shorten the prompt "
                          "(truncate from the left) or lower gen_length")
    device = _device_of(model, prompt_ids.device)
    x = torch.cat([prompt_ids.to(device), torch.full((bsz, cfg.gen_length), mask_id, dtype=prompt_ids.dtype, device=device)], 1)
    full_mask = None
    if attention_mask is not None:
        full_mask = torch.cat([attention_mask.to(device), torch.ones(bsz, cfg.gen_length, dtype=attention_mask.dtype, device=device)], 1)
    if cfg.kv_cache != "none":  # Fast-dLLM's approximate KV cache, composed with the anchor cache
        if model_fn is not None:
            raise ConfigError(f"kv_cache={cfg.kv_cache!r} builds its own model_fn; pass either kv_cache or model_fn")
        from .kv_cache import KVCacheModelFn

        model_fn = KVCacheModelFn(model, cfg.kv_cache, cfg.anchor_refresh_every, full_mask)
    refreshing = cfg.anchor_refresh_every > 1 or cfg.anchor_refresh_below is not None
    if model_fn is None and refreshing:  # the anchor-cache policy (TADM); K = 1 alone is the plain model
        from .cache import AnchorCacheModelFn

        model_fn = AnchorCacheModelFn(model, cfg.anchor_refresh_every, full_mask, cfg.anchor_refresh_below, mask_id)
    fn = model_fn or make_model_fn(model, full_mask)
    stats = SampleStats(gen_length=cfg.gen_length, prompt_length=plen, filled_after_eos=[0] * bsz, calls_of_row=[0] * bsz)
    gen = torch.Generator(device=device if device.type == "cuda" else "cpu").manual_seed(cfg.seed)
    start_time = time.perf_counter()
    blocks = cfg.blocks()
    step = 0
    for b, ((s, e), n_steps) in enumerate(zip(blocks, _steps_per_block(cfg, len(blocks)) if blocks else [])):
        if cfg.stop_at_eos and b > 0 and _fill_after_eos(x, plen, s, cfg, mask_id, stats):
            break
        if hasattr(fn, "start_block"):  # a block-aware model_fn (the KV cache) refreshes here
            fn.start_block(plen + s, plen + e)
        step = _run_block(fn, x, plen + s, plen + e, n_steps, b, step, mask_id, cfg, gen, stats, callback)
    stats.seconds = time.perf_counter() - start_time
    if hasattr(fn, "refresh_fraction"):
        stats.anchor_rows, stats.row_calls = fn.anchor_rows, fn.row_calls
    return x, stats


def _fill_after_eos(x, plen, upto, cfg, mask_id, stats) -> bool:
    """Rows whose generated text up to ``upto`` holds EOS get their remaining masks set to EOS.
    Returns True when every row is done."""
    done = (x[:, plen:plen + upto] == cfg.eos_token_id).any(-1)
    for r in done.nonzero().flatten().tolist():
        rest = x[r, plen + upto:] == mask_id
        stats.filled_after_eos[r] += int(rest.sum())
        x[r, plen + upto:][rest] = cfg.eos_token_id
    return bool(done.all())


def _run_block(fn, x, start, end, n_steps, block, step, mask_id, cfg, gen, stats, callback) -> int:
    """Denoise x[:, start:end] in at most ``n_steps`` steps (in place). Returns the next step index."""
    region = slice(start, end)
    n_init = (x[:, region] == mask_id).sum(-1)  # per row (rows filled after EOS may have 0)
    decoded_here = torch.zeros_like(x[:, region], dtype=torch.bool)  # revealed in this block (ReMDM may re-mask)
    for i in range(n_steps):
        masked = x[:, region] == mask_id
        if cfg.remasking == "threshold" and not masked.any():
            break
        t, s_ = 1 - i / n_steps, 1 - (i + 1) / n_steps
        remask = torch.zeros_like(masked)
        can_remask = False
        cache: list[tuple[torch.Tensor, torch.Tensor]] = []

        def predict():  # at most one model call (and one draw of tokens) per step
            if not cache:
                rows = _rows_to_run(fn, masked, cfg)
                if rows is None:
                    logits = fn(x, step)
                    off = getattr(fn, "logits_offset", 0)  # a KV-cached fn returns positions off.. only
                    cache.append(_predict(logits[:, start - off:end - off], mask_id, cfg, gen))
                else:  # rows with no mask left in the block keep their tokens: the model runs the others only
                    tokens, conf = _predict(fn(x[rows], step, rows=rows)[:, start:end], mask_id, cfg, gen)
                    all_tokens, all_conf = x[:, region].clone(), torch.zeros(masked.shape, dtype=conf.dtype, device=x.device)
                    all_tokens[rows], all_conf[rows] = tokens, conf
                    cache.append((all_tokens, all_conf))
                stats.nfe += 1
                for r in (range(x.shape[0]) if rows is None else rows.tolist()):
                    stats.calls_of_row[r] += 1
            return cache[0]

        if cfg.remasking == "ancestral":
            reveal = masked & (_rand(masked.shape, gen, x.device) < (t - s_) / t)
        elif cfg.remasking == "remdm":
            a_t, a_s = _remdm_alpha(t, cfg), _remdm_alpha(s_, cfg)
            can_remask = cfg.t_off < t <= cfg.t_on and s_ >= cfg.t_off and cfg.eta > 0
            sigma = min(cfg.eta, (1 - a_s) / a_t) if can_remask else 0.0
            p_reveal = 1.0 if a_s >= 1 else min(1.0, max(0.0, (a_s - (1 - sigma) * a_t) / (1 - a_t)))
            u = _rand(masked.shape, gen, x.device)
            reveal = masked & (u < p_reveal)
            remask = decoded_here & ~masked & (u < sigma)
        elif cfg.remasking in ("low_confidence", "random"):
            base, extra = n_init // n_steps, n_init % n_steps
            k = base + (i < extra).long()  # LLaDA: this step's share of the block's masks, per row
            if cfg.remasking == "random":
                score = _rand(masked.shape, gen, x.device)
            else:
                score = predict()[1] if bool((k > 0).any()) else torch.zeros(masked.shape, device=x.device)
            reveal = _top_k_mask(score, masked, k)
        else:  # threshold
            tokens, conf = predict()
            left = n_steps - i
            need = torch.div(masked.sum(-1) + left - 1, left, rounding_mode="floor").clamp(min=1)
            reveal = (masked & (conf >= cfg.threshold)) | _top_k_mask(conf, masked, need)
            reveal &= masked
        if reveal.any():
            tokens = predict()[0]
            x[:, region] = torch.where(reveal, tokens, x[:, region])
        if remask.any():
            x[:, region] = torch.where(remask, torch.full_like(x[:, region], mask_id), x[:, region])
        decoded_here |= reveal
        decoded_here &= ~remask
        stats.revealed_per_step.append(reveal.sum(-1).tolist())
        stats.remasked_per_step.append(remask.sum(-1).tolist())
        stats.can_remask.append(bool(can_remask))
        stats.block_of_step.append(block)
        if callback is not None:
            callback(step, x)
        step += 1
    if (x[:, region] == mask_id).any():  # cannot happen with valid settings; never return masks silently
        raise RuntimeError(f"sampler {cfg.remasking!r} left masked positions in block {block}")
    return step


def _rows_to_run(fn, masked: torch.Tensor, cfg: SamplerConfig) -> torch.Tensor | None:
    """Indices of the rows that still hold masks in the block when some do not and ``fn`` can run a subset of
    rows (the default model_fn; greedy only, so no random draw depends on which rows ran); else None (all).
    A finished row's logits would change nothing: its tokens are committed."""
    if not getattr(fn, "takes_rows", False) or cfg.temperature != 0:
        return None
    active = masked.any(-1)
    return None if bool(active.all()) else active.nonzero().flatten()


def _top_k_mask(score: torch.Tensor, allowed: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Per row, the ``k[row]`` highest-scoring allowed positions (ties broken by position)."""
    score = score.float().masked_fill(~allowed, -math.inf)
    order = score.argsort(dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(score.shape[-1], device=score.device).expand_as(order))
    return allowed & (rank < k.unsqueeze(-1))


__all__ = ["SamplerConfig", "SampleStats", "sample", "make_model_fn", "model_info", "ModelFn", "REMASKING", "LOCKED_IN"]
