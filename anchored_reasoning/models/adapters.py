"""LoRA adapter folders (what a ``peft:`` run leaves): recognise one, load it on its base model, merge it.

A LoRA run's folder holds ``adapter_config.json`` + ``adapter_model.safetensors`` (the LoRA matrices and the
trained rows of the format's new tokens), the tokenizer with its added tokens, and ``anchored_reasoning.json``
whose ``peft`` block names the base model and its shape. :func:`load_causal_lm` loads either kind of folder:
a plain checkpoint with ``from_pretrained``, an adapter by loading its base, growing the base's vocabulary to
the tokenizer's, and putting the adapter on it; a base whose shape differs from the one the adapter was
trained on is refused before any weight is read. :func:`export_merged` writes ``merge_and_unload``'s plain
checkpoint (``anchored-reasoning export``), which every backend loads as any other model.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from anchored_reasoning.errors import ConfigError

logger = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
#: The config fields that say which base an adapter fits (the vocabulary grows in training: not compared).
SIGNATURE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                  "intermediate_size", "n_embd", "n_layer", "n_head")


def is_adapter_dir(path: str | os.PathLike | None) -> bool:
    return bool(path) and (Path(path) / ADAPTER_CONFIG).is_file()


def base_signature(config: Any) -> dict[str, Any]:
    """The shape of a model config (a ``PretrainedConfig`` or its dict) that an adapter depends on."""
    values = config if isinstance(config, dict) else config.to_dict()
    return {k: values[k] for k in SIGNATURE_KEYS if values.get(k) is not None}


def adapter_base(path: str | os.PathLike) -> str:
    """The base model an adapter folder names: ``anchored_reasoning.json``'s ``peft.base_model`` (the recipe's
    ``model.name``, an alias or a path), else ``adapter_config.json``'s ``base_model_name_or_path``."""
    from anchored_reasoning.checkpoints import read_checkpoint_meta

    meta = (read_checkpoint_meta(path) or {}).get("peft") or {}
    base = meta.get("base_model") or json.loads((Path(path) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base:
        raise ConfigError(f"{Path(path) / ADAPTER_CONFIG} names no base model (base_model_name_or_path): give it, "
                          "or export the adapter where it was trained")
    return str(base)


def check_base(path: str | os.PathLike, base_path: str, base_config: Any) -> None:
    """Refuse a base whose shape differs from the one ``anchored_reasoning.json`` recorded at training."""
    from anchored_reasoning.checkpoints import read_checkpoint_meta

    trained = ((read_checkpoint_meta(path) or {}).get("peft") or {}).get("base")
    if not trained:
        return
    found = base_signature(base_config)
    diff = {k: (v, found.get(k)) for k, v in trained.items() if found.get(k) != v}
    if diff:
        shown = ", ".join(f"{k} {a} (trained) vs {b}" for k, (a, b) in diff.items())
        raise ConfigError(f"the adapter in {path} was trained on another base model than {base_path}: {shown}; "
                          "evaluate it with the base it was trained on (anchored_reasoning.json, peft.base_model)")


def check_new_rows(path: str | os.PathLike, base_rows: int, size: int) -> None:
    """Refuse an adapter that holds neither the rows of the tokens added to the base's ``base_rows`` (its
    ``trainable_token_indices``) nor a whole embedding: those rows would be random."""
    from safetensors import safe_open

    indices = json.loads((Path(path) / ADAPTER_CONFIG).read_text()).get("trainable_token_indices") or {}
    covered = set().union(*map(set, indices.values())) if isinstance(indices, dict) else set(indices)
    missing = [i for i in range(base_rows, size) if i not in covered]
    if not missing:
        return
    weights = Path(path) / "adapter_model.safetensors"
    keys = list(safe_open(str(weights), "pt").keys()) if weights.is_file() else []
    if not any("embed" in k and not k.endswith("trainable_tokens_delta") for k in keys):
        raise ConfigError(f"the adapter in {path} adds tokens to its base's {base_rows} rows but holds no trained "
                          f"row for ids {missing[:5]}{' ...' if len(missing) > 5 else ''}: train it with "
                          "peft.train_new_tokens=true (the default) or on a base that has those tokens")


def load_adapter_model(path: str | os.PathLike, *, base: str | None = None, merge: bool = True, **kwargs: Any):
    """The causal LM of an adapter folder: its base (``base``, else :func:`adapter_base`) loaded with ``kwargs``
    (``dtype``, ``revision``, ...), its vocabulary grown to the folder's tokenizer, the adapter put on it;
    ``merge``: ``merge_and_unload`` (a plain model, as fast as the base; the same greedy text)."""
    try:
        from peft import PeftModel
    except ImportError:
        raise ConfigError(f"{path} is a LoRA adapter, which needs the peft package to load: "
                          "pip install 'anchored-reasoning[peft]'") from None
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from anchored_reasoning.models.zoo import resolve_model

    base_path = resolve_model(base or adapter_base(path))
    kwargs.pop("revision", None)  # a revision names the adapter's folder, not its base
    check_base(path, base_path, AutoConfig.from_pretrained(base_path))
    model = AutoModelForCausalLM.from_pretrained(base_path, **kwargs)
    size, base_rows = len(AutoTokenizer.from_pretrained(str(path))), model.get_input_embeddings().weight.shape[0]
    if base_rows < size:
        check_new_rows(path, base_rows, size)
        model.resize_token_embeddings(size, mean_resizing=False)  # the adapter holds the new rows
    try:
        model = PeftModel.from_pretrained(model, str(path))
    except (RuntimeError, ValueError, KeyError) as exc:
        raise ConfigError(f"the adapter in {path} does not fit the base model {base_path}: {exc}") from None
    logger.info("loaded the LoRA adapter %s on %s%s", path, base_path, " (merged)" if merge else "")
    return model.merge_and_unload() if merge else model


def load_causal_lm(path: str | os.PathLike, **kwargs: Any):
    """``AutoModelForCausalLM.from_pretrained(path, **kwargs)``, or for an adapter folder its merged model."""
    if is_adapter_dir(path):
        kwargs.pop("trust_remote_code", None)
        return load_adapter_model(path, **kwargs)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, **kwargs)


def export_merged(path: str | os.PathLike, out_dir: str | os.PathLike, *, base: str | None = None,
                  dtype: str | None = None) -> Path:
    """Write the merged model of the adapter in ``path`` to ``out_dir`` as a plain checkpoint: weights,
    tokenizer and ``anchored_reasoning.json`` (its ``peft`` block becomes ``merged_from``)."""
    from transformers import AutoTokenizer

    from anchored_reasoning.checkpoints import CHECKPOINT_META

    if not is_adapter_dir(path):
        raise ConfigError(f"{path} holds no {ADAPTER_CONFIG}: it is not a LoRA adapter folder (a full fine-tune "
                          "is a plain checkpoint already)")
    out = Path(out_dir)
    if out.resolve() == Path(path).resolve():
        raise ConfigError(f"export {path} into another folder than itself")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} exists and is not empty: give a new folder for the merged checkpoint")
    import torch

    kwargs = {"dtype": getattr(torch, dtype)} if dtype else {}
    model = load_adapter_model(path, base=base, merge=True, **kwargs)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(path)).save_pretrained(str(out))
    meta_path = Path(path) / CHECKPOINT_META
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        meta["merged_from"] = {"adapter": str(Path(path).resolve()), **(meta.pop("peft", None) or {})}
        (out / CHECKPOINT_META).write_text(json.dumps(meta, indent=2) + "\n")
    for name in ("train_summary.json",):
        if (Path(path) / name).is_file():
            shutil.copy2(Path(path) / name, out / name)
    logger.info("merged %s into the plain checkpoint %s", path, out)
    return out
