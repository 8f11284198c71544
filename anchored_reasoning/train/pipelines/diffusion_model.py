"""The tokenizer and the MDLM / ADLM of a diffusion recipe's ``model`` section.

:func:`build_tokenizer` trains a byte-level BPE on the run's text, or loads a named one, and adds
pad, EOS, mask and the trained-format special tokens; :func:`build_model` builds a model from a
preset (``arch`` + ``preset`` + ``config`` overrides, seeded) or loads a checkpoint (``name``) and
checks its mask id against the tokenizer, growing its vocabulary (:func:`resize_vocab`) for the
added tokens. Used by the ``diffusion`` and ``tadm`` trainers through
:mod:`anchored_reasoning.train.pipelines.diffusion`, which re-exports these names.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

from anchored_reasoning.errors import ConfigError

logger = logging.getLogger(__name__)

ARCHS = ("mdlm", "adlm")


def build_tokenizer(model_cfg: Mapping[str, Any], texts: Sequence[str], out_dir: Path, saved: Path | None = None):
    """A tokenizer with pad, EOS, mask and the trained-format special tokens. ``saved``: a resumed
    run's checkpoint, whose tokenizer replaces a trained one (the ids under the weights stay put)."""
    from transformers import AutoTokenizer

    from anchored_reasoning.methods.anchored import add_special_tokens

    spec = model_cfg.get("tokenizer")
    if saved is not None and spec in (None, "train"):
        tok = AutoTokenizer.from_pretrained(str(saved))
    elif spec in (None, "train"):
        if not texts:
            raise ConfigError("model.tokenizer: train needs training text")
        from anchored_reasoning.tokenization import train_tiny_tokenizer

        tok = train_tiny_tokenizer(out_dir, texts=texts, vocab_size=int(model_cfg.get("tokenizer_vocab_size", 1024)))
    else:
        from anchored_reasoning.models.zoo import resolve_model

        tok = AutoTokenizer.from_pretrained(resolve_model(str(spec)))
    if tok.eos_token is None:
        raise ConfigError(f"tokenizer {spec!r} has no EOS token; diffusion training appends EOS to every row")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if tok.mask_token is None:
        tok.add_special_tokens({"mask_token": "<mask>"})
    add_special_tokens(tok)
    tok.padding_side = "left"
    return tok


def resize_vocab(model, new_size: int) -> None:
    """Grow every vocabulary-sized layer of an MDLM/ADLM (embedding, output heads, ADLM's anchor
    head and projection) to ``new_size``. New output rows are initialised like the model's; new input
    columns (ADLM's projection of the anchor logits) start at zero, so the denoiser's input for the old
    vocabulary is unchanged."""
    import torch
    from torch import nn

    old = int(model.config.vocab_size)
    if new_size <= old:
        return
    std = float(getattr(model.config, "initializer_range", 0.02))

    def grow(param: torch.Tensor, dim: int, zero: bool = False) -> nn.Parameter:
        shape = list(param.shape)
        shape[dim] = new_size - old
        extra = torch.zeros(shape, dtype=param.dtype, device=param.device)
        if param.dim() > 1 and not zero:
            extra.normal_(0.0, std)
        return nn.Parameter(torch.cat([param.data, extra], dim=dim))

    for module in model.modules():
        if isinstance(module, nn.Embedding) and module.num_embeddings == old:
            module.weight = grow(module.weight, 0)
            module.num_embeddings = new_size
        elif isinstance(module, nn.Linear):
            if module.out_features == old:
                module.weight = grow(module.weight, 0)
                if module.bias is not None:
                    module.bias = grow(module.bias, 0)
                module.out_features = new_size
            if module.in_features == old:
                module.weight = grow(module.weight, 1, zero=True)
                module.in_features = new_size
    model.config.vocab_size = new_size


def build_model(model_cfg: Mapping[str, Any], tokenizer, seed: int):
    """An MDLM/ADLM from a preset (random init, seeded) or ``from_pretrained`` on ``name``."""
    import torch
    from transformers import AutoModelForMaskedLM

    import anchored_reasoning.models as models

    preset, name = model_cfg.get("preset"), model_cfg.get("name")
    if bool(preset) == bool(name):
        raise ConfigError("recipe 'model' needs exactly one of 'preset' (from scratch) or 'name' (a checkpoint to fine-tune)")
    ids = dict(vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id, pad_token_id=tokenizer.pad_token_id,
               bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    if preset:
        arch = str(model_cfg.get("arch", "mdlm")).lower()
        if arch not in ARCHS:
            raise ConfigError(f"model.arch={arch!r}; choose one of {ARCHS}")
        if preset not in models.PRESETS:
            raise ConfigError(f"unknown model preset {preset!r}; known: {', '.join(models.PRESETS)}")
        cls, cfg_cls = (models.MDLM, models.MDLMConfig) if arch == "mdlm" else (models.ADLM, models.ADLMConfig)
        try:
            config = cfg_cls.from_preset(preset, **{**ids, **dict(model_cfg.get("config") or {})})
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"model.config: {exc}") from None
        torch.manual_seed(seed)
        return cls(config)
    from anchored_reasoning.models.zoo import resolve_model

    kwargs = {"dtype": getattr(torch, str(model_cfg["dtype"]))} if model_cfg.get("dtype") else {}
    model = AutoModelForMaskedLM.from_pretrained(resolve_model(str(name)), **kwargs)
    if getattr(model.config, "mask_token_id", None) is None:
        raise ConfigError(f"checkpoint {name!r} has no mask_token_id in its config; it is not a masked diffusion model")
    if model.config.mask_token_id != tokenizer.mask_token_id:
        raise ConfigError(
            f"checkpoint {name!r} uses mask id {model.config.mask_token_id} but its tokenizer's <mask> is "
            f"{tokenizer.mask_token_id}; load the tokenizer saved with the checkpoint (model.tokenizer unset)")
    if len(tokenizer) > model.config.vocab_size:
        logger.info("growing the vocabulary %d -> %d for the trained-format special tokens", model.config.vocab_size, len(tokenizer))
        resize_vocab(model, len(tokenizer))
    return model
