"""Training recipes: YAML files, dotted ``key=value`` overrides, and validation before any work starts.

A recipe names its trainer (``trainer: ar``) and groups its settings::

    trainer: ar
    extends: _prosqa_base.yaml      # optional: deep-merged under this file (path relative to it)
    task: prosqa
    seed: 0
    output_dir: runs/prosqa-acot
    model:    {preset: gpt2-tiny}   # or {name: smollm2-135m} / {name: /path/to/checkpoint}
    method:   {name: acot, options: {k: 6, remove_steps_per_stage: 1}}
    data:     {train: {generator: prosqa, n: 20000}, valid: {split: valid, limit: 200}}
    training: {learning_rate: 1.0e-4, num_train_epochs: 50, curriculum: true}   # AnchoredSFTConfig fields

``anchored-reasoning train RECIPE training.learning_rate=3e-4 method.options.k=2`` overrides any
key; values are parsed as YAML (``1e-3``, ``true``, ``[1, 2]``). An unknown key -- in the file or in
an override -- fails before training starts with a :class:`ConfigError` that names it (and a close
match); so does a value of the wrong type or out of range (:mod:`.recipe_values`: the key, the value and
what it accepts), before any data or model loads.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.resources import search_dirs

#: One ``data.<part>`` section, or one source of its ``mix`` (train/data_sources.py).
DATA_SECTION: dict[str, Any] = {
    "generator": None, "split": None, "n": None, "limit": None, "seed": None, "params": None, "data_dir": None,
    "holdout": None, "trace": None, "exclude_split": None, "name": None, "mix": "data_sources",
}

#: The schema of the ``ar`` trainer's recipe. A dict value lists the allowed sub-keys;
#: ``None`` means "any value"; ``"training"`` is checked against AnchoredSFTConfig's fields,
#: ``method.options`` against the method's constructor (by get_method).
AR_SCHEMA: dict[str, Any] = {
    "trainer": None,
    "extends": None,
    "description": None,
    "task": None,
    "seed": None,
    "output_dir": None,
    "model": {
        "preset": None,  # a from-scratch config preset (see ar.MODEL_PRESETS)
        "name": None,  # a checkpoint path, Hub id or model-zoo alias
        "config": None,  # overrides of the preset's config fields
        "tokenizer": None,  # "train" (BPE on the training text), or a path / Hub id / alias
        "tokenizer_vocab_size": None,
        "dtype": None,
        "revision": None,  # a Hub revision (commit, tag, branch) for ``name``; ignored for a local directory
    },
    "method": {"name": None, "options": None},
    "data": {
        # holdout: N -- the last N examples of the split are the validation set (data.valid) and
        # are left out of training (data.train), for tasks without a validation split (GSM8K).
        # trace: forward (as given) | backward (generators/traces.py: ProntoQA proofs read from the goal back)
        # mix: a list of such sections, concatenated; exclude_split: drop questions of that split (data_sources.py)
        "train": DATA_SECTION,
        "valid": DATA_SECTION,
    },
    "training": "training",
}


def find_recipe(name_or_path: str | os.PathLike) -> Path:
    """A recipe path: an existing file, or ``NAME`` / ``NAME.yaml`` in the recipe folders
    (``$ANCHORED_REASONING_TRAIN_DIR`` first, then the built-in ``train/``)."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    name = str(name_or_path)
    candidates = [name] if name.endswith((".yaml", ".yml")) else [name + ".yaml", name + ".yml", name]
    for folder in search_dirs("train"):
        for cand in candidates:
            if (folder / cand).is_file():
                return folder / cand
    known = sorted(p.stem for d in search_dirs("train") if d.is_dir() for p in d.glob("*.yaml") if not p.stem.startswith("_"))
    raise ConfigError(f"recipe {name!r} not found (a file path, or one of: {', '.join(known) or 'none'})")


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_recipe(name_or_path: str | os.PathLike, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a recipe, resolving ``extends`` (relative to the file). Not yet validated."""
    path = find_recipe(name_or_path).resolve()
    if path in _seen:
        raise ConfigError(f"recipe {path}: 'extends' forms a cycle: {' -> '.join(map(str, _seen + (path,)))}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"recipe {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {path} must be a mapping at the top level, got {type(data).__name__}")
    parent = data.pop("extends", None)
    if parent:
        base = load_recipe(path.parent / str(parent), _seen + (path,))
        data = deep_merge(base, data)
    data.setdefault("_source", str(path))
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"training.learning_rate=3e-4"`` -> (["training", "learning_rate"], 0.0003)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.sub=value (e.g. training.learning_rate=3e-4)")
    key, _, raw = text.partition("=")
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str):
        value = _maybe_number(value)
    return key.split("."), value


def _maybe_number(text: str) -> Any:
    """YAML reads ``1e-3`` as a string (it wants ``1.0e-3``); recipes mean the number."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def apply_overrides(recipe: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    out = copy.deepcopy(dict(recipe))
    for text in overrides:
        keys, value = parse_override(text)
        node = out
        for depth, key in enumerate(keys[:-1]):
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {'.'.join(keys[: depth + 1])} is a value, not a section")
            node = child
        node[keys[-1]] = value
    return out


def _unknown(key: str, where: str, known: Iterable[str]) -> ConfigError:
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"unknown recipe key {where + key!r}{hint} (known here: {', '.join(known)})")


