"""anchored-reasoning: anchor-then-generate reasoning for AR and diffusion language models.

The Python API, one import away (docs/python-api.md)::

    import anchored_reasoning as ar

    train = ar.generate("prosqa", n=512, seed=0, trace="dfs")          # list[ar.Example]
    trainer = ar.AnchoredSFTTrainer(model=model, processing_class=tokenizer, method="acot", task="prosqa",
                                    train_dataset=train, args=ar.AnchoredSFTConfig(output_dir="runs/acot"))
    trainer.train(); trainer.save_model()
    summary = ar.run_eval("prosqa", ar.get_backend("hf", "runs/acot"), None, examples=held_out, out_dir="runs/eval")

Importing the package is cheap: the names below load their modules (torch, transformers, TRL) on first
use (PEP 562 ``__getattr__``); ``dir(anchored_reasoning)`` lists them all.
"""
from __future__ import annotations

import importlib
import os
from typing import Any

from anchored_reasoning.errors import AnchoredReasoningError, BackendError, ConfigError, DataError, ResumeError
from anchored_reasoning.types import Completion, Example, Grade, Prompt, SamplingSpec

__version__ = "0.1.0"

#: Public name -> the module it lives in, imported when the name is first used.
_LAZY: dict[str, str] = {
    # trainers and their configs (TRL subclasses)
    "AnchoredSFTConfig": "anchored_reasoning.train.trainers.acot_trainer",
    "AnchoredSFTTrainer": "anchored_reasoning.train.trainers.acot_trainer",
    "DiffusionSFTConfig": "anchored_reasoning.train.trainers.diffusion_trainer",
    "DiffusionSFTTrainer": "anchored_reasoning.train.trainers.diffusion_trainer",
    "TADMTrainingConfig": "anchored_reasoning.train.trainers.tadm_trainer",
    "TADMTrainer": "anchored_reasoning.train.trainers.tadm_trainer",
    "AnchoredGRPOConfig": "anchored_reasoning.train.trainers.grpo_trainer",
    "AnchoredGRPOTrainer": "anchored_reasoning.train.trainers.grpo_trainer",
    "DiffusionGRPOConfig": "anchored_reasoning.train.trainers.diffusion_grpo",
    "DiffusionGRPOTrainer": "anchored_reasoning.train.trainers.diffusion_grpo",
    # tasks, data, methods, backends
    "Task": "anchored_reasoning.tasks",
    "get_task": "anchored_reasoning.tasks",
    "list_tasks": "anchored_reasoning.tasks",
    "generate": "anchored_reasoning.generators",
    "get_method": "anchored_reasoning.methods",
    "list_methods": "anchored_reasoning.methods",
    "get_backend": "anchored_reasoning.backends",
    "list_backends": "anchored_reasoning.backends",
    # evaluation and comparison
    "run_eval": "anchored_reasoning.eval.runner",
    "compare_runs": "anchored_reasoning.eval.compare",
}


def model_path(alias_or_path: str | os.PathLike) -> str:
    """What ``from_pretrained`` should load for ``alias_or_path``: a model-zoo alias (``logic-gpt2-search``,
    ``smollm2-135m``, ...; ``anchored-reasoning models``) materialised to its local folder, a local folder as
    an absolute path, anything else (a Hub id) unchanged; a reference that names nothing fails with a
    ConfigError naming close aliases. Registers the library's architectures (``shift-gpt2``, ``mdlm``,
    ``adlm``, ``tadm``) with the transformers Auto classes, so ``AutoModelForCausalLM.from_pretrained`` (or
    ``AutoModelForMaskedLM``) loads the result without ``trust_remote_code``."""
    import anchored_reasoning.models  # noqa: F401 - registers the custom architectures
    from anchored_reasoning.models.zoo import resolve_model

    return resolve_model(alias_or_path)


__all__ = [
    # trainers and their configs
    "AnchoredSFTConfig", "AnchoredSFTTrainer", "DiffusionSFTConfig", "DiffusionSFTTrainer",
    "TADMTrainingConfig", "TADMTrainer", "AnchoredGRPOConfig", "AnchoredGRPOTrainer",
    "DiffusionGRPOConfig", "DiffusionGRPOTrainer",
    # tasks, data, methods, backends, models
    "Task", "get_task", "list_tasks", "generate", "get_method", "list_methods", "get_backend", "list_backends",
    "model_path",
    # evaluation and comparison
    "run_eval", "compare_runs",
    # data types and errors
    "Completion", "Example", "Grade", "Prompt", "SamplingSpec",
    "AnchoredReasoningError", "BackendError", "ConfigError", "DataError", "ResumeError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'anchored_reasoning' has no attribute {name!r}")
    value = getattr(importlib.import_module(target), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
