"""MDLM: a masked (absorbing-state) diffusion language model (Sahoo et al., arXiv 2406.07524).

A bidirectional transformer with rotary embeddings reads the partly masked sequence ``z_t`` and
returns, per position, log-probabilities over the clean token under the SUBS parameterisation
(mask token impossible, unmasked positions copied). There is no time conditioning: the model
infers the noise level from the number of masks it sees.

>>> from anchored_reasoning.models import MDLM, MDLMConfig
>>> model = MDLM(MDLMConfig.from_preset("tiny", vocab_size=512, mask_token_id=4))
>>> out = model(input_ids)          # out.logits: (B, L, V) float32 SUBS log-probabilities
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

from .blocks import Encoder, check_length, shift_logits_right, subs_log_probs

#: Named sizes. "tiny" is for tests (runs in milliseconds on CPU); "paper" is MDLM/ADLM's DiT size
#: (12 blocks, width 768, 12 heads; ADLM's denoiser has half the depth).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
                 max_position_embeddings=256, dropout=0.0),
    "small": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512,
                  max_position_embeddings=512, dropout=0.0),
    "paper": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                  max_position_embeddings=1024, dropout=0.1),
}


class DiffusionConfigMixin:
    """``from_preset`` and the checks shared by the diffusion model configs."""

    @classmethod
    def from_preset(cls, name: str, **overrides):
        """Build a config from a named size in :data:`PRESETS`; ``overrides`` win (``vocab_size``,
        ``mask_token_id`` and the special token ids usually come from the tokenizer)."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)} or pass the sizes directly")
        return cls(**{**PRESETS[name], **overrides})

    def check_ids(self) -> None:
        if self.mask_token_id is None or not 0 <= int(self.mask_token_id) < self.vocab_size:
            raise ValueError(
                f"{type(self).__name__}.mask_token_id={self.mask_token_id!r} must be a token id in [0, vocab_size="
                f"{self.vocab_size}); pass mask_token_id=tokenizer.mask_token_id (add a '<mask>' token first if needed)")


class MDLMConfig(DiffusionConfigMixin, PreTrainedConfig):
    model_type: ClassVar[str] = "mdlm"

    vocab_size: int = 512
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 256
    max_position_embeddings: int = 256
    dropout: float = 0.0
    rope_theta: float = 10000.0
    layer_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    mask_token_id: int | None = None
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    tie_word_embeddings: bool = False
    #: previous tokens whose embeddings each input embedding adds (0 = none; see :meth:`embed`)
    token_shift: int = 0
    #: the AR-initialised head predicts position t from position t-1's state (DiffuGPT/Dream's shift;
    #: MDLM: the LM head, ADLM: the anchor head; see ``blocks.shift_logits_right``)
    shift_logits: bool = False


@dataclass
class DiffusionLMOutput(ModelOutput):
    """``logits``: (B, L, V) float32 SUBS log-probabilities (already normalised: ``logits.exp()``
    sums to 1 over V); ``anchor_logits``: ADLM only, the anchor network's raw logits (B, L, V)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    anchor_logits: torch.Tensor | None = None


class DiffusionPreTrainedModel(PreTrainedModel):
    """Shared plumbing: input checks, embeddings accessors."""

    main_input_name = "input_ids"
    base_model_prefix = "diffusion"
    supports_gradient_checkpointing = True

    @property
    def mask_token_id(self) -> int:
        return int(self.config.mask_token_id)

    def _init_token_shift(self) -> None:
        """Build the token shift's projections (``config.token_shift`` of them, zero: the model starts
        as it would without). Call after ``post_init`` so the zeros are not re-initialised; weights
        loaded by ``from_pretrained`` replace them."""
        n = int(self.config.token_shift)
        if n < 0:
            raise ValueError(f"token_shift={n} must be >= 0")
        d = self.config.hidden_size
        self.shift_proj = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(n)) if n else None
        for lin in self.shift_proj or ():
            nn.init.zeros_(lin.weight)

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Token embeddings, plus, with ``config.token_shift = n``, learned projections of the ``n``
        previous positions' embeddings (``anchored_reasoning.models.shift``: the lookup "Bob is a
        wumpus." needs the subject at the object, three tokens on; a small model learns that in a few
        hundred steps with the shift and not in thousands without). Padding contributes nothing. A
        masked position carries the mask's embedding forward like any token."""
        e = self.embed_tokens(input_ids)
        if self.shift_proj is None:
            return e
        from .shift import shift_sum

        src = e if attention_mask is None else e * attention_mask.unsqueeze(-1).to(e.dtype)
        return shift_sum(e, src, self.shift_proj)

    def ar_aligned(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` of the head an AR init fills, moved one position on when ``config.shift_logits``
        (``blocks.shift_logits_right``); unchanged otherwise."""
        return shift_logits_right(logits) if self.config.shift_logits else logits

    def _check_inputs(self, input_ids: torch.Tensor) -> None:
        if input_ids.dim() != 2:
            raise ValueError(f"{type(self).__name__} expects input_ids of shape (batch, length), got {tuple(input_ids.shape)}")
        check_length(input_ids.shape[1], self.config.max_position_embeddings, f"{type(self).__name__}.forward")

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value


class MDLM(DiffusionPreTrainedModel):
    config_class = MDLMConfig

    def __init__(self, config: MDLMConfig):
        super().__init__(config)
        config.check_ids()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.encoder = Encoder(config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
                               config.intermediate_size, config.dropout, config.rope_theta, config.layer_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()
        self._init_token_shift()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, return_dict: bool | None = None) -> DiffusionLMOutput:
        """``input_ids``: (B, L) noisy tokens ``z_t`` (masked positions hold ``config.mask_token_id``).
        ``attention_mask``: optional (B, L) 1/0 padding mask (padding is never attended to).
        Raises :class:`~anchored_reasoning.models.blocks.SequenceLengthError` when L > max_position_embeddings."""
        self._check_inputs(input_ids)
        h = self.encoder(self.embed(input_ids, attention_mask), attention_mask, position_ids)
        out = DiffusionLMOutput(logits=subs_log_probs(self.ar_aligned(self.lm_head(h)), input_ids, self.mask_token_id))
        return out if return_dict is not False else out.to_tuple()
