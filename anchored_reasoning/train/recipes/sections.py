"""Recipe sections as dataclasses: the one place that says which keys each trainer's recipe holds.

Each trainer kind has a recipe class (:data:`RECIPES`: ``ar`` -> :class:`ARRecipe`, ...) whose fields are
its sections (``model``, ``method``, ``data``, ``training``, ...), each a nested dataclass; ``training``
is the trainer's own config class (``AnchoredSFTConfig``, ``DiffusionSFTConfig``, ...), so its keys are
that class's init fields. :func:`build` makes the recipe object from the (already loaded and
overridden) recipe mapping, the way TRL's ``TrlParser`` makes its dataclasses: an unknown key anywhere
fails at construction with a :class:`ConfigError` that names it, with the dotted path and the closest
known key. Values' types and ranges are :mod:`.recipe_values`' to check (same specs, same messages).

Sections with no fixed key set name where their keys come from in the field's metadata (``keys``: the
rewards registry, the sampler's fields); ``method.options`` is free (the method's constructor checks it).
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from anchored_reasoning.errors import ConfigError

#: The trainer config class a trainer kind's ``training`` section builds (GRPO: the diffusion subclass,
#: whose fields are a superset of AnchoredGRPOConfig's; the start checkpoint picks the class later).
TRAINING_CONFIGS: dict[str, str] = {
    "ar": "anchored_reasoning.train.trainers.acot_trainer:AnchoredSFTConfig",
    "diffusion": "anchored_reasoning.train.trainers.diffusion_trainer:DiffusionSFTConfig",
    "tadm": "anchored_reasoning.train.trainers.tadm_trainer:TADMTrainingConfig",
    "grpo": "anchored_reasoning.train.trainers.diffusion_grpo:DiffusionGRPOConfig",
    "tadm_gemma": "anchored_reasoning.train.trainers.tadm_gemma_trainer:TADMGemmaConfig",
}


def training_config(trainer: str) -> type:
    module, _, attr = TRAINING_CONFIGS[trainer].partition(":")
    return getattr(importlib.import_module(module), attr)


def _keys(source: Callable[[], Iterable[str]]) -> dict[str, Any]:
    return {"keys": source}


def _reward_keys() -> list[str]:
    from anchored_reasoning.train.rewards import REWARDS

    return [*REWARDS, "tests_timeout_s"]


def _tiny_gemma_keys() -> tuple[str, ...]:
    from anchored_reasoning.train.data.tadm_gemma_data import TINY_KEYS

    return TINY_KEYS


def _sampler_keys() -> list[str]:
    from anchored_reasoning.sampling.samplers import SamplerConfig

    return [f.name for f in dataclasses.fields(SamplerConfig) if f.name not in ("gen_length", "seed")]


# ---------------------------------------------------------------------------------------------
# sections

@dataclass
class DataSource:
    """One ``data.<part>`` section, or one source of its ``mix`` (train/data/data_sources.py). ``holdout: N``:
    the last N examples of the split are the validation set and are left out of training; ``trace``:
    forward | backward; ``mix``: a list of such sections, concatenated; ``exclude_split``: drop
    questions of that split."""

    generator: Any = None
    split: Any = None
    n: Any = None
    limit: Any = None
    seed: Any = None
    params: Any = None
    data_dir: Any = None
    holdout: Any = None
    trace: Any = None
    exclude_split: Any = None
    name: Any = None
    mix: list[DataSource] | None = None


@dataclass
class MethodSection:
    name: Any = None
    options: Any = None  # free: the method's constructor refuses a bad option


@dataclass
class ModelSection:
    preset: Any = None  # a from-scratch config preset
    name: Any = None  # a checkpoint path, Hub id or model-zoo alias
    config: Any = None  # overrides of the preset's config fields
    tokenizer: Any = None  # "train" (BPE on the training text), or a path / Hub id / alias
    tokenizer_vocab_size: Any = None
    dtype: Any = None


@dataclass
class ARModel(ModelSection):
    revision: Any = None  # a Hub revision for ``name``; ignored for a local directory


@dataclass
class DiffusionModel(ModelSection):
    arch: Any = None  # mdlm | adlm


@dataclass
class TADMModel(DiffusionModel):
    base: Any = None  # an MDLM/ADLM checkpoint to post-train
    shared_layers: Any = None
    anchor_layers: Any = None
    fusion_size: Any = None


@dataclass
class PeftSection:
    """``peft:`` (train/peft_setup.py): train a LoRA adapter instead of every weight; ``load_in_4bit``: QLoRA."""

    r: Any = None
    lora_alpha: Any = None
    lora_dropout: Any = None
    target_modules: Any = None  # a list of module names, or "all-linear"
    modules_to_save: Any = None
    train_new_tokens: Any = None  # the format's added tokens' embedding rows train (trainable_token_indices)
    load_in_4bit: Any = None
    bnb_4bit_quant_type: Any = None
    bnb_4bit_compute_dtype: Any = None
    bnb_4bit_use_double_quant: Any = None


@dataclass
class ARData:
    train: DataSource | None = None
    valid: DataSource | None = None


@dataclass
class GRPOData:
    train: DataSource | None = None  # held-out evaluation is the eval runner's job


@dataclass
class DiffusionData(ARData):
    text_file: Any = None
    valid_text_file: Any = None
    seq_len: Any = None
    split_lines: Any = None
    max_train_tokens: Any = None
    ppl_t_samples: Any = None
    max_length: Any = None
    overlong: Any = None
    anchors: Any = None


@dataclass
class TADMData(DiffusionData):
    ppl_refresh_every: Any = None
    ppl_max_blocks: Any = None


# ---------------------------------------------------------------------------------------------
# recipes

@dataclass
class BaseRecipe:
    """The keys every trainer's recipe shares. ``training`` holds the trainer config's fields."""

    trainer: Any = None
    extends: Any = None
    description: Any = None
    task: Any = None
    seed: Any = None
    output_dir: Any = None
    training: dict | None = field(default=None, metadata={"config": True})

    kind = "ar"


@dataclass
class Recipe(BaseRecipe):
    """A recipe with a top-level ``method`` section (every kind but ``tadm_gemma``)."""

    method: MethodSection | None = None


@dataclass
class ARRecipe(Recipe):
    model: ARModel | None = None
    data: ARData | None = None
    peft: PeftSection | None = None
    kind = "ar"


@dataclass
class DiffusionRecipe(Recipe):
    model: DiffusionModel | None = None
    data: DiffusionData | None = None
    kind = "diffusion"


@dataclass
class TADMRecipe(Recipe):
    model: TADMModel | None = None
    data: TADMData | None = None
    kind = "tadm"


@dataclass
class GRPORecipe(Recipe):
    model: ModelSection | None = None
    data: GRPOData | None = None
    rewards: dict | None = field(default=None, metadata=_keys(_reward_keys))
    sampler: dict | None = field(default=None, metadata=_keys(_sampler_keys))  # diffusion checkpoints only
    peft: PeftSection | None = None  # causal LM policies only
    kind = "grpo"


@dataclass
class TADMGemmaModel:
    """A frozen DiffusionGemma: ``name`` (a checkpoint) or ``tiny`` (a random small one's config)."""

    name: Any = None
    tiny: dict | None = field(default=None, metadata=_keys(_tiny_gemma_keys))
    dtype: Any = None
    split: Any = None  # [shared, anchor, denoiser] decoder layers
    fusion_dim: Any = None
    fusion_heads: Any = None
    fusion_kind: Any = None  # attention (default) | paired (the paper's, appendix C.1)


@dataclass
class TADMGemmaData:
    train: DataSource | None = None  # task examples (with task: and method) ...
    method: Any = None  # the instruct method whose prompt is the context
    text_file: Any = None  # ... or documents
    max_context: Any = None


@dataclass
class TADMGemmaRecipe(BaseRecipe):
    """``tadm_gemma``: no top-level ``method`` section (the method is ``data.method``)."""

    model: TADMGemmaModel | None = None
    data: TADMGemmaData | None = None
    kind = "tadm_gemma"


RECIPES: dict[str, type[BaseRecipe]] = {"ar": ARRecipe, "diffusion": DiffusionRecipe, "tadm": TADMRecipe, "grpo": GRPORecipe,
                            "tadm_gemma": TADMGemmaRecipe}


def recipe_class(trainer: str) -> type[BaseRecipe]:
    try:
        return RECIPES[trainer]
    except KeyError:
        raise ConfigError(f"unknown trainer {trainer!r} in recipe; known: {', '.join(sorted(RECIPES))}") from None


# ---------------------------------------------------------------------------------------------
# the parser

def unknown_key(key: str, where: str, known: Iterable[str]) -> ConfigError:
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"unknown recipe key {where + key!r}{hint} (known here: {', '.join(known)})")


