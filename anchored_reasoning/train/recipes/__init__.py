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
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.resources import search_dirs

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


def trainer_name(recipe: Mapping[str, Any], overrides: Iterable[str]) -> Any:
    """The recipe's ``trainer:`` after the overrides (the last ``trainer=`` wins), without applying them:
    the trainer's own resolve applies them, once."""
    name = recipe.get("trainer")
    for text in overrides:
        keys, value = parse_override(text)
        if keys == ["trainer"]:
            name = value
    return name


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


def validate(recipe: Mapping[str, Any], trainer: str = "ar") -> Any:
    """Build ``trainer``'s recipe sections (:mod:`.recipe_sections`) from ``recipe``: the first unknown key
    raises a ConfigError naming its dotted path and a close match. Keys starting with ``_`` are internal."""
    from anchored_reasoning.train.recipes.sections import build, recipe_class

    return build(recipe_class(trainer), recipe)


def _kinds() -> tuple[str, ...]:
    from anchored_reasoning.train.recipes.sections import RECIPES

    return tuple(RECIPES)


def resolve(
    name_or_path: str | os.PathLike | Mapping[str, Any],
    overrides: Iterable[str] = (),
    trainer: str | None = None,
) -> dict[str, Any]:
    """Load (if a name/path), apply overrides, build the trainer's recipe sections (an unknown key fails,
    :func:`validate`) and check every value's type
    and range (:func:`~anchored_reasoning.train.recipes.values.check_values`). Returns the final recipe dict,
    with number strings such as YAML 1.1's ``1e-3`` made numbers.

    With ``trainer``, a recipe that names another trainer is refused (a missing ``trainer:`` key is taken
    to mean this one); without, the recipe's own ``trainer:`` (default ``ar``) picks the value specs."""
    from anchored_reasoning.models.zoo import check_model_reference
    from anchored_reasoning.train.recipes.values import check_values

    recipe = load_recipe(name_or_path) if not isinstance(name_or_path, Mapping) else dict(name_or_path)
    recipe = apply_overrides(recipe, list(overrides))
    kind = trainer or recipe.get("trainer") or "ar"
    validate(recipe, kind if kind in _kinds() else "ar")
    if trainer is not None and recipe.get("trainer", trainer) != trainer:
        raise ConfigError(f"recipe trainer is {recipe.get('trainer')!r}; this is the {trainer!r} trainer")
    recipe = check_values(recipe, kind)  # before anything is looked up
    # a missing path or mistyped alias fails here; a Hub id is checked where it loads (offline: not cached)
    check_model_reference((recipe.get("model") or {}).get("name"), about_to_load=False)
    return recipe
