"""Anchor caching for two-stage diffusion models (ADLM, TADM).

A model that exposes ``anchor_forward(z, attention_mask) -> anchor`` and
``denoise(anchor, z, attention_mask) -> logits`` can reuse the (expensive) anchor output for
several steps. :class:`AnchorCacheModelFn` is a ``model_fn`` for :func:`~.samplers.sample` that
recomputes the anchor only when it is ``refresh_every`` model calls old (K = 1: every call, exactly
the uncached model). Plain ADLM is not trained for stale anchors, so K > 1 trades quality for speed;
TADM's fusion module is what makes staleness cheap.

**Confidence-triggered refresh** (``refresh_below=tau``): the anchor is also refreshed, for one row of
the batch only, at a step whose next token is a hard one -- the most confident still-masked position
under the previous call's prediction has probability below ``tau``. Low-confidence decoding reveals
the easy tokens (format, padding) first and the decisive ones (a looked-up entity, the answer) last;
a fixed K spends its fresh anchors on the easy steps as often as on the hard ones. The anchor network
sees each row on its own (attention stays inside a row), so refreshing a subset of rows and splicing
them into the cache is exact: those rows get what a full refresh would give them, at the cost of
those rows only. ``refresh_every`` stays the maximum staleness. The decision reads only the previous
call's output, so it costs no extra model call; ``refresh_fraction`` reports the rows x calls that ran
the anchor network (1/K for plain K-periodic caching).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..errors import ConfigError


def check_refresh_below(value: float | None, where: str = "refresh_below") -> float | None:
    """``value`` as a float in (0, 1], or None; a clear error otherwise (before any work)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ConfigError(f"{where}={value!r} must be a probability in (0, 1] (or unset: K-periodic refresh only)")
    return float(value)


def next_decision_is_hard(confidence: torch.Tensor, unsettled: torch.Tensor, tau: float) -> torch.Tensor:
    """The refresh rule, per row: (B,) True where some position is still unsettled and the most confident
    of them -- the next one a confidence-ordered sampler decides -- has top probability below ``tau``.
    ``confidence`` (B, L): the previous call's top probability per position; ``unsettled`` (B, L): the
    positions still to decide (masked for a masked diffusion LM; renoised for DiffusionGemma)."""
    nxt = confidence.masked_fill(~unsettled, -1.0).max(-1).values
    return unsettled.any(-1) & (nxt < tau)


def _splice(cached: Any, fresh: Any, rows: torch.Tensor) -> Any:
    """``cached`` with ``rows`` replaced by ``fresh`` (computed for those rows only): a tensor, or a
    dataclass of per-row tensors (TADM's anchor); None fields stay None."""
    if isinstance(cached, torch.Tensor):
        out = cached.clone()
        out[rows] = fresh.to(out.dtype)
        return out
    if dataclasses.is_dataclass(cached):
        return type(cached)(**{f.name: _splice(getattr(cached, f.name), getattr(fresh, f.name), rows)
                               for f in dataclasses.fields(cached)})
    if cached is None:
        return None
    raise TypeError(f"cannot splice an anchor of type {type(cached).__name__}")


class AnchorCacheModelFn:
    """``model_fn(z, step)`` with an anchor cache refreshed when ``refresh_every`` calls old, and, with
    ``refresh_below``, for any row whose next token to reveal is predicted with less confidence.
    ``anchor_calls`` counts anchor passes (of any number of rows), ``calls`` denoiser passes,
    ``anchor_rows`` / ``row_calls`` the rows they covered."""

    def __init__(self, model: Any, refresh_every: int = 1, attention_mask: torch.Tensor | None = None,
                 refresh_below: float | None = None, mask_token_id: int | None = None):
        if refresh_every < 1:
            raise ConfigError(f"refresh_every={refresh_every} must be >= 1")
        refresh_below = check_refresh_below(refresh_below)
        if not (hasattr(model, "anchor_forward") and hasattr(model, "denoise")):
            raise ConfigError(f"{type(model).__name__} has no anchor_forward/denoise; anchor caching needs a two-stage "
                              "model such as ADLM")
        if refresh_below is not None and mask_token_id is None:
            mask_token_id = getattr(getattr(model, "config", None), "mask_token_id", None)
            if mask_token_id is None:
                raise ConfigError("refresh_below needs the model's mask token id (config.mask_token_id)")
        self.model, self.refresh_every, self.attention_mask = model, refresh_every, attention_mask
        self.refresh_below, self.mask_token_id = refresh_below, mask_token_id
        self.anchor: Any = None
        self.age: torch.Tensor | None = None  # per row: calls since its anchor was computed
        self.confidence: torch.Tensor | None = None  # (B, L): the last call's top probability per position
        self.calls = self.anchor_calls = self.anchor_rows = self.row_calls = 0

    @property
    def refresh_fraction(self) -> float:
        """Rows x calls that ran the anchor network, over rows x calls (1/K for K-periodic caching)."""
        return self.anchor_rows / self.row_calls if self.row_calls else 0.0

    def _stale_rows(self, z: torch.Tensor) -> torch.Tensor:
        need = self.age >= self.refresh_every
        if self.refresh_below is not None and self.confidence is not None:
            need |= next_decision_is_hard(self.confidence, z == self.mask_token_id, self.refresh_below)
        return need

    def _mask_rows(self, rows: torch.Tensor) -> torch.Tensor | None:
        return self.attention_mask[rows] if self.attention_mask is not None else None

    def __call__(self, z: torch.Tensor, step: int) -> torch.Tensor:
        bsz = z.shape[0]
        if self.anchor is None:
            need = torch.ones(bsz, dtype=torch.bool, device=z.device)
        else:
            need = self._stale_rows(z)
        if bool(need.all()):
            self.anchor = self.model.anchor_forward(z, self.attention_mask)
            self.age = torch.zeros(bsz, dtype=torch.long, device=z.device)
        elif bool(need.any()):
            rows = need.nonzero().flatten()
            self.anchor = _splice(self.anchor, self.model.anchor_forward(z[rows], self._mask_rows(rows)), rows)
            self.age[rows] = 0
        n = int(need.sum())
        self.anchor_calls += n > 0
        self.anchor_rows += n
        self.row_calls += bsz
        self.calls += 1
        self.age += 1
        logits = self.model.denoise(self.anchor, z, self.attention_mask)
        if self.refresh_below is not None:  # SUBS log-probs: the top probability of each position
            self.confidence = logits.detach().float().max(-1).values.exp()
        return logits
