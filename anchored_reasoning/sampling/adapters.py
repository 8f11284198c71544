"""Thin adapters so external masked-diffusion checkpoints (LLaDA, Dream, or any bidirectional
masked LM) plug into the same samplers and losses as our MDLM/ADLM.

What the rest of the library needs from a diffusion model is small: ``mask_token_id``, optionally a
maximum length, and ``model(input_ids=z, attention_mask=...)`` returning ``.logits`` (B, L, V)
predicting the clean token at every position. :class:`MaskedDiffusionAdapter` provides exactly that
around any ``nn.Module`` that returns logits:

* LLaDA: ``AutoModel.from_pretrained("GSAI-ML/LLaDA-8B-Instruct", trust_remote_code=True)``, mask id
  126336, no attention mask needed (``attention_mask_format="none"``).
* Dream: mask id from its config/tokenizer; its logits at position i predict token i+1, so
  ``shift_logits=True`` moves them back one place; it takes a 4-D boolean attention mask.

:func:`load_masked_diffusion_model` does the wiring from a path or Hub id; our own checkpoints
(``model_type`` "mdlm"/"adlm") load directly, without an adapter.
"""
from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from ..models import DiffusionLMOutput

logger = logging.getLogger(__name__)

#: Mask token ids of known external checkpoints, used when neither tokenizer nor config names one.
KNOWN_MASK_IDS = {"llada": 126336}
ATTENTION_MASK_FORMATS = ("2d", "4d", "none")


class MaskedDiffusionAdapter(nn.Module):
    """Wrap ``model`` (returns ``.logits`` or a tuple whose first item is logits) as a diffusion LM.

    ``shift_logits``: the model predicts the *next* token at each position (Dream); logits are
    shifted right by one so position i predicts token i. ``attention_mask_format``: pass the
    (B, L) padding mask as is ("2d"), as a bidirectional (B, 1, L, L) boolean mask ("4d"), or not
    at all ("none"; then padded batches are not supported and a padded mask raises)."""

    def __init__(self, model: nn.Module, mask_token_id: int, *, max_length: int | None = None,
                 shift_logits: bool = False, attention_mask_format: str = "2d"):
        super().__init__()
        if attention_mask_format not in ATTENTION_MASK_FORMATS:
            raise ConfigError(f"attention_mask_format={attention_mask_format!r}; choose one of {ATTENTION_MASK_FORMATS}")
        self.model = model
        self.mask_token_id = int(mask_token_id)
        cfg = getattr(model, "config", None)
        self.max_length = max_length if max_length is not None else (
            getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "max_sequence_length", None))
        self.shift_logits = shift_logits
        self.attention_mask_format = attention_mask_format

    @property
    def config(self) -> Any:
        return getattr(self.model, "config", None)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_: Any) -> DiffusionLMOutput:
        if self.max_length is not None and input_ids.shape[1] > self.max_length:
            raise ConfigError(f"input length {input_ids.shape[1]} exceeds the wrapped model's max length "
                              f"{self.max_length}; shorten the input")
        kwargs: dict[str, Any] = {}
        if attention_mask is not None:
            if self.attention_mask_format == "2d":
                kwargs["attention_mask"] = attention_mask
            elif self.attention_mask_format == "4d":
                m = attention_mask.bool()
                kwargs["attention_mask"] = (m[:, None, :, None] & m[:, None, None, :])
            elif not bool(attention_mask.all()):
                raise ConfigError("this adapter was built with attention_mask_format='none' but the batch is padded; "
                                  "generate one prompt at a time or use a format the model accepts")
        out = self.model(input_ids=input_ids, **kwargs)
        logits = out.logits if hasattr(out, "logits") else out[0]
        if self.shift_logits:
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        return DiffusionLMOutput(logits=logits)

    def save_pretrained(self, *args: Any, **kwargs: Any) -> Any:
        return self.model.save_pretrained(*args, **kwargs)


def _resolve_mask_id(path: str, config: Any, tokenizer: Any, explicit: int | None) -> int:
    if explicit is not None:
        return int(explicit)
    for source in (config, tokenizer):  # the config first: AutoTokenizer may invent a default tokenizer
        mid = getattr(source, "mask_token_id", None) if source is not None else None
        if mid is not None:
            return int(mid)
    known = KNOWN_MASK_IDS.get(str(getattr(config, "model_type", "")).lower())
    if known is not None:
        return known
    raise ConfigError(f"{path}: cannot tell the mask token id (no tokenizer.mask_token_id or config.mask_token_id); "
                      "pass mask_token_id=...")


def load_masked_diffusion_model(name_or_path: str, *, mask_token_id: int | None = None, trust_remote_code: bool = False,
                                dtype: Any = None, shift_logits: bool | None = None,
                                attention_mask_format: str | None = None, **kwargs: Any) -> nn.Module:
    """Load a diffusion LM for sampling/training: our MDLM/ADLM/TADM as themselves, anything else
    (LLaDA/Dream style; ``trust_remote_code`` for their custom code) wrapped in
    :class:`MaskedDiffusionAdapter`. Returns the model in eval mode."""
    from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, AutoTokenizer

    from ..models import DiffusionPreTrainedModel  # importing registers our models with the Auto classes

    config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    model_type = str(getattr(config, "model_type", "")).lower()
    load_kwargs = dict(trust_remote_code=trust_remote_code, **kwargs)
    if dtype is not None:
        load_kwargs["dtype"] = dtype
    native, todo = set(), [DiffusionPreTrainedModel]
    while todo:  # every model class of ours (MDLM, ADLM, TADM, ...) and so every model_type we register
        for sub in todo.pop().__subclasses__():
            native.add(getattr(sub.config_class, "model_type", None))
            todo.append(sub)
    if model_type in native:
        model = AutoModelForMaskedLM.from_pretrained(name_or_path, **load_kwargs)
        if mask_token_id is not None and mask_token_id != model.config.mask_token_id:
            raise ConfigError(f"{name_or_path}: mask_token_id={mask_token_id} differs from the checkpoint's "
                              f"{model.config.mask_token_id}")
        return model.eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:  # a checkpoint without a tokenizer can still name its mask id
        logger.info("no tokenizer at %s (%s); looking for the mask id in the config", name_or_path, exc)
        tokenizer = None
    mid = _resolve_mask_id(name_or_path, config, tokenizer, mask_token_id)
    try:
        model = AutoModelForMaskedLM.from_pretrained(name_or_path, **load_kwargs)
    except ValueError:  # LLaDA/Dream register their classes under AutoModel only
        model = AutoModel.from_pretrained(name_or_path, **load_kwargs)
    is_dream = model_type.startswith("dream")
    fmt = attention_mask_format or ("4d" if is_dream else "none" if model_type == "llada" else "2d")
    return MaskedDiffusionAdapter(model, mid, shift_logits=is_dream if shift_logits is None else shift_logits,
                                  attention_mask_format=fmt).eval()


__all__ = ["MaskedDiffusionAdapter", "load_masked_diffusion_model", "KNOWN_MASK_IDS"]
