"""TADM:Post-train's fusion Phi for a frozen DiffusionGemma, in two kinds (``AnchorFusionConfig.fusion_kind``):

``attention`` (:class:`AnchorFusion`, the library's first form)::

    h~ = h + o_proj(Attn(q = W_q n(c); k, v = W_k, W_v [n(c); n(h)]))      rotary positions, o_proj = 0 at init

``paired`` (:class:`PairedAnchorFusion`, the paper's "paired attention", arXiv 2609.37924 appendix C.1,
equations 48-56): besides the cached anchor H0 it reads the shallow state C0 cached at the same refresh
step, runs one shared mixer phi on the current and on the cached shallow state and adds the gated
difference::

    s_C, s_H = rms(C0), rms(H0) per token;  Z, Z0, U = (C / s_C) W_C, (C0 / s_C) W_C, (H0 / s_H) W_H   (rank r)
    phi(Z, U) = R + W_2 SiLU(W_1 R),  R = Z + W_O MHA(Q, K, V of [Z, U])       (bidirectional, no positions)
    M = phi(Z, U) - phi(Z0, U);  g = sigmoid(W_g2 SiLU(W_g1 [U; Z0; Z - Z0; M]) + b_g)   (one gate per token)
    H~ = H0 + g * s_H * (M W_up)                                      W_up = 0 and b_g = -3 at init

``C == C0`` makes ``M`` exactly zero, so at a fresh anchor the paired fusion returns ``H0`` bit for bit even
after training (the two mixer runs are the same operations on equal inputs). Both kinds take
``(current, anchor, anchor_current)``; the attention kind ignores ``anchor_current``.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers import initialization as init

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.models.diffusion_gemma import LayerSplit

FUSION_KINDS = ("attention", "paired")


def check_fusion_kind(kind: Any, where: str = "fusion_kind") -> str:
    if kind not in FUSION_KINDS:
        raise ConfigError(f"{where}={kind!r} is no fusion kind; use one of {', '.join(FUSION_KINDS)} (attention: "
                          "the library's cross-attention fusion, paired: the paper's paired attention, appendix C.1)")
    return kind


class AnchorFusionConfig(PretrainedConfig):
    """Phi's kind and sizes, and the split and base checkpoint it was trained for.

    ``fusion_dim`` r is the attention width / rank (``num_heads`` heads of r / heads). Parameters: attention
    ``6 d r + 2 d``; paired ``3 d r + 15 r^2 + r + 1`` (:func:`paired_parameters`). ``base_model`` names the
    DiffusionGemma the fusion belongs to. A folder saved without ``fusion_kind`` is an ``attention`` one."""

    model_type = "diffusion_gemma_anchor_fusion"

    def __init__(self, hidden_size: int = 64, fusion_dim: int = 192, num_heads: int = 3, rms_norm_eps: float = 1e-6,
                 rope_theta: float = 10000.0, initializer_range: float = 0.02, shared_layers: int = 1,
                 anchor_layers: int = 1, denoiser_layers: int = 1, base_model: str | None = None,
                 fusion_kind: str = "attention", gate_bias: float = -3.0, **kwargs: Any):
        self.fusion_kind = check_fusion_kind(fusion_kind)
        self.hidden_size, self.fusion_dim, self.num_heads = int(hidden_size), int(fusion_dim), int(num_heads)
        self.rms_norm_eps, self.rope_theta, self.initializer_range = float(rms_norm_eps), float(rope_theta), float(initializer_range)
        self.shared_layers, self.anchor_layers, self.denoiser_layers = int(shared_layers), int(anchor_layers), int(denoiser_layers)
        self.base_model, self.gate_bias = base_model, float(gate_bias)
        super().__init__(**kwargs)

    @property
    def split(self) -> LayerSplit:
        return LayerSplit(self.shared_layers, self.anchor_layers, self.denoiser_layers)


def _rotate(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding over axis -2 (canvas positions 0..L-1) of ``x`` (B, H, L, d), d even."""
    d, length = x.shape[-1], x.shape[-2]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = torch.arange(length, device=x.device, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, length, _ = x.shape
    return x.view(b, length, heads, -1).transpose(1, 2)


def _merge(x: torch.Tensor) -> torch.Tensor:
    b, _, length, _ = x.shape
    return x.transpose(1, 2).reshape(b, length, -1)


class _Fusion(PreTrainedModel):
    config_class = AnchorFusionConfig
    base_model_prefix = "fusion"
    main_input_name = "current"
    zero_init: tuple[str, ...] = ()
    kind = ""

    @classmethod
    def for_model(cls, model: Any, split: LayerSplit, **kwargs: Any) -> "_Fusion":
        """:func:`make_fusion` of this class's kind."""
        return make_fusion(model, split, **{"fusion_kind": cls.kind, **kwargs})

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        if any(module is getattr(self, name, None) for name in self.zero_init):
            init.zeros_(module.weight)  # the output starts as the anchor state itself
        elif isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
        elif isinstance(module, nn.RMSNorm):
            init.ones_(module.weight)


class AnchorFusion(_Fusion):
    """``attention``: Phi(c, h) = h + o_proj(MultiHeadAttention(q = W_q n(c), k = W_k [n(c); n(h)],
    v = W_v [n(c); n(h)])), ``n`` an RMSNorm per input, attention over the canvas positions with rotary
    positions; ``o_proj`` starts at zero. Inputs are cast to Phi's dtype, the result back to ``h``'s."""

    zero_init, kind = ("o_proj",), "attention"

    def __init__(self, config: AnchorFusionConfig):
        super().__init__(config)
        d, r, heads = config.hidden_size, config.fusion_dim, config.num_heads
        if heads < 1 or r % heads or (r // heads) % 2:
            raise ConfigError(f"fusion_dim={r} must split into num_heads={heads} heads of an even width")
        self.norm_current = nn.RMSNorm(d, eps=config.rms_norm_eps)
        self.norm_anchor = nn.RMSNorm(d, eps=config.rms_norm_eps)
        self.q_proj = nn.Linear(d, r, bias=False)
        self.k_proj = nn.Linear(2 * d, r, bias=False)
        self.v_proj = nn.Linear(2 * d, r, bias=False)
        self.o_proj = nn.Linear(r, d, bias=False)
        self.post_init()

    def forward(self, current: torch.Tensor, anchor: torch.Tensor, anchor_current: torch.Tensor | None = None) -> torch.Tensor:
        dtype, heads, theta = self.q_proj.weight.dtype, self.config.num_heads, self.config.rope_theta
        c, h = self.norm_current(current.to(dtype)), self.norm_anchor(anchor.to(dtype))
        both = torch.cat([c, h], dim=-1)
        q = _rotate(_heads(self.q_proj(c), heads), theta)
        k = _rotate(_heads(self.k_proj(both), heads), theta)
        att = _merge(F.scaled_dot_product_attention(q, k, _heads(self.v_proj(both), heads)))
        return anchor + self.o_proj(att).to(anchor.dtype)


class PairedAnchorFusion(_Fusion):
    """``paired``: the paper's paired attention (the module doc, equations 48-56). ``forward(current,
    anchor, anchor_current)``: C, H0 and C0 (S's output at the refresh step that computed H0)."""

    zero_init, kind = ("up_proj",), "paired"

    def __init__(self, config: AnchorFusionConfig):
        super().__init__(config)
        d, r, heads = config.hidden_size, config.fusion_dim, config.num_heads
        if heads < 1 or r % heads:
            raise ConfigError(f"fusion_dim={r} must split into num_heads={heads} heads of equal width")
        self.current_proj = nn.Linear(d, r, bias=False)  # W_C, shared by C and C0
        self.anchor_proj = nn.Linear(d, r, bias=False)  # W_H
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(2 * r, r, bias=False) for _ in range(3))
        self.o_proj = nn.Linear(r, r, bias=False)
        self.ffn_in = nn.Linear(r, 2 * r, bias=False)
        self.ffn_out = nn.Linear(2 * r, r, bias=False)
        self.gate_in = nn.Linear(4 * r, r, bias=False)
        self.gate_out = nn.Linear(r, 1, bias=False)
        self.gate_bias = nn.Parameter(torch.full((1,), config.gate_bias))
        self.up_proj = nn.Linear(r, d, bias=False)
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if module is self:
            init.constant_(self.gate_bias, self.config.gate_bias)

    def _scale(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)

    def mixer(self, z: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """phi(Z, U): bidirectional multi-head self-attention over ``[Z, U]`` with a residual on Z, then a SiLU FFN."""
        heads, j = self.config.num_heads, torch.cat([z, u], dim=-1)
        att = F.scaled_dot_product_attention(*(_heads(p(j), heads) for p in (self.q_proj, self.k_proj, self.v_proj)))
        r = z + self.o_proj(_merge(att))
        return r + self.ffn_out(F.silu(self.ffn_in(r)))

    def forward(self, current: torch.Tensor, anchor: torch.Tensor, anchor_current: torch.Tensor | None = None) -> torch.Tensor:
        if anchor_current is None:
            raise ConfigError("the paired fusion needs anchor_current (C0: the shared layers' output at the step that "
                              "computed the anchor); TADMDiffusionGemma and the tadm_gemma trainer pass it")
        dtype = self.up_proj.weight.dtype
        c, c0, h0 = current.to(dtype), anchor_current.to(dtype), anchor.to(dtype)
        s_c, s_h = self._scale(c0), self._scale(h0)
        z, z0, u = self.current_proj(c / s_c), self.current_proj(c0 / s_c), self.anchor_proj(h0 / s_h)
        m = self.mixer(z, u) - self.mixer(z0, u)  # exactly zero where C == C0: the same operations on equal inputs
        gate = torch.sigmoid(self.gate_out(F.silu(self.gate_in(torch.cat([u, z0, z - z0, m], dim=-1)))) + self.gate_bias)
        return anchor + (gate * s_h * self.up_proj(m)).to(anchor.dtype)


FUSIONS = {"attention": AnchorFusion, "paired": PairedAnchorFusion}


def make_fusion(model: Any, split: LayerSplit, *, fusion_kind: str = "attention", fusion_dim: int = 192,
                num_heads: int = 3, base_model: str | None = None, seed: int | None = None) -> _Fusion:
    """A new fusion of ``fusion_kind`` (output == the anchor state until trained) sized for a DiffusionGemma
    ``model`` and ``split``, in float32."""
    check_fusion_kind(fusion_kind)
    text = model.config.get_text_config()
    config = AnchorFusionConfig(hidden_size=text.hidden_size, fusion_dim=fusion_dim, num_heads=num_heads,
                                rms_norm_eps=text.rms_norm_eps, shared_layers=split.shared, anchor_layers=split.anchor,
                                denoiser_layers=split.denoiser, base_model=base_model, fusion_kind=fusion_kind)
    if seed is not None:
        torch.manual_seed(seed)
    return FUSIONS[fusion_kind](config)


def fusion_parameters(fusion: nn.Module) -> int:
    """Phi's parameter count (all of them train)."""
    return sum(p.numel() for p in fusion.parameters())


def paired_parameters(hidden_size: int, rank: int) -> int:
    """The paired fusion's size: W_C, W_H, W_up (3 d r); W_Q, W_K, W_V (3 * 2r * r), W_O (r^2), the FFN
    (2 * 2r^2), the gate's first layer (4r * r): 15 r^2; the gate's output row and bias (r + 1)."""
    return 3 * hidden_size * rank + 15 * rank * rank + rank + 1


def load_fusion(path: str, *, device: str | None = None) -> _Fusion:
    """A trained fusion (either kind) from a folder written by the ``tadm_gemma`` trainer."""
    from anchored_reasoning.models.diffusion_gemma import config_model_type

    kind = config_model_type(path)
    if kind != AnchorFusionConfig.model_type:
        raise ConfigError(f"{path!r} is a {kind!r} checkpoint, not a TADM fusion ({AnchorFusionConfig.model_type!r}, "
                          "written by `anchored-reasoning train` with trainer: tadm_gemma)")
    config = AnchorFusionConfig.from_pretrained(str(path))  # a bad fusion_kind fails here, before the weights
    fusion = FUSIONS[config.fusion_kind].from_pretrained(str(path), config=config).eval()
    return fusion.to(device) if device is not None else fusion


__all__ = ["FUSIONS", "FUSION_KINDS", "AnchorFusion", "AnchorFusionConfig", "PairedAnchorFusion", "check_fusion_kind",
           "fusion_parameters", "load_fusion", "make_fusion", "paired_parameters"]