def _section_class(f: dataclasses.Field) -> type | None:
    """The dataclass a field's annotation names (``X | None``, ``list[X] | None``), or None."""
    hint = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
    name = hint.replace(" | None", "").removeprefix("list[").removesuffix("]")
    return _SECTIONS.get(name)


def _free_keys(cls: type, key: str, f: dataclasses.Field, trainer: str) -> list[str] | None:
    if f.metadata.get("config"):
        return [g.name for g in dataclasses.fields(training_config(trainer)) if g.init]
    if "keys" in f.metadata:
        return list(f.metadata["keys"]())
    return None


def build(cls: type, values: Mapping[str, Any], where: str = "", trainer: str | None = None) -> Any:
    """``cls(**values)`` with every nested section built the same way; keys starting with ``_`` are
    internal (``_source``) and skipped. An unknown key raises :func:`unknown_key`; a section that is not a
    mapping (a list for ``mix``) says what it must be."""
    trainer = trainer or getattr(cls, "kind", "ar")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if str(key).startswith("_"):
            continue
        if key not in fields:
            if key == "peft" and not where:
                raise ConfigError(f"recipe section 'peft' (LoRA) applies to the ar and grpo trainers (causal LMs); the "
                                  f"{trainer} trainer trains every weight of its model: remove the section")
            raise unknown_key(str(key), where, fields)
        f, path = fields[key], f"{where}{key}"
        sub, free = _section_class(f), _free_keys(cls, key, f, trainer)
        if value is None or (sub is None and free is None):
            kwargs[key] = value
        elif free is not None:
            if not isinstance(value, Mapping):
                what = "a mapping of training settings" if f.metadata.get("config") else "a mapping"
                raise ConfigError(f"recipe key {path!r} must be {what}" + (
                    "" if f.metadata.get("config") else f", got {type(value).__name__}"))
            for k in value:
                if k not in free:
                    raise unknown_key(str(k), path + ".", free)
            kwargs[key] = dict(value)
        elif "list[" in str(f.type):
            if not isinstance(value, list) or not value:
                raise ConfigError(f"recipe key {path!r} must be a non-empty list of data sources")
            for i, source in enumerate(value):
                if not isinstance(source, Mapping):
                    raise ConfigError(f"recipe key {path}[{i}] must be a mapping, got {type(source).__name__}")
            kwargs[key] = [build(sub, s, f"{path}[{i}].", trainer) for i, s in enumerate(value)]
        else:
            if not isinstance(value, Mapping):
                raise ConfigError(f"recipe key {path!r} must be a mapping, got {type(value).__name__}")
            kwargs[key] = build(sub, value, path + ".", trainer)
    return cls(**kwargs)


def key_tree(trainer: str) -> dict[str, Any]:
    """The recipe's keys as a nested dict (``None``: a value; a dict: a section; ``"data_sources"``: a
    list of data sources; ``"training"``: the config's fields) -- for tests and docs."""
    def tree(cls: type) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            sub = _section_class(f)
            if f.metadata.get("config"):
                out[f.name] = "training"
            elif "keys" in f.metadata:
                out[f.name] = {k: None for k in f.metadata["keys"]()}
            elif sub is None:
                out[f.name] = None
            else:
                out[f.name] = "data_sources" if "list[" in str(f.type) else tree(sub)
        return out
    return tree(recipe_class(trainer))


_SECTIONS: dict[str, type] = {c.__name__: c for c in (
    DataSource, MethodSection, ModelSection, PeftSection, ARModel, DiffusionModel, TADMModel, ARData, GRPOData, DiffusionData,
    TADMData, TADMGemmaModel, TADMGemmaData)}
