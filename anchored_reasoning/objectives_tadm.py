"""TADM objectives: T-ANELBO (pretraining with stale anchors), the post-training loss (frozen
backbone, fusion only) and the perplexity bound under a K-step anchor cache.

**Stale anchors from the forward process (T-ANELBO and the stale perplexity bound).** A sampler
that refreshes the anchor every K model calls feeds the denoiser, at a step where the current
tokens are ``z_t``, an anchor computed ``a`` calls earlier, ``a`` in 0..K-1. With T sampler steps
on the log-linear schedule one step moves time by ``1/T``, so that anchor saw the *noisier*
sequence of the *later forward-process time* ``t' = min(1, t + a / T)``. Per row we draw

* ``K`` uniformly from ``k_choices`` (default {1, 2, 4, 8}) and the cache age ``a`` uniformly
  from 0..K-1 (so ``a = 0``, a fresh anchor, has probability (1 + 1/2 + 1/4 + 1/8)/4 ~ 0.47);
* the budget ``T``: fixed (``sampling_steps``), or, with ``budget_choices`` (the paper draws it from
  :data:`BUDGET_CHOICES` = {128, ..., 4096} for 1,024-token sequences), uniformly from those per row;
* ``z_t`` by the usual forward process at time ``t``;
* ``z_t'`` from the *same* trajectory: every position masked in ``z_t`` stays masked, and each
  other eligible position is masked independently with probability ``(p(t') - p(t)) / (1 - p(t))``
  where ``p = 1 - alpha`` -- exactly the law of the forward process at ``t'`` coupled with ``z_t``
  (one uniform per position thresholded at ``p(t)`` and ``p(t')``), which is also what a
  locked-in sampler's reverse trajectory looks like (masks only ever disappear).

The model is ``TADM(z_t, anchor_input_ids=z_t')``; everything else is ADLM's ANELBO
(:func:`anchored_reasoning.objectives.diffusion_loss`): the denoiser's NELBO on the positions
masked in ``z_t`` with weight ``w(t)``, plus ``gamma`` x the anchor head's CE at anchor positions
(anchor logits from ``z_t'``), with the same weight ``w(t)`` and normalisation. ``gamma = 0`` is
fully self-supervised; ``gamma > 0`` (3e-3 in ADLM) adds ADLM's anchor supervision.

**Post-training** (:func:`posttrain_loss`; backbone frozen, only Phi has gradients): per batch a
rollout length ``k`` is drawn from ``rollout_choices`` (default {0, 1, 2}); ``z_t`` is drawn with
``t`` in ``[t_min + k/T, 1]``; the anchor is computed once from ``z_t`` and *held fixed* while the
model (the current TADM, stale anchor, no gradient) takes ``k`` ancestral reverse steps
``t -> t - 1/T`` (each masked position revealed with probability ``(1/T)/t``, its token drawn from
the model). At the resulting ``z_{t_k}``, ``t_k = t - k/T``, the loss is

    ce_weight * NELBO(student)  +  kl_weight * KL(teacher || student)

where the student is Phi + D on the stale anchor, the teacher is the frozen source model on a fresh
anchor (``denoise(anchor_forward(z), z, fuse=False)``), the NELBO term is the weighted masked CE
with ``w(t_k)`` (as in pretraining) and the KL is the mean over masked positions (unweighted).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from .errors import ConfigError
from .objectives import (
    DiffusionLoss, LogLinearSchedule, PerplexityBound, _mask_id, diffusion_loss, eligible_positions, q_sample,
    sample_times, weighted_ce, weighted_masked_ce,
)

logger = logging.getLogger(__name__)

K_CHOICES = (1, 2, 4, 8)
#: the paper's sampling budgets T for its 1,024-token sequences (appendix C.2); scale them with the length
BUDGET_CHOICES = (128, 256, 512, 1024, 2048, 4096)
ROLLOUT_CHOICES = (0, 1, 2)


def _check_choices(values: Sequence[int], name: str, minimum: int) -> tuple[int, ...]:
    vals = tuple(int(v) for v in values)
    if not vals or any(v < minimum for v in vals):
        raise ConfigError(f"{name}={list(values)} must be a non-empty list of integers >= {minimum}")
    return vals


def draw_staleness(bsz: int, k_choices: Sequence[int] = K_CHOICES, generator: torch.Generator | None = None,
                   device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: a refresh period K uniform over ``k_choices`` and a cache age uniform in 0..K-1.
    Returns ``(K, age)``, two long tensors of shape (bsz,)."""
    ks = torch.tensor(_check_choices(k_choices, "k_choices", 1), dtype=torch.long)
    gen_device = generator.device if generator is not None else "cpu"
    pick = torch.randint(len(ks), (bsz,), generator=generator, device=gen_device).cpu()
    k = ks[pick]
    age = (torch.rand(bsz, generator=generator, device=gen_device).cpu() * k).long().clamp(max=k - 1)
    return k.to(device or "cpu"), age.to(device or "cpu")


