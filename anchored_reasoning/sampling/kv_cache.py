"""Fast-dLLM's approximate KV cache for block (semi-autoregressive) sampling of our own diffusion LMs.

Our models (:class:`~anchored_reasoning.models.MDLM`, ``ADLM``, ``TADM``) are bidirectional, so the
keys and values of a committed position still change when later positions are revealed. Fast-dLLM
(Wu et al., 2025) observed that within one block they change little, and reuses them:

* ``"prefix"``: at the first model call of each block a full forward pass stores every layer's
  keys/values; the later calls of that block recompute only the positions from the block's start
  to the end (the current block and the masked suffix) and attend to the stored keys/values of the
  prompt and the committed earlier blocks.
* ``"dual"``: the stored keys/values of the masked suffix are reused as well, so the later calls
  compute the current block alone.

The approximation is exactly that reuse: the prefix (and, for ``"dual"``, the suffix) does not see
the tokens revealed inside the current block until the next block's full pass. Committed tokens
never change (that is the sampler's rule, not the cache's). A block's first call is exact.

A model with the output shift (``shift_logits``: position t predicted from t-1's state, DiffuGPT/Dream
style) needs the state just before the block: its cached calls compute the span from one position
earlier (that position's keys/values are refreshed too) and return the span's outputs only.

Composes with the anchor cache of two-stage models (``anchor_refresh_every=K``, TADM/ADLM): the
anchor network then runs (on the active positions, with its own stored keys/values) at every block's
full pass and every K calls after it; the shared network S and the denoiser run at every call.

Use it through :class:`~.samplers.SamplerConfig`: ``SamplerConfig(block_length=8, kv_cache="prefix")``.
:class:`KVCacheModelFn` counts ``query_positions`` (transformer-layer positions computed) and
``full_passes`` so the saving can be checked.
"""
from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..models.blocks import apply_rotary, default_position_ids, rotary_tables, subs_log_probs

logger = logging.getLogger(__name__)

KV_CACHE_MODES = ("none", "prefix", "dual")  # SamplerConfig.kv_cache

Kv = list[tuple[torch.Tensor, torch.Tensor]]


def _run_encoder(enc: Any, x: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor | None, *,
                 store: Kv | None = None, past: Kv | None = None, span: tuple[int, int] | None = None) -> torch.Tensor:
    """``enc``'s blocks (the same computation as :class:`~anchored_reasoning.models.blocks.Encoder`).

    Full pass (``past is None``): ``x`` holds every position; each layer's rotary keys and values are
    appended to ``store``. Cached pass: ``x`` holds the positions ``span = (a, b)`` only; their fresh
    keys/values replace positions a..b of the stored ones (``past``) for attention. ``positions``
    and ``keep`` (the key padding mask, (B, L) bool) always cover the whole sequence."""
    head_dim = enc.head_dim
    pos = positions if span is None else positions[:, span[0]:span[1]]
    cos, sin = rotary_tables(pos, head_dim, enc.rope_theta, x.dtype)
    bias = None if keep is None else keep[:, None, None, :]
    for i, layer in enumerate(enc.layers):
        b, l, d = x.shape
        q, k, v = layer.qkv(layer.attn_norm(x)).view(b, l, 3, layer.num_heads, layer.head_dim).permute(2, 0, 3, 1, 4)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if past is None:
            if store is not None:
                store.append((k, v))
        else:
            pk, pv = past[i]
            a, e = span
            k = torch.cat([pk[:, :, :a], k, pk[:, :, e:]], dim=2)
            v = torch.cat([pv[:, :, :a], v, pv[:, :, e:]], dim=2)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        x = x + layer.attn_out(att.transpose(1, 2).reshape(b, l, d))
        x = x + layer.mlp_out(F.gelu(layer.mlp_in(layer.mlp_norm(x))))
    return enc.norm(x)


def _arch(model: Any) -> str:
    """Which of our architectures ``model`` is (duck-typed on the modules each one has)."""
    if all(hasattr(model, a) for a in ("shared", "anchor", "fusion", "denoiser")):
        return "tadm"
    if all(hasattr(model, a) for a in ("anchor", "anchor_head", "anchor_proj", "denoiser")):
        return "adlm"
    if hasattr(model, "encoder") and hasattr(model, "embed_tokens") and hasattr(model, "lm_head"):
        return "mdlm"
    raise ConfigError(f"kv_cache needs one of this library's diffusion models (MDLM, ADLM, TADM); "
                      f"{type(model).__name__} is not one (external checkpoints such as LLaDA/Dream run uncached: "
                      "kv_cache='none')")


