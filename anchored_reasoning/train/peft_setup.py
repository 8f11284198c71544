"""LoRA and QLoRA for the SFT family and GRPO: the recipe's ``peft:`` section (or ``peft_config=`` from Python)
made into the ``peft.LoraConfig`` handed to TRL's trainer as ``peft_config``.

The anchoring formats add special tokens (``[BoA]``, ``[ANT]``, ``[EoA]``, ``[BoR]``, ``[EoR]``, ``[PAUSE]``, and a
method's own such as ``[Back]``) whose embedding rows start untrained. Under plain LoRA every embedding is
frozen, so those rows would never learn; :func:`lora_config` therefore puts their ids in PEFT's
``trainable_token_indices`` for the input embedding (and for an untied output head too): only those rows train,
and the adapter stores them. ``modules_to_save`` (a full trainable copy of the embedding and head) is not used
by default: for Qwen2.5's 151k-row vocabulary that is ~136M trained parameters and a checkpoint-sized adapter,
and with tied embeddings it unties them (docs/peft.md says more).

What is checked, and when:

* the section's keys and values: with the rest of the recipe (:mod:`.recipes.values`), before any data loads;
* QLoRA (``load_in_4bit: true``) without a CUDA GPU or without bitsandbytes: :func:`check_runtime`, called
  when the trainer config is built (step 1 of the run skeleton), before any data or model loads;
* a target module the model does not have: :func:`lora_config`, after the model loads and before training.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
from typing import Any, Mapping, Sequence

from anchored_reasoning.errors import ConfigError

logger = logging.getLogger(__name__)

#: The trainer kinds whose recipes take a ``peft:`` section (causal LMs through TRL's SFT and GRPO trainers).
PEFT_TRAINERS = ("ar", "grpo")
#: The section's keys and their defaults (``target_modules: all-linear``: every linear layer but the head).
DEFAULTS: dict[str, Any] = {
    "r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": "all-linear", "modules_to_save": None,
    "train_new_tokens": True, "load_in_4bit": False, "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_use_double_quant": True,
}
INSTALL = "pip install 'anchored-reasoning[peft]'"


def settings(section: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The section with its defaults filled in; None when the recipe has no ``peft:`` section (full fine-tuning)."""
    if section is None:
        return None
    return {**DEFAULTS, **{k: v for k, v in dict(section).items() if v is not None}}


def check_runtime(section: Mapping[str, Any] | None, diffusion: bool = False) -> None:
    """Refuse, before any work, a ``peft:`` section this run cannot use: a diffusion start checkpoint (GRPO),
    peft not installed, or QLoRA (``load_in_4bit``) without bitsandbytes or without a CUDA GPU (4-bit weights
    need bitsandbytes' CUDA kernels)."""
    cfg = settings(section)
    if cfg is None:
        return
    if diffusion:
        raise ConfigError("recipe section 'peft' (LoRA) applies to causal LM policies; this GRPO run starts from a "
                          "diffusion checkpoint, whose trainer updates every weight: remove the section")
    if importlib.util.find_spec("peft") is None:
        raise ConfigError(f"recipe section 'peft' trains a LoRA adapter, which needs the peft package: {INSTALL}")
    if not cfg["load_in_4bit"]:
        return
    import torch

    if importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError("recipe value peft.load_in_4bit=true (QLoRA) loads the model in 4 bits through bitsandbytes, "
                          "which is not installed: pip install bitsandbytes (on a CUDA machine), or set "
                          "peft.load_in_4bit=false to train LoRA on the unquantised model")
    if not torch.cuda.is_available():
        raise ConfigError("recipe value peft.load_in_4bit=true (QLoRA) needs a CUDA GPU: bitsandbytes' 4-bit layers do "
                          "not train on this machine's CPU; set peft.load_in_4bit=false to train LoRA on the "
                          "unquantised model")


