"""ADLM: the Anchored Diffusion Language Model (Rout et al., arXiv 2505.18456).

Two networks trained jointly::

    z_t --embed--> anchor network (num_hidden_layers blocks) --anchor_head--> anchor_logits (B, L, V)
    anchor_logits --anchor_proj (learnable linear V -> d, no softmax)--> denoiser
                  (denoiser_layers blocks, default half the depth) --lm_head--> SUBS log-probs

The anchor network is trained (through ANELBO's gamma term) to predict important tokens; the
denoiser sees only the projected anchor logits. The forward pass factors into
:meth:`ADLM.anchor_forward` and :meth:`ADLM.denoise`, so a sampler can cache ``anchor_logits`` and
reuse them for several denoising steps (the TADM anchor cache).
"""
from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from .blocks import Encoder, subs_log_probs
from .mdlm import DiffusionConfigMixin, DiffusionLMOutput, DiffusionPreTrainedModel, MDLMConfig


class ADLMConfig(MDLMConfig):
    """MDLM's fields plus ``denoiser_layers`` (None = ``num_hidden_layers // 2``, at least 1).
    ``num_hidden_layers`` is the anchor network's depth."""

    model_type: ClassVar[str] = "adlm"

    denoiser_layers: int | None = None

    @property
    def num_denoiser_layers(self) -> int:
        return self.denoiser_layers if self.denoiser_layers is not None else max(1, self.num_hidden_layers // 2)


class ADLM(DiffusionPreTrainedModel):
    config_class = ADLMConfig

    def __init__(self, config: ADLMConfig):
        super().__init__(config)
        config.check_ids()
        c = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.anchor = Encoder(c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size,
                              c.dropout, c.rope_theta, c.layer_norm_eps)
        self.anchor_head = nn.Linear(c.hidden_size, c.vocab_size)
        self.anchor_proj = nn.Linear(c.vocab_size, c.hidden_size)
        self.denoiser = Encoder(c.hidden_size, c.num_denoiser_layers, c.num_attention_heads, c.intermediate_size,
                                c.dropout, c.rope_theta, c.layer_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size)
        self.post_init()
        self._init_token_shift()

    def anchor_forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                       position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The anchor network: (B, L) noisy tokens -> (B, L, V) raw anchor logits (no SUBS)."""
        self._check_inputs(input_ids)
        return self.ar_aligned(self.anchor_head(self.anchor(self.embed(input_ids, attention_mask), attention_mask, position_ids)))

    def denoise(self, anchor_logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The denoiser: anchor logits (possibly cached from an earlier step) and the current noisy
        tokens ``input_ids`` (used only for SUBS carry-over) -> (B, L, V) SUBS log-probabilities."""
        self._check_inputs(input_ids)
        h = self.denoiser(self.anchor_proj(anchor_logits.to(self.anchor_proj.weight.dtype)), attention_mask, position_ids)
        return subs_log_probs(self.lm_head(h), input_ids, self.mask_token_id)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, return_dict: bool | None = None) -> DiffusionLMOutput:
        """Returns ``logits`` (denoiser SUBS log-probs) and ``anchor_logits`` (raw), both (B, L, V)."""
        anchor_logits = self.anchor_forward(input_ids, attention_mask, position_ids)
        logits = self.denoise(anchor_logits, input_ids, attention_mask, position_ids)
        out = DiffusionLMOutput(logits=logits, anchor_logits=anchor_logits)
        return out if return_dict is not False else out.to_tuple()


__all__ = ["ADLM", "ADLMConfig", "DiffusionConfigMixin"]
