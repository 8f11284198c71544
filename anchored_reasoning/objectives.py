"""Training objectives for masked diffusion LMs: the MDLM NELBO and ADLM's ANELBO.

Forward process (absorbing state, continuous time): each eligible token of ``x0`` is replaced by
the mask token independently with probability ``1 - alpha_t``. The log-linear schedule has
``alpha_t = 1 - (1 - eps) t``; the NELBO weight is ``-alpha'_t / (1 - alpha_t) = 1/t``.

Per-token NELBO (``normalization="token"``, MDLM's convention)::

    NELBO = sum_{b,l} w(t_b) * masked[b,l] * CE(logits[b,l], x0[b,l])  /  sum_{b,l} eligible[b,l]

i.e. nats per eligible (non-pad, non-prompt) token; ``exp(NELBO)`` bounds the perplexity.
``normalization="sequence"`` is LLaDA's SFT loss: per row ``sum_l masked * CE / p_mask`` divided
by that row's number of eligible (response) tokens, then averaged over rows that have any.

ANELBO (ADLM) = NELBO of the denoiser + ``gamma`` x the anchor network's cross-entropy against
``x0`` at anchor positions (masked or not), with the same time weight and normalisation. Anchors
are an explicit boolean mask (a task's anchor extractor) or the tau-frequency rule
(:func:`frequency_anchor_mask`).

Which positions take part:

* ``attention_mask`` (1 = real token): padding is never masked, never in the loss, never attended.
* ``prompt_mask`` (True = prompt token): never masked, never in the loss (SFT).
* ``loss_mask`` (True = eligible): the explicit alternative; eligible = loss_mask & ~prompt_mask & attention.

Rows without any eligible token (an empty response) contribute nothing; a batch with none at
all gives a zero loss that still has a gradient graph, and a warning.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch
import torch.nn.functional as F

from .errors import ConfigError

logger = logging.getLogger(__name__)

NORMALIZATIONS = ("token", "sequence")


# --------------------------------------------------------------------------- noise schedule / time
@dataclass(frozen=True)
class LogLinearSchedule:
    """``alpha_t = 1 - (1 - eps) t`` for t in [0, 1]: the probability a token is still clean at time t."""

    eps: float = 1e-3

    def alpha(self, t: torch.Tensor) -> torch.Tensor:
        return 1 - (1 - self.eps) * t

    def alpha_prime(self, t: torch.Tensor) -> torch.Tensor:
        return torch.full_like(t, -(1 - self.eps))

    def mask_prob(self, t: torch.Tensor) -> torch.Tensor:
        """``1 - alpha_t``: the probability a token is masked at time t."""
        return 1 - self.alpha(t)

    def weight(self, t: torch.Tensor) -> torch.Tensor:
        """The continuous-time NELBO weight ``-alpha'_t / (1 - alpha_t)`` (= 1/t here)."""
        return -self.alpha_prime(t) / self.mask_prob(t)


