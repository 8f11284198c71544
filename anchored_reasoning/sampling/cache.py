"""Anchor caching for two-stage diffusion models (ADLM now, TADM later).

A model that exposes ``anchor_forward(z, attention_mask) -> anchor`` and
``denoise(anchor, z, attention_mask) -> logits`` can reuse the (expensive) anchor output for
several steps. :class:`AnchorCacheModelFn` is a ``model_fn`` for :func:`~.samplers.sample` that
recomputes the anchor only every ``refresh_every`` model calls (K = 1: every call, exactly the
uncached model). Plain ADLM is not trained for stale anchors, so K > 1 trades quality for speed;
TADM's fusion module is what makes staleness cheap.
"""
from __future__ import annotations

from typing import Any

import torch

from ..errors import ConfigError


class AnchorCacheModelFn:
    """``model_fn(z, step)`` with an anchor cache refreshed every ``refresh_every`` calls.
    ``anchor_calls`` and ``calls`` count the anchor and denoiser passes."""

    def __init__(self, model: Any, refresh_every: int = 1, attention_mask: torch.Tensor | None = None):
        if refresh_every < 1:
            raise ConfigError(f"refresh_every={refresh_every} must be >= 1")
        if not (hasattr(model, "anchor_forward") and hasattr(model, "denoise")):
            raise ConfigError(f"{type(model).__name__} has no anchor_forward/denoise; anchor caching needs a two-stage "
                              "model such as ADLM")
        self.model, self.refresh_every, self.attention_mask = model, refresh_every, attention_mask
        self.anchor: torch.Tensor | None = None
        self.calls = 0
        self.anchor_calls = 0

    def __call__(self, z: torch.Tensor, step: int) -> torch.Tensor:
        if self.anchor is None or self.calls % self.refresh_every == 0:
            self.anchor = self.model.anchor_forward(z, self.attention_mask)
            self.anchor_calls += 1
        self.calls += 1
        return self.model.denoise(self.anchor, z, self.attention_mask)
