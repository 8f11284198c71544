"""TADM: a time-anchored diffusion LM whose expensive anchor output is cached across denoising steps
(design: ../shared/PAPERS.md section 3; arXiv 2609.37924, the pretraining variant of its appendix C.2;
where this differs from the paper, docs/tadm.md says so).

Four parts, sizes from :class:`TADMConfig`::

    z_t --embed--> S (shared_layers blocks, every step) --c-------------------------------+
                     |                                                                   |
                     +--> A (num_hidden_layers blocks, every K steps) --> h (cached)     |
                                                                          |              v
                                          h~ = Phi(c, h) = h + g(c, h) * delta(c, h)  <--+
                                          D (denoiser_layers blocks) --lm_head--> SUBS log-probs

* ``anchor_bottleneck="logits"`` (default, ADLM-style): ``h = anchor_proj(anchor_head(A(S(z))))``;
  the anchor head's logits are what ADLM's anchor supervision (gamma > 0) trains.
  ``"hidden"``: ``h = A(S(z))`` (no anchor head; used when splitting a trained MDLM).
* Phi, the fusion module (``fusion_variant="published"``, the default: the paper's appendix C.2):
  both inputs are LayerNorm'ed and concatenated, ``u = [LN c; LN h]``; ``delta`` is a
  2d -> 4d -> d GELU MLP whose last projection (weight and bias) starts at zero; ``g`` a per-position,
  per-dimension sigmoid gate (bias starting at ``fusion_gate_bias``, -3); then an output LayerNorm:
  ``Phi(c, h) = LN_out(h + g * delta)``. So at initialisation ``Phi(c, h) == LN_out(h)``: the
  correction starts at zero and D reads the stale anchor, normalised. ``"residual"`` (checkpoints
  saved before the variant existed, and every TADM built by :meth:`TADM.from_diffusion_model`):
  no output LayerNorm and a d-wide MLP, so ``Phi(c, h) == h`` exactly at initialisation -- what
  post-training needs for an untrained TADM to equal its source model.
* Cost of sampling T steps with the anchor refreshed every K steps, in transformer-layer calls per
  sample: ``T * (L_S + L_D) + ceil(T / K) * L_A``.

The forward pass factors into :meth:`TADM.anchor_forward` (S then A; the cacheable part, also
keeping S's output for the same input) and :meth:`TADM.denoise` (S on the *current* tokens, Phi,
D), so :class:`~anchored_reasoning.sampling.cache.AnchorCacheModelFn` -- or
``SamplerConfig(anchor_refresh_every=K)`` -- caches the anchor for every sampler. ``forward`` is
exactly ``denoise(anchor_forward(z), z)`` unless ``anchor_input_ids`` (a staler, noisier sequence)
is given, which is how T-ANELBO trains with stale anchors.

:meth:`TADM.from_diffusion_model` builds a TADM from a trained ADLM or MDLM for post-training:
the backbone weights are copied, Phi is new, and :meth:`TADM.freeze_backbone` leaves only Phi
trainable. With Phi at its initialisation the result equals the source model bit for bit.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

try:  # a checkpoint's copy of this file (trust_remote_code, see models/__init__.py) runs without the library
    from anchored_reasoning.errors import ConfigError
except ImportError:  # pragma: no cover - only in such a copy
    ConfigError = ValueError
from .adlm import ADLMConfig
from .blocks import Block, Encoder, subs_log_probs
from .mdlm import DiffusionLMOutput, DiffusionPreTrainedModel, MDLMConfig

logger = logging.getLogger(__name__)

BOTTLENECKS = ("logits", "hidden")
FUSION_SCALES = ("relative", "absolute")
FUSION_VARIANTS = ("published", "residual")


class TADMConfig(MDLMConfig):
    """MDLM's fields (``num_hidden_layers`` = the anchor network's depth L_A) plus:

    * ``shared_layers`` (L_S): blocks of S, run at every step (0 = S is the token embedding only);
    * ``denoiser_layers`` (L_D; None = ``num_hidden_layers // 2``, at least 1);
    * ``fusion_variant``: ``"published"`` (the paper's T-ANELBO fusion: output LayerNorm, MLP width
      ``4 * hidden_size``) or ``"residual"`` (no output LayerNorm, width ``hidden_size``; Phi is the
      identity at initialisation). A saved config without this key is ``"residual"`` (see
      :meth:`from_dict`): the checkpoints written before it existed load as they were trained;
    * ``fusion_size``: Phi's MLP width (None = the variant's: 4d published, d residual);
      ``fusion_gate_bias``: g's initial bias;
    * ``fusion_scale``: ``"absolute"`` (default) adds Phi's correction as is; ``"relative"`` scales it
      by the RMS of h per position, so it is a share of h whatever h's size (tried for issue 13: on
      logic text it was no better, see docs/tadm.md);
    * ``anchor_bottleneck``: ``"logits"`` (ADLM: anchor head + linear projection of the logits) or
      ``"hidden"`` (the anchor network's hidden states).

    K (the refresh period) is not a model setting: it is the sampler's policy
    (``SamplerConfig(anchor_refresh_every=K)``), so one checkpoint serves every K.
    """

    model_type: ClassVar[str] = "tadm"

    shared_layers: int = 1
    denoiser_layers: int | None = None
    fusion_variant: str = "published"
    fusion_size: int | None = None
    fusion_gate_bias: float = -3.0
    fusion_scale: str = "absolute"
    anchor_bottleneck: str = "logits"

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """A config saved before ``fusion_variant`` existed describes the residual fusion it was trained with."""
        if "fusion_variant" not in config_dict:
            config_dict = {**config_dict, "fusion_variant": "residual"}
        return super().from_dict(config_dict, **kwargs)

    @property
    def num_denoiser_layers(self) -> int:
        return self.denoiser_layers if self.denoiser_layers is not None else max(1, self.num_hidden_layers // 2)

    @property
    def fusion_width(self) -> int:
        """Phi's MLP width: ``fusion_size``, else 4d (published) or d (residual)."""
        if self.fusion_size is not None:
            return self.fusion_size
        return (4 if self.fusion_variant == "published" else 1) * self.hidden_size

    def check_sizes(self) -> None:
        problems = []
        if self.fusion_variant not in FUSION_VARIANTS:
            problems.append(f"fusion_variant={self.fusion_variant!r} must be one of {FUSION_VARIANTS}")
        if self.fusion_scale not in FUSION_SCALES:
            problems.append(f"fusion_scale={self.fusion_scale!r} must be one of {FUSION_SCALES}")
        if self.anchor_bottleneck not in BOTTLENECKS:
            problems.append(f"anchor_bottleneck={self.anchor_bottleneck!r} must be one of {BOTTLENECKS}")
        if self.shared_layers < 0:
            problems.append(f"shared_layers={self.shared_layers} must be >= 0")
        if self.num_hidden_layers < 1:
            problems.append(f"num_hidden_layers (the anchor network's depth) = {self.num_hidden_layers} must be >= 1")
        if self.num_denoiser_layers < 1:
            problems.append(f"denoiser_layers={self.denoiser_layers} must be >= 1")
        if problems:
            raise ValueError("TADMConfig: " + "; ".join(problems))

    def layer_calls(self, steps: int, refresh_every: int) -> int:
        """The cost formula: transformer-layer calls to sample ``steps`` model calls with the anchor
        refreshed every ``refresh_every`` calls: ``T (L_S + L_D) + ceil(T / K) L_A``."""
        return steps * (self.shared_layers + self.num_denoiser_layers) + -(-steps // refresh_every) * self.num_hidden_layers


class Fusion(nn.Module):
    """Phi(c, h) = N(h + s(h) * sigmoid(gate(u)) * delta(u)), u = [LN c; LN h], delta a two-layer GELU
    MLP (2d -> ``fusion_size`` -> d), with s(h) = 1 (``scale="absolute"``, the default) or the RMS of h per
    position (``"relative"``), and N the output LayerNorm (``output_norm=True``) or nothing.

    Initialised (by :meth:`TADM._init_weights` / :meth:`reset_to_identity`) with delta's output layer
    at zero and the gate bias at ``gate_bias``: until it is trained Phi returns N(h), i.e. h unchanged
    without the output norm."""

    def __init__(self, hidden_size: int, fusion_size: int, gate_bias: float = -3.0, eps: float = 1e-5,
                 scale: str = "absolute", output_norm: bool = False):
        super().__init__()
        self.gate_bias, self.relative = gate_bias, scale == "relative"
        self.norm_c = nn.LayerNorm(hidden_size, eps=eps)
        self.norm_h = nn.LayerNorm(hidden_size, eps=eps)
        self.delta_in = nn.Linear(2 * hidden_size, fusion_size)
        self.delta_out = nn.Linear(fusion_size, hidden_size)
        self.gate = nn.Linear(2 * hidden_size, hidden_size)
        self.norm_out = nn.LayerNorm(hidden_size, eps=eps) if output_norm else None
        # Read by TADM._init_weights (transformers initialises each Linear itself, then flags it).
        self.delta_out._tadm_zero_init = True
        self.gate._tadm_bias_init = gate_bias

    def reset_to_identity(self) -> None:
        """No correction again: Phi(c, h) == N(h) (delta's output layer zero, gate bias back to ``gate_bias``)."""
        with torch.no_grad():
            self.delta_out.weight.zero_()
            self.delta_out.bias.zero_()
            self.gate.bias.fill_(self.gate_bias)

    def forward(self, c: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        u = torch.cat([self.norm_c(c), self.norm_h(h.to(c.dtype))], dim=-1)
        correction = torch.sigmoid(self.gate(u)) * self.delta_out(F.gelu(self.delta_in(u)))
        if self.relative:  # a fraction of h, so its size does not depend on the anchor bottleneck's scale
            correction = correction * h.float().pow(2).mean(-1, keepdim=True).sqrt().to(correction.dtype)
        out = h + correction
        return self.norm_out(out) if self.norm_out is not None else out


@dataclass
class TADMAnchor:
    """What the anchor cache holds: ``hidden`` (B, L, d) = h, the anchor network's output fed to Phi;
    ``logits`` (B, L, V) the anchor head's raw logits (``"logits"`` bottleneck, else None); and S's
    output ``shared`` for ``input_ids`` (a copy of the tokens it was computed from), so the step
    that refreshes the anchor does not run S twice."""

    hidden: torch.Tensor
    logits: torch.Tensor | None
    shared: torch.Tensor
    input_ids: torch.Tensor


def _encoder(c: TADMConfig, layers: int, final_norm: bool) -> Encoder:
    enc = Encoder(c.hidden_size, layers, c.num_attention_heads, c.intermediate_size, c.dropout, c.rope_theta,
                  c.layer_norm_eps)
    if not final_norm:
        enc.norm = nn.Identity()  # a stage in the middle of the residual stream
    return enc


class TADM(DiffusionPreTrainedModel):
    config_class = TADMConfig

    def __init__(self, config: TADMConfig):
        super().__init__(config)
        config.check_ids()
        config.check_sizes()
        c = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.shared = _encoder(c, c.shared_layers, final_norm=False)
        logits_bottleneck = c.anchor_bottleneck == "logits"
        self.anchor = _encoder(c, c.num_hidden_layers, final_norm=logits_bottleneck)
        if logits_bottleneck:
            self.anchor_head = nn.Linear(c.hidden_size, c.vocab_size)
            self.anchor_proj = nn.Linear(c.vocab_size, c.hidden_size)
        self.fusion = Fusion(c.hidden_size, c.fusion_width, c.fusion_gate_bias, c.layer_norm_eps, c.fusion_scale,
                             output_norm=c.fusion_variant == "published")
        self.denoiser = _encoder(c, c.num_denoiser_layers, final_norm=True)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size)
        self.post_init()
        self._init_token_shift()

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        # Phi starts as the identity. transformers' init functions skip tensors loaded from a checkpoint.
        if getattr(module, "_tadm_zero_init", False):
            init.zeros_(module.weight)
            init.zeros_(module.bias)
        elif getattr(module, "_tadm_bias_init", None) is not None:
            init.constant_(module.bias, module._tadm_bias_init)

    # ------------------------------------------------------------------ stages
    def stage_blocks(self) -> dict[str, list[Block]]:
        """The transformer blocks of each stage (for counting layer calls)."""
        return {"shared": list(self.shared.layers), "anchor": list(self.anchor.layers), "denoiser": list(self.denoiser.layers)}

    def shared_forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                       position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """S: (B, L) tokens -> (B, L, d) features c (the embedding alone when ``shared_layers == 0``)."""
        self._check_inputs(input_ids)
        x = self.embed(input_ids, attention_mask)
        return self.shared(x, attention_mask, position_ids) if len(self.shared.layers) else x

    def anchor_forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                       position_ids: torch.Tensor | None = None) -> TADMAnchor:
        """S then A on ``input_ids``: the part a sampler caches (see :class:`TADMAnchor`)."""
        c = self.shared_forward(input_ids, attention_mask, position_ids)
        a = self.anchor(c, attention_mask, position_ids)
        logits = None
        if self.config.anchor_bottleneck == "logits":
            logits = self.ar_aligned(self.anchor_head(a))  # an ADLM's (shifted) anchor head
            a = self.anchor_proj(logits)
        return TADMAnchor(hidden=a, logits=logits, shared=c, input_ids=input_ids.detach().clone())

    def denoise(self, anchor: TADMAnchor, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, *, fuse: bool = True) -> torch.Tensor:
        """Phi and D: a (possibly stale) anchor and the current tokens -> (B, L, V) SUBS log-probs.
        S runs on ``input_ids`` unless the anchor was computed from these very tokens.
        ``fuse=False`` skips Phi (``D(h)``): for a TADM built from ADLM/MDLM this is the source model
        (with the published variant's output norm, an untrained Phi gives ``D(LN_out(h))`` instead)."""
        self._check_inputs(input_ids)
        h = anchor.hidden
        if fuse:
            same = anchor.input_ids.shape == input_ids.shape and torch.equal(anchor.input_ids, input_ids)
            c = anchor.shared if same else self.shared_forward(input_ids, attention_mask, position_ids)
            h = self.fusion(c, h)
        out = self.denoiser(h.to(self.lm_head.weight.dtype), attention_mask, position_ids)
        raw = self.lm_head(out)
        if self.config.anchor_bottleneck == "hidden":  # from an MDLM: the LM head is the one its AR init filled
            raw = self.ar_aligned(raw)
        return subs_log_probs(raw, input_ids, self.mask_token_id)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, return_dict: bool | None = None, *,
                anchor_input_ids: torch.Tensor | None = None) -> DiffusionLMOutput:
        """``logits``: SUBS log-probs for ``input_ids``; ``anchor_logits``: the anchor head's raw logits
        (``"logits"`` bottleneck). With ``anchor_input_ids`` (same shape; T-ANELBO's stale, noisier
        tokens) the anchor is computed from those and fused with S(``input_ids``)."""
        if anchor_input_ids is not None and anchor_input_ids.shape != input_ids.shape:
            raise ValueError(f"anchor_input_ids {tuple(anchor_input_ids.shape)} must have the shape of input_ids "
                             f"{tuple(input_ids.shape)}")
        anchor = self.anchor_forward(input_ids if anchor_input_ids is None else anchor_input_ids, attention_mask, position_ids)
        logits = self.denoise(anchor, input_ids, attention_mask, position_ids)
        out = DiffusionLMOutput(logits=logits, anchor_logits=anchor.logits)
        return out if return_dict is not False else out.to_tuple()

    # ------------------------------------------------------------------ post-training
    def freeze_backbone(self) -> list[str]:
        """Only Phi stays trainable; returns the names of the trainable parameters."""
        for name, p in self.named_parameters():
            p.requires_grad_(name.startswith("fusion."))
        return [n for n, p in self.named_parameters() if p.requires_grad]

    def backbone_state_dict(self) -> dict[str, torch.Tensor]:
        """Copies of every non-fusion weight (what post-training must leave untouched)."""
        return {k: v.detach().clone() for k, v in self.state_dict().items() if not k.startswith("fusion.")}

    @classmethod
    def from_diffusion_model(cls, base: DiffusionPreTrainedModel, *, shared_layers: int = 0,
                             anchor_layers: int | None = None, fusion_size: int | None = None,
                             fusion_gate_bias: float = -3.0, fusion_scale: str = "absolute",
                             freeze: bool = True) -> "TADM":
        """A TADM with ``base``'s weights (copied) for post-training; ``freeze`` leaves only Phi trainable.

        * ADLM: S = the first ``shared_layers`` blocks of its anchor network, A = the rest (with the
          anchor head and the projection of its logits), D = its denoiser.
        * MDLM: S = the first ``shared_layers`` blocks, A = the next ``anchor_layers`` (default: half
          of the rest, rounded up), D = the remaining blocks and the final norm; h = hidden states.

        Phi is the ``"residual"`` variant (no output LayerNorm), so the untrained TADM equals ``base``.
        """
        bc = base.config
        common = {k: getattr(bc, k) for k in (
            "vocab_size", "hidden_size", "num_attention_heads", "intermediate_size", "max_position_embeddings", "dropout",
            "rope_theta", "layer_norm_eps", "initializer_range", "mask_token_id", "pad_token_id", "bos_token_id",
            "eos_token_id", "token_shift", "shift_logits")}
        if isinstance(bc, ADLMConfig):
            n_anchor = bc.num_hidden_layers
            if not 0 <= shared_layers < n_anchor:
                raise ConfigError(f"shared_layers={shared_layers}: an ADLM with a {n_anchor}-block anchor network can share "
                                  f"0..{n_anchor - 1} of its blocks (A keeps at least one)")
            if anchor_layers not in (None, n_anchor - shared_layers):
                raise ConfigError(f"anchor_layers={anchor_layers}: for an ADLM, A is its anchor network minus the shared "
                                  f"blocks ({n_anchor - shared_layers}); leave anchor_layers unset")
            cfg = TADMConfig(**common, shared_layers=shared_layers, num_hidden_layers=n_anchor - shared_layers,
                             denoiser_layers=bc.num_denoiser_layers, anchor_bottleneck="logits", fusion_size=fusion_size,
                             fusion_gate_bias=fusion_gate_bias, fusion_scale=fusion_scale, fusion_variant="residual")

            def rename(key: str) -> str:
                if key.startswith("anchor.layers."):
                    i, rest = key[len("anchor.layers."):].split(".", 1)
                    i = int(i)
                    return f"shared.layers.{i}.{rest}" if i < shared_layers else f"anchor.layers.{i - shared_layers}.{rest}"
                return key
        elif isinstance(bc, MDLMConfig) and type(bc) is MDLMConfig:
            n = bc.num_hidden_layers
            rest = n - shared_layers
            a = anchor_layers if anchor_layers is not None else (rest + 1) // 2
            if shared_layers < 0 or a < 1 or rest - a < 1:
                raise ConfigError(f"an MDLM with {n} blocks cannot split into shared_layers={shared_layers}, anchor_layers={a} "
                                  "and a denoiser of at least one block; lower shared_layers/anchor_layers")
            cfg = TADMConfig(**common, shared_layers=shared_layers, num_hidden_layers=a, denoiser_layers=rest - a,
                             anchor_bottleneck="hidden", fusion_size=fusion_size, fusion_gate_bias=fusion_gate_bias,
                             fusion_scale=fusion_scale, fusion_variant="residual")

            def rename(key: str) -> str:
                if key.startswith("encoder.layers."):
                    i, tail = key[len("encoder.layers."):].split(".", 1)
                    i = int(i)
                    if i < shared_layers:
                        return f"shared.layers.{i}.{tail}"
                    if i < shared_layers + a:
                        return f"anchor.layers.{i - shared_layers}.{tail}"
                    return f"denoiser.layers.{i - shared_layers - a}.{tail}"
                if key.startswith("encoder.norm."):
                    return "denoiser." + key[len("encoder."):]
                return key
        else:
            raise ConfigError(f"from_diffusion_model needs an ADLM or MDLM, got {type(base).__name__}")
        model = cls(cfg).to(device=next(base.parameters()).device, dtype=next(base.parameters()).dtype)
        mapped = {rename(k): v.detach().clone() for k, v in base.state_dict().items()}
        result = model.load_state_dict(mapped, strict=False)
        missing = [k for k in result.missing_keys if not k.startswith("fusion.")]
        if missing or result.unexpected_keys:
            raise ConfigError(f"weights of {type(base).__name__} do not map onto TADM: missing {missing}, "
                              f"unexpected {list(result.unexpected_keys)}")
        model.train(base.training)
        if freeze:
            model.freeze_backbone()
        logger.info("TADM from %s: L_S=%d L_A=%d L_D=%d, fusion %d parameters", type(base).__name__, cfg.shared_layers,
                    cfg.num_hidden_layers, cfg.num_denoiser_layers, sum(p.numel() for p in model.fusion.parameters()))
        return model


__all__ = ["TADM", "TADMConfig", "TADMAnchor", "Fusion", "BOTTLENECKS", "FUSION_SCALES", "FUSION_VARIANTS"]