def training_fields() -> set[str]:
    from anchored_reasoning.train.acot_trainer import AnchoredSFTConfig

    return {f.name for f in dataclasses.fields(AnchoredSFTConfig) if f.init}


def validate(recipe: Mapping[str, Any], schema: Mapping[str, Any] = AR_SCHEMA, where: str = "") -> None:
    """Raise ConfigError naming the first unknown key (dotted path). Keys starting with ``_`` are internal."""
    for key, value in recipe.items():
        if str(key).startswith("_"):
            continue
        if key not in schema:
            raise _unknown(str(key), where, [k for k in schema if not str(k).startswith("_")])
        sub = schema[key]
        if sub is None:
            continue
        if sub == "training":
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise ConfigError(f"recipe key {where + key!r} must be a mapping of training settings")
            fields = training_fields()
            for tkey in value:
                if tkey not in fields:
                    raise _unknown(str(tkey), f"{where}{key}.", fields)
            continue
        if value is None:
            continue
        if sub == "data_sources":
            if not isinstance(value, list) or not value:
                raise ConfigError(f"recipe key {where + key!r} must be a non-empty list of data sources")
            for i, source in enumerate(value):
                if not isinstance(source, Mapping):
                    raise ConfigError(f"recipe key {where}{key}[{i}] must be a mapping, got {type(source).__name__}")
                validate(source, DATA_SECTION, f"{where}{key}[{i}].")
            continue
        if not isinstance(value, Mapping):
            raise ConfigError(f"recipe key {where + key!r} must be a mapping, got {type(value).__name__}")
        validate(value, sub, f"{where}{key}.")


def resolve(
    name_or_path: str | os.PathLike | Mapping[str, Any],
    overrides: Iterable[str] = (),
    schema: Mapping[str, Any] = AR_SCHEMA,
    trainer: str | None = None,
) -> dict[str, Any]:
    """Load (if a name/path), apply overrides, validate the keys against ``schema`` and every value's type
    and range (:func:`~anchored_reasoning.train.recipe_values.check_values`). Returns the final recipe dict,
    with number strings such as YAML 1.1's ``1e-3`` made numbers.

    With ``trainer``, a recipe that names another trainer is refused (a missing ``trainer:`` key is taken
    to mean this one); without, the recipe's own ``trainer:`` (default ``ar``) picks the value specs."""
    from anchored_reasoning.models.zoo import check_model_reference
    from anchored_reasoning.train.recipe_values import check_values

    recipe = load_recipe(name_or_path) if not isinstance(name_or_path, Mapping) else dict(name_or_path)
    recipe = apply_overrides(recipe, list(overrides))
    validate(recipe, schema)
    if trainer is not None and recipe.get("trainer", trainer) != trainer:
        raise ConfigError(f"recipe trainer is {recipe.get('trainer')!r}; this is the {trainer!r} trainer")
    recipe = check_values(recipe, trainer or recipe.get("trainer") or "ar")  # before anything is looked up
    check_model_reference((recipe.get("model") or {}).get("name"))  # a missing path or mistyped alias fails here
    return recipe
