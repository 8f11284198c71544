"""TADM:Post-train on a frozen DiffusionGemma: a fusion of the current state with a cached
anchor state, and sampling that runs the anchor network only every K denoising steps
(design: ../shared/PAPERS.md section 3; arXiv 2609.37924, section 6.1).

The decoder's layers are split (:class:`~anchored_reasoning.models.diffusion_gemma.LayerSplit`;
the paper: 2 / 20 / 8 of 30)::

    canvas z, self-cond. --embed--> S (shared layers, every step) --c------------------------+
                                      |                                                      |
                                      +--> A (anchor layers, every K steps) --> h (cached)   |
                                      +--> c0 = c at that step (cached)         |            v
                                                  h~ = Phi(c, h, c0)
                                                  D (denoiser layers, norm, LM head) --> logits

The fusion Phi (:mod:`anchored_reasoning.models.tadm_fusion`, two kinds: ``attention``, the library's
cross-attention, and ``paired``, the paper's paired attention) is the only part that trains. Both start
as the identity on ``h``, so an untrained Phi at a fresh anchor (K = 1) gives the base model's logits bit
for bit; the paired kind keeps that after training (its correction is zero when ``c == c0``). Phi runs
at every step, refresh steps included (training sees cache ages 0, 1, 2), so K = 1 costs the base model
plus Phi. Without a fusion (``fusion=None``) ``h~ = h``: naive stale reuse, the baseline TADM improves on.

:class:`TADMDiffusionGemma` samples through the model's own ``generate`` (its block loop, canvas,
acceptance, renoising and self-conditioning untouched): for the call it replaces the model's ``forward``
-- the one function ``generate`` calls for every denoising step -- by the cached one, and counts the
calls (:class:`CallCounters`). Per sample, decoder layer calls are
``nfe * (L_S + L_D) + refreshes * L_A`` against ``nfe * L`` for the base model.

**Confidence-triggered refresh** (``anchor_refresh_below=tau``; the rule of the library's own TADM
sampler, :mod:`anchored_reasoning.sampling.cache`): the anchor is also refreshed at a step whose next
decision is a hard one. DiffusionGemma has no mask token: each step accepts the lowest-entropy positions
and renoises the rest, so the positions still to decide are the renoised ones -- those whose canvas
token differs from the previous step's prediction (its argmax under the self-conditioning logits, the
previous step's temperature-scaled logits that ``generate`` passes in). When the most confident of them
has top probability below ``tau``, the step refreshes. K stays the maximum staleness; the decision reads
only the previous step's output (no extra model call). A refresh covers the whole batch (the decoder's
context cache is shared by the rows); the eval backend generates one row at a time, so there it is per row.
"""
from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.models.diffusion_gemma import (
    LayerSplit,
    decoder_embed,
    decoder_head,
    decoder_layers,
    num_decoder_layers,
)
from anchored_reasoning.models.tadm_fusion import (
    AnchorFusion,
    AnchorFusionConfig,
    PairedAnchorFusion,
    fusion_parameters,
    load_fusion,
    make_fusion,
)
from anchored_reasoning.sampling.cache import check_refresh_below, next_decision_is_hard

logger = logging.getLogger(__name__)