class KVCacheModelFn:
    """A ``model_fn`` for :func:`~.samplers.sample` with Fast-dLLM's approximate KV cache (see the
    module doc). The sampler calls :meth:`start_block` before each block; every call then returns
    SUBS log-probabilities for positions ``logits_offset`` onwards (the sampler slices its block).

    ``mode``: ``"prefix"`` or ``"dual"``; ``refresh_every``: the anchor cache's K for two-stage
    models (1 = anchor every call). Counters: ``calls``, ``full_passes``, ``anchor_calls`` and
    ``query_positions`` (sum over transformer-layer calls of the positions computed)."""

    def __init__(self, model: Any, mode: str = "prefix", refresh_every: int = 1,
                 attention_mask: torch.Tensor | None = None):
        if mode not in ("prefix", "dual"):
            raise ConfigError(f"kv_cache={mode!r}: KVCacheModelFn takes 'prefix' or 'dual' ('none' means no cache)")
        if refresh_every < 1:
            raise ConfigError(f"refresh_every={refresh_every} must be >= 1")
        self.arch = _arch(model)
        self.shifted = bool(getattr(model.config, "shift_logits", False))
        if refresh_every > 1 and self.arch == "mdlm":
            raise ConfigError("anchor_refresh_every > 1 needs a two-stage model (ADLM, TADM); this is an MDLM")
        self.model, self.mode, self.refresh_every, self.attention_mask = model, mode, refresh_every, attention_mask
        self.span: tuple[int, int] | None = None
        self.logits_offset = 0
        self._fresh = True
        self._kv: dict[str, Kv] = {}
        self._anchor: torch.Tensor | None = None
        self._anchor_offset = 0
        self._since_anchor = 0
        self.calls = self.full_passes = self.anchor_calls = self.query_positions = 0

    def start_block(self, start: int, end: int) -> None:
        """The sampler is about to denoise positions ``start..end``: the next call is a full pass."""
        self._block = (start, end)
        self._fresh = True

    # ------------------------------------------------------------------ stages
    def _enc(self, name: str, enc: Any, x: torch.Tensor, positions, keep) -> torch.Tensor:
        n = len(enc.layers)
        if self._fresh:
            self._kv[name] = []
            self.query_positions += n * x.shape[1]
            return _run_encoder(enc, x, positions, keep, store=self._kv[name])
        self.query_positions += n * x.shape[1]
        return _run_encoder(enc, x, positions, keep, past=self._kv[name], span=self.span)

    def __call__(self, z: torch.Tensor, step: int) -> torch.Tensor:
        m = self.model
        bsz, length = z.shape
        if getattr(self, "_block", None) is None:
            self.start_block(0, length)
        am = self.attention_mask
        positions = default_position_ids(am, bsz, length, z.device)
        keep = None
        if am is not None:
            keep = am.bool()
            keep = keep | ~keep.any(dim=-1, keepdim=True)
        start, end = self._block
        # a shifted head (shift_logits) predicts position t from t-1's state: a cached call computes one more position
        back = 1 if self.shifted and start > 0 else 0
        self.span = (start - back, length if self.mode == "prefix" else end)
        a, e = (0, length) if self._fresh else self.span
        drop = 0 if self._fresh else back  # that extra position's own output is not returned
        lo = max(0, a - int(m.config.token_shift))  # a token shift reads that many tokens before the span
        x = m.embed(z[:, lo:e], None if am is None else am[:, lo:e])[:, a - lo:]
        if self.arch == "mdlm":
            h = self._enc("encoder", m.encoder, x, positions, keep)
        else:
            refresh = self._fresh or self._anchor is None or self._since_anchor >= self.refresh_every
            c = self._enc("shared", m.shared, x, positions, keep) if self.arch == "tadm" else x
            if refresh:
                anchor = m.ar_aligned(m.anchor_head(self._enc("anchor", m.anchor, c, positions, keep))) \
                    if self.arch == "adlm" else self._enc("anchor", m.anchor, c, positions, keep)
                if self.arch == "tadm" and m.config.anchor_bottleneck == "logits":
                    anchor = m.anchor_proj(m.ar_aligned(m.anchor_head(anchor)))
                if drop and (self.arch == "adlm" or m.config.anchor_bottleneck == "logits"):
                    # the span's first position would read its own state; it keeps what the last pass gave it
                    anchor = torch.cat([self._anchor[:, a - self._anchor_offset:a - self._anchor_offset + 1], anchor[:, 1:]], 1)
                self._anchor, self._anchor_offset, self._since_anchor = anchor, a, 0
                self.anchor_calls += 1
            anchor = self._anchor[:, a - self._anchor_offset:e - self._anchor_offset]  # a block's full pass covers all
            if self.arch == "adlm":
                h_in = m.anchor_proj(anchor.to(m.anchor_proj.weight.dtype))
            else:
                h_in = m.fusion(c, anchor)
            h = self._enc("denoiser", m.denoiser, h_in.to(m.lm_head.weight.dtype), positions, keep)
            self._since_anchor += 1
        if self._fresh:
            self.full_passes += 1
        self._fresh = False
        self.calls += 1
        logits = m.lm_head(h)
        if self.arch == "mdlm" or self.arch == "tadm" and m.config.anchor_bottleneck == "hidden":
            logits = m.ar_aligned(logits)  # the output head an AR init filled
        self.logits_offset = a + drop
        return subs_log_probs(logits[:, drop:], z[:, a + drop:e], int(m.config.mask_token_id))


__all__ = ["KVCacheModelFn", "KV_CACHE_MODES"]