def load_kwargs(section: Mapping[str, Any] | None) -> dict[str, Any]:
    """Extra ``from_pretrained`` arguments: QLoRA's ``quantization_config`` (4-bit NF4 by default), else none."""
    cfg = settings(section)
    if cfg is None or not cfg["load_in_4bit"]:
        return {}
    check_runtime(cfg)
    import torch
    from transformers import BitsAndBytesConfig

    return {"quantization_config": BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type=cfg["bnb_4bit_quant_type"],
        bnb_4bit_compute_dtype=getattr(torch, cfg["bnb_4bit_compute_dtype"]),
        bnb_4bit_use_double_quant=bool(cfg["bnb_4bit_use_double_quant"]))}


def new_token_ids(tokenizer: Any, added_tokens: Sequence[str] = ()) -> list[int]:
    """Ids of the anchoring format's special tokens and ``added_tokens`` that ``tokenizer`` holds (sorted)."""
    from anchored_reasoning.methods.anchored import SPECIAL_TOKENS

    vocab = tokenizer.get_vocab()
    return sorted({vocab[t] for t in (*SPECIAL_TOKENS, *added_tokens) if t in vocab})


def _module_name(model: Any, module: Any) -> str | None:
    return next((name for name, m in model.named_modules() if m is module), None)


def _linear_names(model: Any) -> list[str]:
    """The last name part of every linear layer (nn.Linear, GPT-2's Conv1D): what ``target_modules`` may name."""
    names = set()
    for name, module in model.named_modules():
        if type(module).__name__ in ("Linear", "Conv1D", "Linear4bit", "Linear8bitLt") and name:
            names.add(name.rsplit(".", 1)[-1])
    return sorted(names)


def check_target_modules(model: Any, target_modules: Any) -> None:
    """Refuse target modules the model does not have, naming them and the linear layers it has."""
    if target_modules in (None, "all-linear"):
        return
    wanted = [target_modules] if isinstance(target_modules, str) else list(target_modules)
    suffixes = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if name}
    full = {name for name, _ in model.named_modules() if name}
    missing = [t for t in wanted if t not in suffixes and t not in full]
    if missing:
        kind = getattr(model.config, "model_type", type(model).__name__)
        raise ConfigError(f"recipe value peft.target_modules: {', '.join(repr(m) for m in missing)} not in this "
                          f"{kind} model; its linear layers are: {', '.join(_linear_names(model))} "
                          "(or use 'all-linear')")


def token_indices(model: Any, ids: Sequence[int]) -> dict[str, list[int]] | None:
    """``trainable_token_indices`` for ``ids``: the input embedding's module name -> ids, and the head's when it
    is not tied to the embedding (a tied head follows the embedding's rows). None without ids."""
    if not ids:
        return None
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    out = {_module_name(model, embed): list(ids)}
    if head is not None and head.weight.data_ptr() != embed.weight.data_ptr():
        out[_module_name(model, head)] = list(ids)
    logger.info("LoRA: %d new token rows train (%s)", len(ids), ", ".join(out))
    return out


def lora_config(section: Mapping[str, Any] | None, model: Any, tokenizer: Any, added_tokens: Sequence[str] = ()):
    """The ``peft.LoraConfig`` for ``model`` (None without a section). The format's new tokens train through
    ``trainable_token_indices`` on the input embedding and, when the head is not tied to it, on the head."""
    cfg = settings(section)
    if cfg is None:
        return None
    check_runtime(cfg)
    from peft import LoraConfig

    check_target_modules(model, cfg["target_modules"])
    target = cfg["target_modules"]
    trainable = token_indices(model, new_token_ids(tokenizer, added_tokens)) if cfg["train_new_tokens"] else None
    return LoraConfig(r=int(cfg["r"]), lora_alpha=cfg["lora_alpha"], lora_dropout=float(cfg["lora_dropout"]),
                      target_modules=target if isinstance(target, str) else list(target), task_type="CAUSAL_LM",
                      modules_to_save=list(cfg["modules_to_save"]) if cfg["modules_to_save"] else None,
                      trainable_token_indices=trainable)


