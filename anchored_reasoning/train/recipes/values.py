"""Recipe values: the type and range of every recipe key, checked before any data or model loads.

:func:`check_values` walks a recipe whose keys :func:`~anchored_reasoning.train.recipes.sections.build` has
accepted and refuses the first value of the wrong type or out of range with a :class:`ConfigError`
that names the key, the value and what the key accepts::

    recipe value training.max_steps=-5: expected an integer >= 1, or -1 (-1: train for num_train_epochs instead)
    recipe value training.learning_rate='1e-3e' (a string): expected a number > 0

Where the specs come from:

* ``training``: the trainer's config dataclass (``recipe_sections.TRAINING_CONFIGS``), read with
  :func:`typing.get_type_hints`, so a field that TRL or transformers add or retype is checked as the
  library declares it; an Enum in a field's type (``lr_scheduler_type``, ``optim``, ``eval_strategy``)
  gives its choices. :data:`TRAINING_RANGES` adds the ranges a type cannot say.
* ``sampler`` (diffusion GRPO): :class:`SamplerConfig`'s types, then its own range checks.
* ``method``: a registered method name; for the trainers that render in the trained style the method
  is built from its options, so its constructor refuses a bad option before any data is read.
* every other key: :func:`section_specs`.

Numbers are read as YAML and the overrides read them: ``1e-3`` in a file is a string to YAML 1.1, and a
number key takes it as the number. A string for a number key (``abc``, ``1e-3e``), a float for an integer
key, ``1``/``0`` for a boolean and a boolean for a number are refused.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import typing
from pathlib import Path
from typing import Any, Mapping

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.train import TRAINERS
from anchored_reasoning.train.recipes.sections import TRAINING_CONFIGS
from anchored_reasoning.train.recipes.value_spec import (
    Value,
    choice,
    from_annotation,
    integer,
    number,
    text,
    value_error,
)

@dataclasses.dataclass(frozen=True)
class Many:
    """A list of sections, each a mapping checked against ``section`` (``data.train.mix``)."""

    section: Mapping[str, Any]


FLAG = Value(("bool",))
MAPPING = Value(("mapping",), nullable=True)
#: numpy's seeding takes [0, 2**32 - 1]; transformers' set_seed seeds numpy too
SEED = integer(0, high=2**32 - 1)
FRACTION_OF_STEPS = "below 1: a fraction of the total steps"

#: Ranges of ``training`` fields, merged into the spec their type gives (a field absent from a trainer's
#: config class is ignored). Each names the value that makes no sense: a batch of 0, a negative rate.
TRAINING_RANGES: dict[str, dict[str, Any]] = {
    # transformers TrainingArguments
    "max_steps": {"low": 1, "also": (-1,), "note": "-1: train for num_train_epochs instead"},
    "num_train_epochs": {"low": 0, "low_open": True},
    **{k: {"low": 1} for k in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                               "eval_accumulation_steps", "torch_empty_cache_steps", "dataloader_prefetch_factor",
                               "ddp_timeout", "save_total_limit")},
    **{k: {"low": 0, "low_open": True} for k in ("learning_rate", "adam_epsilon")},
    **{k: {"low": 0} for k in ("weight_decay", "max_grad_norm", "dataloader_num_workers", "neftune_noise_alpha",
                               "eval_delay")},
    **{k: {"low": 0, "high": 1, "high_open": True} for k in ("adam_beta1", "adam_beta2", "label_smoothing_factor")},
    "warmup_steps": {"low": 0, "note": FRACTION_OF_STEPS},
    **{k: {"low": 0, "low_open": True, "note": FRACTION_OF_STEPS} for k in ("logging_steps", "save_steps", "eval_steps")},
    "seed": {"low": 0, "high": 2**32 - 1},
    "data_seed": {"low": 0, "high": 2**32 - 1},
    # TRL SFTConfig / GRPOConfig
    **{k: {"low": 1} for k in ("max_length", "dataset_num_proc", "num_generations_eval", "max_completion_length",
                               "generation_batch_size", "steps_per_generation", "num_iterations",
                               "vllm_tensor_parallel_size", "max_tool_calling_iterations")},
    "num_generations": {"low": 2, "note": "GRPO compares the completions of a prompt with each other"},
    **{k: {"low": 0, "low_open": True} for k in ("temperature", "repetition_penalty", "vllm_server_timeout")},
    **{k: {"low": 0} for k in ("top_k", "beta", "epsilon", "epsilon_high", "num_completions_to_print")},
    **{k: {"low": 0, "high": 1} for k in ("min_p", "top_entropy_quantile")},
    **{k: {"low": 0, "low_open": True, "high": 1} for k in ("top_p", "vllm_gpu_memory_utilization")},
    **{k: {"low": 1, "high": 65535} for k in ("vllm_server_port", "vllm_group_port")},
    "vllm_mode": {"choices": ("server", "colocate")},
    # ours: AnchoredSFTConfig (train/trainers/acot_trainer.py), AnchoredGRPOConfig, DiffusionGRPOConfig
    **{k: {"low": 0} for k in ("gamma", "num_anchor_slots", "curriculum_first_stage", "curriculum_min_steps_per_stage",
                               "best_from_stage")},
    **{k: {"low": 0, "low_open": True} for k in ("epochs_per_stage", "curriculum_epochs", "max_train_seconds",
                                                 "save_every_minutes")},
    **{k: {"low": 1} for k in ("effective_batch_size", "num_stages", "generation_eval_steps", "generation_eval_samples",
                               "generation_max_new_tokens")},
    "curriculum_schedule": {"choices": ("epochs", "fraction")},
    "stage_fraction": {"low": 0, "low_open": True, "high": 1},
    "prompt_mask_ratio": {"low": 0, "high": 1, "high_open": True},
    # DiffusionSFTConfig (train/trainers/diffusion_trainer.py), TADMTrainingConfig (train/pipelines/tadm.py)
    "diffusion_mode": {"choices": ("sft", "pretrain")},
    "loss_normalization": {"choices": ("sequence", "token")},
    "anchor_gamma": {"low": 0},
    "anchor_tau": {"low": 1},
    "gamma_warmup_ratio": {"low": 0, "high": 1},
    "response_length": {"low": 1},
    "time_eps": {"low": 0, "low_open": True, "high": 1, "high_open": True},
    "tadm_objective": {"choices": ("t_anelbo", "posttrain")},
    "stale_k_choices": {"item": integer(1)},
    "rollout_choices": {"item": integer(0)},
    "stale_sampling_steps": {"low": 1},
    **{k: {"low": 0} for k in ("kl_weight", "ce_weight")},
}
#: ``bf16: auto`` (the diffusion trainers' make_config): bf16 on a CUDA GPU that supports it, fp32 elsewhere
_BF16_AUTO = Value(("bool",), also=("auto",), nullable=True, note="auto: bf16 where a CUDA GPU supports it")
TRAINER_TRAINING: dict[str, dict[str, Value]] = {"diffusion": {"bf16": _BF16_AUTO}, "tadm": {"bf16": _BF16_AUTO}}


def _import(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


@functools.lru_cache(maxsize=None)
def dataclass_specs(cls: type, ranges: bool = True) -> dict[str, Value]:
    """Field name -> spec of every init field of a config dataclass (with :data:`TRAINING_RANGES`)."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Value] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        spec = from_annotation(hints[f.name])
        if ranges and f.name in TRAINING_RANGES:
            spec = dataclasses.replace(spec, **TRAINING_RANGES[f.name])
        out[f.name] = spec
    return out


