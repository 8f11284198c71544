"""What joined a backbone's reasoning steps when it was pretrained, and a warning when a fine-tuning
recipe joins them otherwise. The shipped logic backbones (AR and diffusion) were pretrained on documents
whose steps are joined by a space (``train.logic_text.STEP_SEPARATOR``) and record it in ``backbone.json``;
the trained methods join steps by a newline unless ``method.options.step_separator`` says otherwise. Both
trainers (``ar``, ``diffusion``) call :func:`separator_warning` before building the model."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from anchored_reasoning.types import Example


def backbone_step_separator(model_name: str) -> str | None:
    """What joined the reasoning steps of ``model_name``'s pretraining documents, as its ``backbone.json``
    records it (the shipped logic backbones: a space; ``train.logic_text.STEP_SEPARATOR``), or None where the
    model is not a local folder or its card does not say."""
    from anchored_reasoning.models.zoo import resolve_model

    card = Path(resolve_model(model_name)) / "backbone.json"
    if not card.is_file():
        return None
    try:
        value = json.loads(card.read_text()).get("step_separator")
    except (json.JSONDecodeError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def separator_warning(method, model_cfg: Mapping[str, Any], options: Mapping[str, Any],
                      examples: Sequence[Example], task: Any) -> str | None:
    """A warning when the recipe leaves the method's ``step_separator`` at its default, the fine-tuned backbone
    was pretrained on steps joined by another one, and that changes this run's targets (its first curriculum
    stage, on the first example with two steps): the targets then join steps in a layout the backbone never
    read. The default stays as it is so that every recorded command keeps its meaning; setting the option
    either way silences it."""
    if "step_separator" in options or not model_cfg.get("name") or not hasattr(method, "step_separator"):
        return None
    declared = backbone_step_separator(str(model_cfg["name"]))
    if declared is None or declared == method.step_separator:
        return None
    first = method.with_stage(0) if hasattr(method, "with_stage") else method
    example = next((ex for ex in examples[:200] if len(first.steps_of(ex)) >= 2), None)
    if example is None:
        return None
    if first.render(example, task).target == dataclasses.replace(first, step_separator=declared).render(example, task).target:
        return None
    return (f"model {model_cfg['name']!r} was pretrained on reasoning steps joined by {declared!r} (its "
            f"backbone.json); method {method.name!r} joins them by {method.step_separator!r}, its default: set "
            f"method.options.step_separator to {declared!r} to write steps as the backbone read them (or to "
            f"{method.step_separator!r} to keep this layout and silence this warning)")
