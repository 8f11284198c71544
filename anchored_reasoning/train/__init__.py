"""Training entry points. A recipe YAML names its trainer with ``trainer: <name>``; the
``anchored-reasoning train`` command looks the name up here and calls ``run(recipe, overrides)``.

The recipe trainers (``ar``, ``diffusion``, ``tadm``, ``grpo``, ``tadm_gemma``) run through one skeleton
(:mod:`.pipeline`): the recipe is resolved once into its trainer's sections (:mod:`.recipe_sections`; an
unknown key fails before training starts, naming the key), and ``run`` returns the output directory of
the trained checkpoint.
"""
from __future__ import annotations

import functools
import importlib

from anchored_reasoning.errors import ConfigError

TRAINERS: dict[str, str] = {
    "ar": "anchored_reasoning.train.pipelines.ar:run",  # SFT / ACoT / pause / stepwise on causal LMs
    "diffusion": "anchored_reasoning.train.pipelines.diffusion:run",  # MDLM / ADLM pretraining and SFT
    "tadm": "anchored_reasoning.train.pipelines.tadm:run",  # TADM: T-ANELBO pretraining, post-training of MDLM/ADLM
    "grpo": "anchored_reasoning.train.pipelines.grpo:run",  # GRPO (plain / anchored) for causal LMs, diffu-GRPO for MDLM/ADLM/TADM
    "tadm_gemma": "anchored_reasoning.train.pipelines.tadm_gemma:run",  # TADM:Post-train of a frozen DiffusionGemma (fusion only)
}


def get_trainer(name: str):
    try:
        target = TRAINERS[name]
    except KeyError:
        raise ConfigError(f"unknown trainer {name!r} in recipe; known: {', '.join(sorted(TRAINERS))}") from None
    module_name, _, attr = target.partition(":")
    run = getattr(importlib.import_module(module_name), attr)

    @functools.wraps(run)
    def logged(*args, **kwargs):  # the whole run's log lines go to <output_dir>/train.log (train/callbacks/progress.py)
        from anchored_reasoning.train.callbacks.progress import run_log

        with run_log():
            return run(*args, **kwargs)
    return logged