def with_new_tokens(peft_config: Any, model: Any, tokenizer: Any, added_tokens: Sequence[str] = ()) -> Any:
    """A ``peft_config`` given from Python, with the format's new token ids added to its
    ``trainable_token_indices`` (unless it already names the embedding): the Python API trains them as the
    recipe path does. A non-LoRA config or None is returned as it is."""
    if peft_config is None or not hasattr(peft_config, "trainable_token_indices"):
        return peft_config
    if getattr(peft_config, "target_modules", None) is not None:
        target = peft_config.target_modules
        check_target_modules(model, target if isinstance(target, str) else sorted(target))
    ids = new_token_ids(tokenizer, added_tokens)
    embed_name = _module_name(model, model.get_input_embeddings())
    current = peft_config.trainable_token_indices
    if not ids or (isinstance(current, Mapping) and embed_name in current) or isinstance(current, list):
        return peft_config
    peft_config.trainable_token_indices = {**dict(current or {}), **token_indices(model, ids)}
    return peft_config


def wrap(model: Any, peft_config: Any, tokenizer: Any = None, added_tokens: Sequence[str] = (), seed: int = 0) -> Any:
    """``get_peft_model(model, peft_config)`` for the trainers (None: ``model`` as it is). With ``tokenizer`` the
    format's new token rows are added to a LoRA config's ``trainable_token_indices`` (:func:`with_new_tokens`).
    A head wrapped for trainable tokens gets its ``bias`` attribute back: TRL's fused LM head reads
    ``lm_head.weight`` (PEFT gives the merged rows) and ``lm_head.bias``, which PEFT's wrapper does not forward.
    The LoRA matrices start from ``seed`` (the run's), whatever ran before in the process."""
    if peft_config is None:
        return model
    from peft import get_peft_model
    from peft.utils.other import TrainableTokensWrapper

    if hasattr(model, "peft_config"):
        raise ConfigError("the model is a PeftModel already and a peft_config was given as well: merge the first "
                          "adapter (anchored-reasoning export) and train the merged model, or leave peft_config out")
    if tokenizer is not None:
        with_new_tokens(peft_config, model, tokenizer, added_tokens)
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = get_peft_model(model, peft_config)
    if getattr(peft_config, "trainable_token_indices", None):
        # the adapter carries the new rows; PEFT's "auto" would also save the whole resized embedding and head
        # (Qwen2.5: ~1 GB in fp32) because the vocabulary grew. Loading grows the base's vocabulary again
        # (models/adapters.py) and puts these rows in.
        model.save_pretrained = functools.partial(model.save_pretrained, save_embedding_layers=False)
    for module in model.modules():
        if isinstance(module, TrainableTokensWrapper) and "bias" not in module.__dict__:
            # a plain attribute, not a registered parameter: the adapter's state dict stays as PEFT writes it
            object.__setattr__(module, "bias", getattr(module.token_adapter.base_layer, "bias", None))
    return model


def adapter_meta(model: Any, base_name: str | None = None) -> dict[str, Any] | None:
    """What ``anchored_reasoning.json`` records of a LoRA run (None for a full fine-tune): the base model
    (``base_name``, the recipe's ``model.name``, else the path it loaded from), its shape (so evaluation refuses
    an adapter put on another base), the settings and the trained parameter count."""
    from anchored_reasoning.models.adapters import base_signature

    peft_config = getattr(model, "peft_config", None)
    if not peft_config:
        return None
    config = next(iter(peft_config.values()))
    base = model.get_base_model()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"base_model": str(base_name or config.base_model_name_or_path), "base": base_signature(base.config),
            "trainable_parameters": trainable,
            "r": config.r, "lora_alpha": config.lora_alpha,
            "target_modules": sorted({t.rsplit(".", 1)[-1] for t in config.target_modules})
            if isinstance(config.target_modules, (set, list)) else config.target_modules,
            "trainable_token_indices": config.trainable_token_indices,
            "quantized": bool(getattr(base, "is_loaded_in_4bit", False))}