def training_specs(trainer: str) -> dict[str, Value]:
    return {**dataclass_specs(_import(TRAINING_CONFIGS[trainer])), **TRAINER_TRAINING.get(trainer, {})}


# ---------------------------------------------------------------------------------------------
# the other sections

@functools.lru_cache(maxsize=1)
def generator_names() -> tuple[str, ...]:
    """The modules of ``anchored_reasoning.generators`` with a ``generate_dataset`` (a data source's generator)."""
    import pkgutil

    import anchored_reasoning.generators as pkg

    names = [m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_")]
    return tuple(n for n in names if hasattr(importlib.import_module(f"{pkg.__name__}.{n}"), "generate_dataset"))


def _method_names() -> tuple[str, ...]:
    from anchored_reasoning.methods import list_methods

    return tuple(sorted({name.rpartition(":")[2] for name in list_methods()}))


def _task_names() -> tuple[str, ...]:
    from anchored_reasoning.tasks import list_tasks

    return tuple(list_tasks())


def _is_yaml_file(value: str) -> bool:
    return value.endswith((".yaml", ".yml")) and Path(value).is_file()


def _presets(trainer: str) -> tuple[str, ...]:
    if trainer in ("diffusion", "tadm"):
        from anchored_reasoning.models import PRESETS
    else:
        from anchored_reasoning.train.pipelines.model_presets import MODEL_PRESETS as PRESETS
    return tuple(PRESETS)


def data_source_spec() -> dict[str, Any]:
    """One ``data.<part>`` section, or one source of its ``mix`` (train/data/data_sources.py)."""
    from anchored_reasoning.generators.traces import TRACE_ORDERS

    source: dict[str, Any] = {
        "generator": text(choices=generator_names, nullable=True), "split": text(nullable=True),
        "n": integer(1), "limit": integer(1, nullable=True), "seed": SEED, "params": MAPPING,
        "data_dir": text(nullable=True), "holdout": integer(1, nullable=True),
        "trace": choice(*TRACE_ORDERS, nullable=True), "exclude_split": text(nullable=True),
        "name": text(pattern=r"\S+", says="a word without spaces (the ids' prefix)", nullable=True),
    }
    source["mix"] = Many(source)
    return source


def section_specs(trainer: str) -> dict[str, Any]:
    """Every non-``training`` key's spec, for ``trainer`` (model presets and architectures differ)."""
    from anchored_reasoning.train.rewards import REWARDS

    arch = {"diffusion": ("mdlm", "adlm"), "tadm": ("tadm",)}.get(trainer, ())
    source = data_source_spec()
    return {
        "trainer": choice(*TRAINERS), "extends": text(nullable=True), "description": text(nullable=True),
        "task": text(choices=_task_names, accept=_is_yaml_file, says="or a task YAML file", nullable=True),
        "seed": SEED, "output_dir": text(nullable=True),
        "model": {
            "preset": choice(*_presets(trainer), nullable=True), "name": text(nullable=True), "config": MAPPING,
            "tokenizer": text(nullable=True), "tokenizer_vocab_size": integer(1),
            "dtype": choice("float32", "bfloat16", "float16", "float64", nullable=True),
            "revision": text(nullable=True), "arch": choice(*arch, nullable=True), "base": text(nullable=True),
            "shared_layers": integer(0, nullable=True), "anchor_layers": integer(1, nullable=True),
            "fusion_size": integer(1, nullable=True),
        },
        "method": {"name": text(choices=_method_names, nullable=True), "options": MAPPING},
        "data": {
            "train": source, "valid": source,
            "text_file": text(nullable=True), "valid_text_file": text(nullable=True), "seq_len": integer(1),
            "split_lines": FLAG, "max_train_tokens": integer(1, nullable=True), "ppl_t_samples": integer(1),
            "max_length": integer(1), "overlong": choice("error", "drop"),
            "anchors": choice("frequency", "task", nullable=True),
            "ppl_refresh_every": Value(("list",), item=integer(1), nullable=True),
            "ppl_max_blocks": integer(1, nullable=True),
        },
        "peft": {
            "r": integer(1), "lora_alpha": number(0, low_open=True), "lora_dropout": number(0, high=1, high_open=True),
            "target_modules": Value(("str", "list"), item=text(), nullable=True,
                                    says="a module name or 'all-linear'"),
            "modules_to_save": Value(("list",), item=text(), nullable=True), "train_new_tokens": FLAG,
            "load_in_4bit": FLAG, "bnb_4bit_quant_type": choice("nf4", "fp4"),
            "bnb_4bit_compute_dtype": choice("bfloat16", "float16", "float32"), "bnb_4bit_use_double_quant": FLAG,
        },
        "rewards": {**{name: number(None) for name in REWARDS},
                    "tests_timeout_s": number(0, low_open=True, nullable=True)},
    }


# ---------------------------------------------------------------------------------------------
# the check

def check_values(recipe: Mapping[str, Any], trainer: str) -> dict[str, Any]:
    """Refuse the first value of the wrong type or out of range (:class:`ConfigError` naming the key, the
    value and what it accepts); return the recipe with number strings (``"1e-3"``) made numbers."""
    out = copy.deepcopy(dict(recipe))
    top = choice(*TRAINERS)
    if not top.check(trainer)[0]:
        raise value_error("trainer", trainer, top)
    specs = section_specs(trainer)
    for key in list(out):
        if str(key).startswith("_") or out[key] is None:
            continue
        if key == "training":
            out[key] = _check_section(out[key], training_specs(trainer), "training.")
        elif key == "sampler":
            out[key] = _check_sampler(out[key])
        elif key in specs:
            out[key] = _check(specs[key], out[key], str(key))
    _check_method(out, trainer)
    return out


def _check(spec: Any, value: Any, path: str) -> Any:
    if isinstance(spec, Value):
        ok, value = spec.check(value)
        if not ok:
            raise value_error(path, value, spec)
        return value
    if value is None:
        return value
    if isinstance(spec, Many):
        if not isinstance(value, list) or not value:
            raise ConfigError(f"recipe value {path}={value!r}: expected a non-empty list of data sources")
        return [_check(spec.section, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, Mapping):
        raise ConfigError(f"recipe value {path}={value!r}: expected a mapping (a section of keys)")
    return _check_section(value, spec, path + ".")


def _check_section(section: Mapping[str, Any], specs: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Each key of ``section`` that has a spec, checked (unknown keys are recipes.validate's to refuse)."""
    if not isinstance(section, Mapping):
        raise ConfigError(f"recipe value {where[:-1]}={section!r}: expected a mapping (a section of keys)")
    return {k: _check(specs[k], v, where + str(k)) if k in specs else v for k, v in section.items()}


def _check_sampler(section: Mapping[str, Any]) -> dict[str, Any]:
    from anchored_reasoning.sampling.samplers import SamplerConfig

    checked = _check_section(section, dataclass_specs(SamplerConfig, ranges=False), "sampler.")
    try:
        SamplerConfig(**checked)  # its own checks: ranges, and the settings that go together
    except (ConfigError, TypeError, ValueError) as exc:
        raise ConfigError(f"recipe section 'sampler': {exc}") from None
    return checked


def _check_method(recipe: Mapping[str, Any], trainer: str) -> None:
    """Build the method from its options, for the trainers that render in the trained style (GRPO's style
    depends on the start checkpoint, read later): its constructor refuses a bad option, naming it."""
    cfg = recipe.get("method") or {}
    if trainer == "grpo" or not cfg.get("name"):
        return
    from anchored_reasoning.methods import get_method
    from anchored_reasoning.train.pipelines.method_setup import slot_options

    slots = (recipe.get("training") or {}).get("num_anchor_slots") if trainer == "ar" else None
    options = slot_options(cfg["name"], cfg.get("options"), slots, explicit=True)  # the one rule for k
    try:
        get_method(cfg["name"], style="trained", **options)
    except (ConfigError, TypeError, ValueError) as exc:
        raise ConfigError(f"recipe value method.options={options!r}: {exc}") from None