@dataclass
class CallCounters:
    """Work done by one ``generate`` call (batch-level: one call of a layer covers every row).

    ``nfe``: decoder forward passes (denoising steps); ``anchor_refreshes``: steps that ran A;
    ``decoder_layer_calls`` / ``anchor_layer_calls``: layer calls of the decoder (S + A + D) and of A
    alone; ``base_decoder_layer_calls``: what the base model would run for the same steps (``nfe * L``);
    ``fusion_calls``: steps that ran Phi; ``canvases``: canvases denoised (each starts with a refresh);
    ``confidence_refreshes``: the refreshes the confidence rule added (``anchor_refresh_below``)."""

    nfe: int = 0
    anchor_refreshes: int = 0
    decoder_layer_calls: int = 0
    anchor_layer_calls: int = 0
    base_decoder_layer_calls: int = 0
    fusion_calls: int = 0
    canvases: int = 0
    confidence_refreshes: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class TADMDiffusionGemma:
    """A frozen DiffusionGemma sampled with its anchor network refreshed every ``anchor_refresh_every``
    (K) denoising steps, through the model's own ``generate``. ``fusion``: a trained
    :class:`AnchorFusion` (its split is used), or None for naive stale reuse (``split`` then, default
    proportional). ``anchor_refresh_below``: also refresh at a step whose next decision is predicted below
    this probability (the module doc). ``counters`` holds the last ``generate`` call's :class:`CallCounters`."""

    def __init__(self, model: Any, fusion: AnchorFusion | None = None, *, split: Any = None,
                 anchor_refresh_every: int = 1, anchor_refresh_below: float | None = None):
        if not isinstance(anchor_refresh_every, int) or isinstance(anchor_refresh_every, bool) or anchor_refresh_every < 1:
            raise ConfigError(f"anchor_refresh_every={anchor_refresh_every!r} must be an integer >= 1 (1: the anchor "
                              "network at every step, K: every K steps)")
        self.refresh_below = check_refresh_below(anchor_refresh_below, "anchor_refresh_below")
        if fusion is not None and split is not None and LayerSplit.for_model(model.config, split) != fusion.config.split:
            raise ConfigError(f"split {split!r} differs from the fusion's {fusion.config.split}; a trained fusion only "
                              "works with the split it was trained for (leave split unset)")
        self.split = LayerSplit.for_model(model.config, fusion.config.split if fusion is not None else split)
        if fusion is not None and fusion.config.hidden_size != model.config.get_text_config().hidden_size:
            raise ConfigError(f"the fusion is for hidden size {fusion.config.hidden_size}, the model has "
                              f"{model.config.get_text_config().hidden_size}: it was trained for another base model")
        self.model, self.fusion, self.refresh_every = model, fusion, anchor_refresh_every
        self.counters = CallCounters()
        self._anchor: torch.Tensor | None = None
        self._anchor_current: torch.Tensor | None = None  # C0: S's output at the refresh step (the paired fusion)
        self._age = 0
        self._canvas_start: int | None = None

    # -- one denoising step ---------------------------------------------------------------
    def stages(self, canvas: torch.Tensor, past_key_values: Any, **decoder_kwargs: Any) -> tuple[torch.Tensor, Any]:
        """``(c, step)``: S's output on ``canvas`` and the step's positions/masks (decoder keywords as
        the model's ``forward`` takes them)."""
        hidden, step = decoder_embed(self.model, canvas, past_key_values, **decoder_kwargs)
        return decoder_layers(self.model, hidden, 0, self.split.shared, step), step

    def anchor(self, current: torch.Tensor, step: Any) -> torch.Tensor:
        """A's output on S's output ``current``: the state that is cached."""
        lo, hi = self.split.anchor_range
        return decoder_layers(self.model, current, lo, hi, step)

    def denoise(self, current: torch.Tensor, anchor: torch.Tensor, step: Any, fuse: bool = True,
                anchor_current: torch.Tensor | None = None) -> torch.Tensor:
        """Logits from the current state and an (possibly stale) anchor state: D(Phi(c, h)), or D(h)
        without a fusion or with ``fuse=False``. ``anchor_current``: S's output at the step that computed
        the anchor (C0; the paired fusion needs it)."""
        fused = self.fusion(current, anchor, anchor_current) if (fuse and self.fusion is not None) else anchor
        hidden = decoder_layers(self.model, fused, self.split.anchor_range[1], num_decoder_layers(self.model), step)
        return decoder_head(self.model, hidden)

    def hard_step(self, canvas: torch.Tensor, previous_logits: torch.Tensor) -> bool:
        """The confidence rule (module doc): True when, in some row, the most confident position still to
        decide (canvas token != the previous step's argmax) has top probability below ``anchor_refresh_below``."""
        logits = previous_logits.float()
        top, argmax = logits.max(-1)
        confidence = (top - torch.logsumexp(logits, -1)).exp()
        return bool(next_decision_is_hard(confidence, canvas != argmax, self.refresh_below).any())

    def _cached_forward(self, input_ids=None, decoder_input_ids=None, past_key_values=None,
                        self_conditioning_logits=None, decoder_position_ids=None, **kwargs):
        from transformers.models.diffusion_gemma.modeling_diffusion_gemma import DiffusionGemmaBlockDiffusionOutputWithPast

        model = self.model
        if input_ids is not None or decoder_input_ids is None:  # not a denoising step: the model's own forward
            return type(model).forward(model, input_ids=input_ids, decoder_input_ids=decoder_input_ids,
                                       past_key_values=past_key_values, self_conditioning_logits=self_conditioning_logits,
                                       decoder_position_ids=decoder_position_ids, **kwargs)
        start = int(decoder_position_ids.reshape(-1)[0]) if decoder_position_ids is not None else None
        if self._anchor is None or self_conditioning_logits is None or start != self._canvas_start:
            self._anchor, self._canvas_start = None, start  # a new canvas: its first step refreshes
            self.counters.canvases += 1
        current, step = self.stages(decoder_input_ids, past_key_values, self_conditioning_logits=self_conditioning_logits,
                                    decoder_position_ids=decoder_position_ids, **kwargs)
        c = self.counters
        refresh = self._anchor is None or self._age >= self.refresh_every
        if not refresh and self.refresh_below is not None and self.hard_step(decoder_input_ids, self_conditioning_logits):
            refresh = True
            c.confidence_refreshes += 1
        if refresh:
            self._anchor, self._anchor_current, self._age = self.anchor(current, step), current, 0
            c.anchor_refreshes += 1
            c.anchor_layer_calls += self.split.anchor
            c.decoder_layer_calls += self.split.anchor
        logits = self.denoise(current, self._anchor, step, anchor_current=self._anchor_current)
        self._age += 1
        c.nfe += 1
        c.fusion_calls += int(self.fusion is not None)
        c.decoder_layer_calls += self.split.shared + self.split.denoiser
        c.base_decoder_layer_calls += self.split.total
        return DiffusionGemmaBlockDiffusionOutputWithPast(logits=logits, past_key_values=past_key_values)

    @contextlib.contextmanager
    def cached_sampling(self):
        """Within the block, ``self.model.generate`` (and any ``self.model(...)``) denoises with the cache."""
        model = self.model
        if "forward" in vars(model):
            raise ConfigError("the model's forward is already replaced (a cached sampling inside another)")
        self.counters, self._anchor, self._anchor_current, self._age, self._canvas_start = CallCounters(), None, None, 0, None
        model.forward = self._cached_forward
        try:
            yield self
        finally:
            del model.forward
            self._anchor = self._anchor_current = None

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, **kwargs: Any):
        """``model.generate(input_ids, **kwargs)`` with the anchor cache; counters in :attr:`counters`."""
        if self.fusion is not None:
            self.fusion.eval()
        with self.cached_sampling():
            return self.model.generate(input_ids, **kwargs)

    def describe(self) -> dict[str, Any]:
        return {"split": asdict(self.split), "anchor_refresh_every": self.refresh_every,
                "anchor_refresh_below": self.refresh_below,
                "fusion": None if self.fusion is None else {"kind": self.fusion.config.fusion_kind,
                                                             "parameters": fusion_parameters(self.fusion),
                                                             "fusion_dim": self.fusion.config.fusion_dim,
                                                             "num_heads": self.fusion.config.num_heads}}


def layer_calls_per_canvas(split: LayerSplit, steps: int, refresh_every: int) -> int:
    """Decoder layer calls for one canvas of ``steps`` steps: ``T (L_S + L_D) + ceil(T / K) L_A``."""
    return steps * (split.shared + split.denoiser) + math.ceil(steps / refresh_every) * split.anchor


__all__ = ["AnchorFusion", "AnchorFusionConfig", "CallCounters", "PairedAnchorFusion", "TADMDiffusionGemma",
           "fusion_parameters", "layer_calls_per_canvas", "load_fusion", "make_fusion"]
