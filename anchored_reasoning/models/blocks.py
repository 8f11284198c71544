"""Building blocks shared by the diffusion models (MDLM, ADLM, and later TADM).

* :class:`Encoder`: a stack of pre-LayerNorm bidirectional transformer blocks with rotary position
  embeddings (no causal mask; an optional key-padding mask), ending in a LayerNorm.
* :func:`subs_log_probs`: MDLM's SUBS parameterisation turning raw logits into log-probabilities
  where the mask token has probability 0 and positions that are not masked in the input copy their
  token with probability 1.
* :func:`check_length` / :class:`SequenceLengthError`: the clear error for inputs that are too long.

Rotary tables are computed in ``forward`` (no buffers), so checkpoints hold only weights and load
the same way under ``from_pretrained``'s meta-device initialisation.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

try:  # a checkpoint's copy of this file (trust_remote_code, see models/__init__.py) runs without the library
    from anchored_reasoning.errors import AnchoredReasoningError
except ImportError:  # pragma: no cover - only in such a copy
    class AnchoredReasoningError(Exception):
        """Stands in for the library's base error where the library is not installed."""

#: The log-probability SUBS gives to impossible tokens. Finite (MDLM uses the same value) so that
#: ``0 * NEG_INF`` stays finite in gradients, yet ``exp(NEG_INF) == 0`` exactly in float32/bfloat16.
NEG_INF = -1.0e6


class SequenceLengthError(AnchoredReasoningError, ValueError):
    """An input sequence is longer than the model's ``max_position_embeddings``."""


def check_length(length: int, max_length: int, where: str) -> None:
    """Raise :class:`SequenceLengthError` when ``length > max_length`` (never truncate silently)."""
    if length > max_length:
        raise SequenceLengthError(
            f"{where}: sequence length {length} exceeds the model's max_position_embeddings={max_length}. "
            "Truncate or split the input (e.g. tokenizer(..., truncation=True, max_length=...)), "
            "or use a model configured with a longer max_position_embeddings."
        )


def default_position_ids(attention_mask: torch.Tensor | None, batch: int, length: int, device) -> torch.Tensor:
    """Positions 0..L-1, or, with a (left-)padding mask, positions counted over real tokens only,
    so a left-padded row gets the same rotary phases as the unpadded row."""
    if attention_mask is None:
        return torch.arange(length, device=device).unsqueeze(0).expand(batch, length)
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def rotary_tables(position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin tables of shape (B, 1, L, head_dim) for the given integer positions."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float32) / head_dim))
    angles = position_ids.float().unsqueeze(-1) * inv_freq  # (B, L, head_dim/2)
    emb = torch.cat([angles, angles], dim=-1).unsqueeze(1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _rotate_half(x) * sin


class Block(GradientCheckpointingLayer):
    """Pre-LayerNorm transformer block: bidirectional multi-head attention with rotary q/k, then a GELU MLP.
    (``model.gradient_checkpointing_enable()`` recomputes it in the backward pass.)"""

    def __init__(self, hidden_size: int, num_heads: int, intermediate_size: int, dropout: float = 0.0, eps: float = 1e-5):
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size={hidden_size} must be divisible by num_attention_heads={num_heads}")
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.attn_norm = nn.LayerNorm(hidden_size, eps=eps)
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size, bias=False)
        self.attn_out = nn.Linear(hidden_size, hidden_size, bias=False)
        self.mlp_norm = nn.LayerNorm(hidden_size, eps=eps)
        self.mlp_in = nn.Linear(hidden_size, intermediate_size)
        self.mlp_out = nn.Linear(intermediate_size, hidden_size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn_bias: torch.Tensor | None) -> torch.Tensor:
        b, l, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, l, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        drop = self.dropout.p if self.training else 0.0
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, dropout_p=drop)
        x = x + self.dropout(self.attn_out(a.transpose(1, 2).reshape(b, l, d)))
        return x + self.dropout(self.mlp_out(F.gelu(self.mlp_in(self.mlp_norm(x)))))


class Encoder(nn.Module):
    """``num_layers`` bidirectional blocks + final LayerNorm, mapping (B, L, d) hidden states to (B, L, d).

    ``attention_mask`` (B, L) with 1 for real tokens and 0 for padding: padded positions are never
    attended to as keys (their own outputs are computed but meaningless; losses must ignore them).
    """

    def __init__(self, hidden_size: int, num_layers: int, num_heads: int, intermediate_size: int,
                 dropout: float = 0.0, rope_theta: float = 10000.0, eps: float = 1e-5):
        super().__init__()
        self.head_dim = hidden_size // num_heads
        self.rope_theta = rope_theta
        self.layers = nn.ModuleList(Block(hidden_size, num_heads, intermediate_size, dropout, eps) for _ in range(num_layers))
        self.norm = nn.LayerNorm(hidden_size, eps=eps)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        b, l, _ = x.shape
        if position_ids is None:
            position_ids = default_position_ids(attention_mask, b, l, x.device)
        cos, sin = rotary_tables(position_ids, self.head_dim, self.rope_theta, x.dtype)
        attn_bias = None
        if attention_mask is not None:
            keep = attention_mask.bool()
            # A row with no real token at all would give NaN attention; let it attend everywhere instead.
            keep = keep | ~keep.any(dim=-1, keepdim=True)
            attn_bias = keep[:, None, None, :]
        for layer in self.layers:
            x = layer(x, cos, sin, attn_bias)
        return self.norm(x)


def shift_logits_right(logits: torch.Tensor) -> torch.Tensor:
    """Position ``t`` takes the logits computed at ``t - 1`` (position 0 keeps its own): the output
    alignment of an AR model, which DiffuGPT and Dream keep when they turn one into a diffusion model,
    so that the copied weights predict a masked token where they predicted the next token."""
    return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


def subs_log_probs(logits: torch.Tensor, input_ids: torch.Tensor, mask_token_id: int) -> torch.Tensor:
    """SUBS parameterisation (MDLM): returns float32 log-probabilities of shape (B, L, V) where

    * the mask token gets log-probability ``NEG_INF`` (probability exactly 0) everywhere;
    * at positions whose input token is not the mask, the distribution is a point mass on the input
      token (log-prob 0 there, ``NEG_INF`` elsewhere): unmasked tokens are carried over.
    """
    is_mask_token = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
    is_mask_token[mask_token_id] = True
    log_probs = logits.float().masked_fill(is_mask_token, NEG_INF).log_softmax(dim=-1)
    unmasked = (input_ids != mask_token_id).unsqueeze(-1)
    # carry-over without a second (B, L, V) buffer: blank unmasked rows, then put 0 at their token
    carried = torch.where(unmasked, 0.0, NEG_INF).to(log_probs.dtype)
    return log_probs.masked_fill(unmasked, NEG_INF).scatter(-1, input_ids.unsqueeze(-1), carried)