def sample_times(n: int, *, antithetic: bool = True, t_min: float = 1e-3, generator: torch.Generator | None = None,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """``n`` diffusion times in [t_min, 1]. ``antithetic`` (MDLM's low-discrepancy sampler): one
    uniform offset shared by the batch, ``t_i = (u + i/n) mod 1``, so the batch covers [0, 1]
    evenly and the loss has lower variance."""
    gen_device = generator.device if generator is not None else (device or "cpu")
    u = torch.rand(1 if antithetic else n, generator=generator, device=gen_device)
    t = (u / n + torch.arange(n, device=u.device) / n) % 1.0 if antithetic else u
    t = t * (1 - t_min) + t_min
    return t.to(device) if device is not None else t


def q_sample(x0: torch.Tensor, t: torch.Tensor | float, mask_token_id: int, schedule: LogLinearSchedule | None = None,
             *, maskable: torch.Tensor | None = None, generator: torch.Generator | None = None):
    """Absorbing-state forward process. ``x0``: (B, L) clean ids; ``t``: scalar or (B,).
    Returns ``(z_t, masked)`` where ``masked`` (B, L) marks the positions replaced by the mask token.
    Positions where ``maskable`` is False (prompt, padding) are never masked."""
    schedule = schedule or LogLinearSchedule()
    t = torch.as_tensor(t, dtype=torch.float32, device=x0.device)
    p = schedule.mask_prob(t).reshape(-1, 1) if t.dim() else schedule.mask_prob(t)
    gen_device = generator.device if generator is not None else x0.device
    r = torch.rand(x0.shape, generator=generator, device=gen_device).to(x0.device)
    masked = r < p
    if maskable is not None:
        masked &= maskable.bool()
    return torch.where(masked, torch.full_like(x0, mask_token_id), x0), masked


# --------------------------------------------------------------------------- anchors, gamma
def frequency_anchor_mask(input_ids: torch.Tensor, tau: int = 5, ignore_ids: Iterable[int] = (),
                          valid_mask: torch.Tensor | None = None) -> torch.Tensor:
    """ADLM's per-sequence frequency rule, vectorised: position (b, l) is an anchor when its token
    occurs at most ``tau`` times among the valid positions of row b. Tokens in ``ignore_ids``
    (pad, mask, BOS/EOS, ...) and invalid positions are never anchors and are not counted."""
    if tau < 1:
        raise ConfigError(f"frequency_anchor_mask: tau={tau} must be >= 1 (ADLM uses tau=5)")
    valid = torch.ones_like(input_ids, dtype=torch.bool) if valid_mask is None else valid_mask.bool().clone()
    for i in ignore_ids:
        if i is not None:
            valid &= input_ids != int(i)
    vocab = int(input_ids.max().item()) + 1 if input_ids.numel() else 1
    counts = torch.zeros(input_ids.shape[0], vocab, dtype=torch.long, device=input_ids.device)
    counts.scatter_add_(1, input_ids, valid.long())
    return valid & (counts.gather(1, input_ids) <= tau)


def gamma_schedule(step: int, total_steps: int, gamma: float = 3e-3, warmup_fraction: float = 0.003) -> float:
    """ANELBO's anchor weight at a training step: linear from 0 to ``gamma`` over the first
    ``warmup_fraction`` of ``total_steps`` (ADLM: 3e-3 over ~0.3%), then constant."""
    warm = warmup_fraction * max(total_steps, 1)
    if warm <= 0 or step >= warm:
        return float(gamma)
    return float(gamma) * max(step, 0) / warm


# --------------------------------------------------------------------------- losses
@dataclass
class DiffusionLoss:
    """``loss`` (to backpropagate) = ``nelbo`` + ``gamma`` x ``anchor_loss``. ``num_tokens`` is the
    number of eligible tokens (the NELBO denominator); ``num_masked`` how many were masked."""

    loss: torch.Tensor
    nelbo: torch.Tensor
    anchor_loss: torch.Tensor | None
    gamma: float
    num_tokens: int
    num_masked: int
    t: torch.Tensor

    def metrics(self) -> dict[str, float]:
        out = {"loss": float(self.loss.detach()), "nelbo": float(self.nelbo.detach()), "gamma": self.gamma,
               "num_tokens": self.num_tokens, "num_masked": self.num_masked}
        if self.anchor_loss is not None:
            out["anchor_loss"] = float(self.anchor_loss.detach())
        return out


def eligible_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                       prompt_mask: torch.Tensor | None = None, loss_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean (B, L): positions that may be masked and enter the loss."""
    eligible = torch.ones_like(input_ids, dtype=torch.bool)
    for m, negate in ((attention_mask, False), (loss_mask, False), (prompt_mask, True)):
        if m is not None:
            if m.shape != input_ids.shape:
                raise ValueError(f"mask of shape {tuple(m.shape)} does not match input_ids {tuple(input_ids.shape)}")
            eligible &= ~m.bool() if negate else m.bool()
    return eligible


def weighted_ce(logits: torch.Tensor, targets: torch.Tensor, select: torch.Tensor, row_weight: torch.Tensor,
                eligible: torch.Tensor, normalization: str = "token") -> torch.Tensor:
    """The weighted, normalised cross-entropy every objective here shares.
    ``logits`` (B, L, V) raw logits or log-probs; ``select`` (B, L) positions whose CE counts;
    ``row_weight`` (B,) time weight; ``eligible`` (B, L) the normaliser's positions."""
    if normalization not in NORMALIZATIONS:
        raise ConfigError(f"normalization={normalization!r}; choose one of {NORMALIZATIONS}")
    b, l, v = logits.shape
    ce = F.cross_entropy(logits.float().reshape(b * l, v), targets.reshape(-1), reduction="none").reshape(b, l)
    ce = torch.where(select, ce, torch.zeros_like(ce))  # where, not *, so a non-selected inf/NaN can't leak
    per_row = ce.sum(-1) * row_weight
    if normalization == "token":
        return per_row.sum() / eligible.sum().clamp(min=1)
    n = eligible.sum(-1)
    has = n > 0
    return (per_row[has] / n[has]).sum() / has.sum().clamp(min=1)


def _mask_id(model: Any, mask_token_id: int | None) -> int:
    if mask_token_id is not None:
        return int(mask_token_id)
    for obj in (model, getattr(model, "config", None)):
        mid = getattr(obj, "mask_token_id", None)
        if mid is not None:
            return int(mid)
    raise ConfigError("no mask token id: pass mask_token_id=... or use a model whose config sets mask_token_id")


def diffusion_loss(
    model: Any,
    input_ids: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None = None,
    prompt_mask: torch.Tensor | None = None,
    loss_mask: torch.Tensor | None = None,
    t: torch.Tensor | None = None,
    schedule: LogLinearSchedule | None = None,
    gamma: float = 0.0,
    anchor_mask: torch.Tensor | None = None,
    anchor_tau: int = 5,
    anchor_ignore_ids: Sequence[int] = (),
    normalization: str = "token",
    antithetic: bool = True,
    t_min: float = 1e-3,
    mask_token_id: int | None = None,
    generator: torch.Generator | None = None,
) -> DiffusionLoss:
    """Noise ``input_ids`` (clean ``x0``), run ``model`` once and return the MDLM NELBO or, when the
    model also returns ``anchor_logits`` (ADLM), the ANELBO with weight ``gamma``.

    ``model(input_ids=z_t, attention_mask=...)`` must return an object with ``.logits`` (raw
    logits or log-probs, (B, L, V)) and optionally ``.anchor_logits``. Anchors: ``anchor_mask``
    (B, L) if given, else :func:`frequency_anchor_mask` with ``anchor_tau`` over the eligible
    positions (ignoring ``anchor_ignore_ids`` and the mask id). ``t`` (B,) overrides time sampling.
    """
    schedule = schedule or LogLinearSchedule()
    mid = _mask_id(model, mask_token_id)
    eligible = eligible_positions(input_ids, attention_mask, prompt_mask, loss_mask)
    bsz = input_ids.shape[0]
    if t is None:
        t = sample_times(bsz, antithetic=antithetic, t_min=t_min, generator=generator, device=input_ids.device)
    t = torch.as_tensor(t, dtype=torch.float32, device=input_ids.device).reshape(-1).expand(bsz)
    z_t, masked = q_sample(input_ids, t, mid, schedule, maskable=eligible, generator=generator)
    out = model(input_ids=z_t, attention_mask=attention_mask)
    if normalization == "sequence":  # LLaDA: CE / p_mask
        w = 1.0 / schedule.mask_prob(t)
    else:
        w = schedule.weight(t)
    n_eligible = int(eligible.sum())
    if n_eligible == 0:
        logger.warning("diffusion_loss: the batch has no eligible tokens (empty responses or all padding); loss is 0")
    nelbo = weighted_ce(out.logits, input_ids, masked, w, eligible, normalization)
    anchor_logits = getattr(out, "anchor_logits", None)
    anchor_loss = None
    if anchor_logits is not None:
        if anchor_mask is None:
            anchor_mask = frequency_anchor_mask(input_ids, anchor_tau, [mid, *anchor_ignore_ids], eligible)
        anchor_loss = weighted_ce(anchor_logits, input_ids, anchor_mask.bool() & eligible, w, eligible, normalization)
    elif gamma:
        raise ConfigError(f"gamma={gamma} needs a model that returns anchor_logits (ADLM); {type(model).__name__} does not")
    loss = nelbo if (anchor_loss is None or gamma == 0) else nelbo + gamma * anchor_loss
    return DiffusionLoss(loss=loss, nelbo=nelbo, anchor_loss=anchor_loss, gamma=float(gamma),
                         num_tokens=n_eligible, num_masked=int(masked.sum()), t=t)


# --------------------------------------------------------------------------- evaluation
@dataclass
class PerplexityBound:
    """``nelbo``: nats per token (Monte Carlo over ``num_t_samples`` stratified times per sequence);
    ``perplexity`` = exp(nelbo), an upper bound on the model's perplexity."""

    nelbo: float
    perplexity: float
    num_tokens: int
    num_sequences: int
    num_t_samples: int

    def to_dict(self) -> dict[str, float | int]:
        return dict(self.__dict__)


@torch.no_grad()
def weighted_masked_ce(logits: torch.Tensor, targets: torch.Tensor, masked: torch.Tensor, t: torch.Tensor,
                       schedule: "LogLinearSchedule") -> float:
    """Sum over rows of the NELBO time weight w(t) x the CE summed over each row's masked positions
    (the Monte-Carlo term of the perplexity bound). ``logits`` (B, L, V); the rest (B, L) / (B,)."""
    b, l, v = logits.shape
    ce = F.cross_entropy(logits.float().reshape(b * l, v), targets.to(logits.device).reshape(-1), reduction="none")
    ce = torch.where(masked.to(logits.device).reshape(-1), ce, torch.zeros_like(ce)).reshape(b, l).sum(-1)
    return float((ce.cpu() * schedule.weight(t)).sum())


def perplexity_bound(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                     num_t_samples: int = 8, batch_size: int = 16, schedule: LogLinearSchedule | None = None,
                     t_min: float = 1e-3, seed: int = 0, mask_token_id: int | None = None,
                     loss_mask: torch.Tensor | None = None) -> PerplexityBound:
    """Evaluate the NELBO perplexity bound of ``model`` on ``input_ids`` (N, L): each sequence is
    noised at ``num_t_samples`` stratified times ``t_k = t_min + (1 - t_min)(k + u)/K``; the
    weighted masked CE is summed and divided by (K x number of eligible tokens). Deterministic
    for a given ``seed``. ``loss_mask`` restricts scoring to some positions (e.g. a task's answers)."""
    if num_t_samples < 1:
        raise ConfigError(f"num_t_samples={num_t_samples} must be >= 1")
    if input_ids.dim() != 2 or input_ids.shape[0] == 0:
        raise ValueError(f"perplexity_bound needs a non-empty (N, L) tensor, got shape {tuple(input_ids.shape)}")
    schedule = schedule or LogLinearSchedule()
    mid = _mask_id(model, mask_token_id)
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    device = next(model.parameters()).device if hasattr(model, "parameters") else input_ids.device
    gen = torch.Generator().manual_seed(seed)
    total, n_tok = 0.0, 0
    k = num_t_samples
    for start in range(0, input_ids.shape[0], batch_size):
        x = input_ids[start:start + batch_size]
        am = attention_mask[start:start + batch_size] if attention_mask is not None else None
        lm = loss_mask[start:start + batch_size] if loss_mask is not None else None
        eligible = eligible_positions(x, am, None, lm)
        n_tok += int(eligible.sum())
        u = torch.rand(x.shape[0], 1, generator=gen)
        ts = t_min + (1 - t_min) * (torch.arange(k).reshape(1, k) + u) / k  # (b, K)
        xr = x.repeat_interleave(k, 0)
        er = eligible.repeat_interleave(k, 0)
        amr = am.repeat_interleave(k, 0) if am is not None else None
        t = ts.reshape(-1)
        z, masked = q_sample(xr, t, mid, schedule, maskable=er, generator=gen)
        out = model(input_ids=z.to(device), attention_mask=amr.to(device) if amr is not None else None)
        total += weighted_masked_ce(out.logits, xr, masked, t, schedule)
    if was_training:
        model.train()
    if n_tok == 0:
        raise ValueError("perplexity_bound: no tokens to score (all padding or empty loss_mask)")
    nelbo = total / (k * n_tok)
    return PerplexityBound(nelbo=nelbo, perplexity=math.exp(min(nelbo, 700.0)), num_tokens=n_tok,
                           num_sequences=int(input_ids.shape[0]), num_t_samples=k)


__all__ = [
    "LogLinearSchedule", "sample_times", "q_sample", "frequency_anchor_mask", "gamma_schedule", "DiffusionLoss",
    "eligible_positions", "weighted_ce", "diffusion_loss", "PerplexityBound", "perplexity_bound",
]