def draw_budgets(bsz: int, budget_choices: Sequence[int], generator: torch.Generator | None = None,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """Per row a sampling budget T uniform over ``budget_choices``: a long tensor of shape (bsz,)."""
    ts = torch.tensor(_check_choices(budget_choices, "budget_choices", 1), dtype=torch.long)
    gen_device = generator.device if generator is not None else "cpu"
    return ts[torch.randint(len(ts), (bsz,), generator=generator, device=gen_device).cpu()].to(device or "cpu")


def stale_times(t: torch.Tensor, age: torch.Tensor, steps: int | torch.Tensor) -> torch.Tensor:
    """``t' = min(1, t + age / steps)``: when the anchor was computed, ``age`` sampler steps earlier
    (``steps``: one budget T, or one per row)."""
    steps_t = torch.as_tensor(steps)
    if bool((steps_t < 1).any()):
        raise ConfigError(f"sampling_steps={steps} must be >= 1")
    return (t + age.to(t.dtype) / steps_t.to(device=t.device, dtype=t.dtype)).clamp(max=1.0)


def remask_to(z_t: torch.Tensor, t: torch.Tensor, t_stale: torch.Tensor, mask_token_id: int, eligible: torch.Tensor,
              schedule: LogLinearSchedule, generator: torch.Generator | None = None) -> torch.Tensor:
    """``z_t'`` coupled with ``z_t`` (t' >= t): masks of ``z_t`` kept, each other eligible position
    masked with probability ``(p(t') - p(t)) / (1 - p(t))``."""
    p_t = schedule.mask_prob(t.float()).reshape(-1, 1)
    p_s = schedule.mask_prob(t_stale.float()).reshape(-1, 1)
    extra = ((p_s - p_t) / (1 - p_t).clamp(min=1e-12)).clamp(0.0, 1.0)
    gen_device = generator.device if generator is not None else z_t.device
    r = torch.rand(z_t.shape, generator=generator, device=gen_device).to(z_t.device)
    more = eligible.bool() & (z_t != mask_token_id) & (r < extra.to(z_t.device))
    return torch.where(more, torch.full_like(z_t, mask_token_id), z_t)


class _StaleAnchorView:
    """Adapter for :func:`diffusion_loss`: called with ``z_t``, it builds ``z_t'`` and runs
    ``model(z_t, anchor_input_ids=z_t')``."""

    def __init__(self, model: Any, t: torch.Tensor, t_stale: torch.Tensor, eligible: torch.Tensor, mask_token_id: int,
                 schedule: LogLinearSchedule, generator: torch.Generator | None):
        self.model, self.t, self.t_stale, self.eligible = model, t, t_stale, eligible
        self.mask_token_id, self.schedule, self.generator = mask_token_id, schedule, generator
        self.stale_input_ids: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        self.stale_input_ids = remask_to(input_ids, self.t, self.t_stale, self.mask_token_id, self.eligible,
                                         self.schedule, self.generator)
        return self.model(input_ids=input_ids, attention_mask=attention_mask, anchor_input_ids=self.stale_input_ids)


@dataclass
class TANELBOLoss(DiffusionLoss):
    """:class:`DiffusionLoss` plus the drawn refresh periods ``k``, cache ages ``age`` and budgets ``budget`` (B,)."""

    k: torch.Tensor | None = None
    age: torch.Tensor | None = None
    budget: torch.Tensor | None = None

    def metrics(self) -> dict[str, float]:
        out = super().metrics()
        if self.age is not None:
            out["mean_cache_age"] = float(self.age.float().mean())
        return out


def t_anelbo(model: Any, input_ids: torch.Tensor, *, attention_mask: torch.Tensor | None = None,
             prompt_mask: torch.Tensor | None = None, loss_mask: torch.Tensor | None = None, t: torch.Tensor | None = None,
             schedule: LogLinearSchedule | None = None, gamma: float = 0.0, anchor_mask: torch.Tensor | None = None,
             anchor_tau: int = 5, anchor_ignore_ids: Sequence[int] = (), normalization: str = "token",
             antithetic: bool = True, t_min: float = 1e-3, mask_token_id: int | None = None,
             generator: torch.Generator | None = None, k_choices: Sequence[int] = K_CHOICES, sampling_steps: int = 64,
             age: torch.Tensor | None = None, budget_choices: Sequence[int] | None = None) -> TANELBOLoss:
    """T-ANELBO (see the module doc) for a model taking ``anchor_input_ids`` (:class:`TADM`).
    ``age`` (B,) fixes the cache ages instead of drawing them (then ``k`` is None); ``budget_choices``
    draws the budget T per row (else every row has ``sampling_steps``)."""
    schedule = schedule or LogLinearSchedule()
    mid = _mask_id(model, mask_token_id)
    bsz = input_ids.shape[0]
    if t is None:
        t = sample_times(bsz, antithetic=antithetic, t_min=t_min, generator=generator, device=input_ids.device)
    t = torch.as_tensor(t, dtype=torch.float32, device=input_ids.device).reshape(-1).expand(bsz)
    k = None
    if age is None:
        k, age = draw_staleness(bsz, k_choices, generator, input_ids.device)
    age = torch.as_tensor(age, device=input_ids.device).reshape(-1).expand(bsz)
    if budget_choices is not None:
        budget = draw_budgets(bsz, budget_choices, generator, input_ids.device)
    else:
        budget = torch.full((bsz,), int(sampling_steps), dtype=torch.long, device=input_ids.device)
    eligible = eligible_positions(input_ids, attention_mask, prompt_mask, loss_mask)
    view = _StaleAnchorView(model, t, stale_times(t, age, budget), eligible, mid, schedule, generator)
    base = diffusion_loss(view, input_ids, attention_mask=attention_mask, prompt_mask=prompt_mask, loss_mask=loss_mask,
                          t=t, schedule=schedule, gamma=gamma, anchor_mask=anchor_mask, anchor_tau=anchor_tau,
                          anchor_ignore_ids=anchor_ignore_ids, normalization=normalization, mask_token_id=mid,
                          generator=generator)
    return TANELBOLoss(**base.__dict__, k=k, age=age, budget=budget)


# --------------------------------------------------------------------------- post-training
@dataclass
class PostTrainLoss:
    """``loss`` = ``ce_weight * nelbo + kl_weight * kl`` at the rolled-out sequence; ``rollout`` = k."""

    loss: torch.Tensor
    nelbo: torch.Tensor
    kl: torch.Tensor
    rollout: int
    num_tokens: int
    num_masked: int
    t: torch.Tensor

    def metrics(self) -> dict[str, float]:
        return {"loss": float(self.loss.detach()), "nelbo": float(self.nelbo.detach()), "kl": float(self.kl.detach()),
                "rollout": self.rollout, "num_tokens": self.num_tokens, "num_masked": self.num_masked}


def _draw_tokens(log_probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per position from (B, L, V) log-probabilities (Gumbel-max)."""
    gen_device = generator.device if generator is not None else log_probs.device
    u = torch.rand(log_probs.shape, generator=generator, device=gen_device).to(log_probs.device).clamp_(1e-20, 1 - 1e-7)
    return (log_probs.float() - torch.log(-torch.log(u))).argmax(-1)


def posttrain_loss(model: Any, input_ids: torch.Tensor, *, attention_mask: torch.Tensor | None = None,
                   prompt_mask: torch.Tensor | None = None, loss_mask: torch.Tensor | None = None,
                   schedule: LogLinearSchedule | None = None, rollout_choices: Sequence[int] = ROLLOUT_CHOICES,
                   sampling_steps: int = 64, ce_weight: float = 1.0, kl_weight: float = 1.0, normalization: str = "token",
                   antithetic: bool = True, t_min: float = 1e-3, generator: torch.Generator | None = None,
                   rollout: int | None = None) -> PostTrainLoss:
    """TADM post-training loss (see the module doc). ``model`` is a :class:`TADM` (usually built by
    ``TADM.from_diffusion_model`` with its backbone frozen); ``rollout`` fixes k instead of drawing it."""
    schedule = schedule or LogLinearSchedule()
    mid = _mask_id(model, None)
    choices = _check_choices(rollout_choices, "rollout_choices", 0)
    if sampling_steps < 1:
        raise ConfigError(f"sampling_steps={sampling_steps} must be >= 1")
    if rollout is None:
        gen_device = generator.device if generator is not None else "cpu"
        rollout = choices[int(torch.randint(len(choices), (1,), generator=generator, device=gen_device))]
    dt = 1.0 / sampling_steps
    t_lo = t_min + rollout * dt
    if t_lo >= 1:
        raise ConfigError(f"a rollout of {rollout} steps of 1/{sampling_steps} does not fit in (t_min, 1]; "
                          "raise sampling_steps or lower rollout_choices")
    bsz = input_ids.shape[0]
    eligible = eligible_positions(input_ids, attention_mask, prompt_mask, loss_mask)
    u = sample_times(bsz, antithetic=antithetic, t_min=0.0, generator=generator, device=input_ids.device)
    t = t_lo + (1 - t_lo) * u
    z, _ = q_sample(input_ids, t, mid, schedule, maskable=eligible, generator=generator)
    with torch.no_grad():
        anchor = model.anchor_forward(z, attention_mask)  # held fixed through the rollout
        for j in range(rollout):
            t_j = t - j * dt
            log_probs = model.denoise(anchor, z, attention_mask)
            gen_device = generator.device if generator is not None else z.device
            r = torch.rand(z.shape, generator=generator, device=gen_device).to(z.device)
            reveal = (z == mid) & eligible & (r < (dt / t_j).reshape(-1, 1))
            z = torch.where(reveal, _draw_tokens(log_probs, generator), z)
        t_k = t - rollout * dt
        teacher = model.denoise(model.anchor_forward(z, attention_mask), z, attention_mask, fuse=False)
    student = model.denoise(anchor, z, attention_mask)
    masked = (z == mid) & eligible
    nelbo = weighted_ce(student, input_ids, masked, schedule.weight(t_k), eligible, normalization)
    kl_pos = (teacher.exp() * (teacher - student)).sum(-1)  # SUBS: impossible tokens have exp(-1e6) == 0
    kl = torch.where(masked, kl_pos, torch.zeros_like(kl_pos)).sum() / masked.sum().clamp(min=1)
    loss = ce_weight * nelbo + kl_weight * kl
    return PostTrainLoss(loss=loss, nelbo=nelbo, kl=kl, rollout=int(rollout), num_tokens=int(eligible.sum()),
                         num_masked=int(masked.sum()), t=t_k)


# --------------------------------------------------------------------------- evaluation
@torch.no_grad()
def stale_perplexity_bound(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                           refresh_every: int = 1, sampling_steps: int = 64, num_t_samples: int = 8,
                           batch_size: int = 16, schedule: LogLinearSchedule | None = None, t_min: float = 1e-3,
                           seed: int = 0, loss_mask: torch.Tensor | None = None) -> PerplexityBound:
    """The NELBO perplexity bound of a two-stage model when its anchor is refreshed every
    ``refresh_every`` calls of a ``sampling_steps``-step sampler: each scored ``z_t`` gets an anchor
    from the coupled ``z_t'`` with a cache age uniform in 0..K-1 (see the module doc). K = 1 is the
    plain bound (age 0, ``anchor_input_ids == input_ids``). Times, masks and ages are drawn from
    ``seed`` in the same order for every K, so bounds for different K share their ``z_t``.
    The model must accept ``anchor_input_ids`` (TADM) or expose ``anchor_forward``/``denoise`` (ADLM).
    ``loss_mask`` (B, L; True = scored) limits masking and scoring to part of each row (e.g. the
    response after a clean prompt); by default every non-padding token is scored."""
    if num_t_samples < 1 or refresh_every < 1:
        raise ConfigError(f"num_t_samples={num_t_samples} and refresh_every={refresh_every} must be >= 1")
    schedule = schedule or LogLinearSchedule()
    mid = _mask_id(model, None)
    was_training = getattr(model, "training", False)
    model.eval()
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    total, n_tok, k = 0.0, 0, num_t_samples
    for start in range(0, input_ids.shape[0], batch_size):
        x = input_ids[start:start + batch_size]
        am = attention_mask[start:start + batch_size] if attention_mask is not None else None
        eligible = eligible_positions(x, am, loss_mask=loss_mask[start:start + batch_size] if loss_mask is not None else None)
        n_tok += int(eligible.sum())
        u = torch.rand(x.shape[0], 1, generator=gen)
        t = (t_min + (1 - t_min) * (torch.arange(k).reshape(1, k) + u) / k).reshape(-1)
        xr, er = x.repeat_interleave(k, 0), eligible.repeat_interleave(k, 0)
        amr = am.repeat_interleave(k, 0).to(device) if am is not None else None
        z, masked = q_sample(xr, t, mid, schedule, maskable=er, generator=gen)
        age_u = torch.rand(xr.shape[0], generator=gen)  # drawn for every K so the draws stay aligned
        age = (age_u * refresh_every).long().clamp(max=refresh_every - 1)
        z_stale = remask_to(z, t, stale_times(t, age, sampling_steps), mid, er, schedule, gen)
        z, z_stale = z.to(device), z_stale.to(device)
        if hasattr(model, "fusion"):
            logits = model(input_ids=z, attention_mask=amr, anchor_input_ids=z_stale).logits
        else:
            logits = model.denoise(model.anchor_forward(z_stale, amr), z, amr)
        total += weighted_masked_ce(logits, xr, masked, t, schedule)
    if was_training:
        model.train()
    if n_tok == 0:
        raise ValueError("stale_perplexity_bound: no tokens to score")
    nelbo = total / (k * n_tok)
    return PerplexityBound(nelbo=nelbo, perplexity=math.exp(min(nelbo, 700.0)), num_tokens=n_tok,
                           num_sequences=int(input_ids.shape[0]), num_t_samples=k)


__all__ = ["K_CHOICES", "BUDGET_CHOICES", "ROLLOUT_CHOICES", "draw_staleness", "draw_budgets", "stale_times", "remask_to", "t_anelbo", "TANELBOLoss",
           "posttrain_loss", "PostTrainLoss", "stale_perplexity_bound"]
