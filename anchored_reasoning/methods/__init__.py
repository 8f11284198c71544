"""Methods: how an Example becomes a prompt (evaluation) and a training target (fine-tuning).

Two styles share the registry:

* ``instruct`` -- zero-shot prompting of an off-the-shelf (instruct) model with the task's
  prompt templates (``prompts.<method>`` in the task YAML), e.g. ``nocot`` and ``cot``; and
  ``completion``, the bare prompt continued by a base model (HumanEval).
* ``trained``  -- the plain-text format our fine-tuned checkpoints learn
  (question, optional ``[BoA] [ANT]*k [EoA]`` / pause slots, ``[BoR] steps [EoR]``, answer).
  Training and evaluation both call :meth:`Method.render`, so they never disagree.

A checkpoint written by ``anchored-reasoning train`` carries ``anchored_reasoning.json``
(method name and options); the runner reads it and renders prompts in the trained style.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from anchored_reasoning.errors import ConfigError


@dataclass
class Rendered:
    """An example rendered for training in the ``trained`` style.

    ``prompt`` is everything the model is given (no LM loss on it), ``target`` what it must
    generate (LM loss). ``anchors`` are the anchor strings, in order, that the ``[ANT]`` slots
    inside ``prompt`` are trained to predict (empty for methods without anchor supervision):
    anchor ``i`` takes the ``tokens_per_anchor`` slots from ``i * tokens_per_anchor`` on.
    ``prompt + target`` is the full training text.
    """

    prompt: str
    target: str
    anchors: list[str] = field(default_factory=list)
    tokens_per_anchor: int = 1

# name -> "module:Class"; classes take **options (e.g. k=6 anchor slots).
_METHODS: dict[str, str] = {
    "nocot": "anchored_reasoning.methods.prompting:NoCoT",
    "cot": "anchored_reasoning.methods.prompting:CoT",
    "completion": "anchored_reasoning.methods.prompting:Completion",
}


def register_method(name: str, target: str) -> None:
    _METHODS[name] = target


def list_methods() -> list[str]:
    _load_optional()
    return sorted(_METHODS)


def get_method(name: str, style: str = "instruct", **options: Any):
    """Build method ``name``. ``style="trained"`` picks the fine-tuned format (registered as
    ``trained:<name>``, e.g. ``trained:cot``) where one exists; ``"instruct"`` the prompting one."""
    _load_optional()
    if style not in ("instruct", "trained"):
        raise ConfigError(f"unknown method style {style!r} for method {name!r}; use 'instruct' or 'trained'")
    key = f"trained:{name}" if style == "trained" and f"trained:{name}" in _METHODS else name
    try:
        target = _METHODS[key]
    except KeyError:
        raise ConfigError(f"unknown method {name!r}; known: {', '.join(sorted(_METHODS))}") from None
    module_name, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    try:
        return cls(**options)
    except TypeError as exc:  # an unknown or missing option: name it
        raise ConfigError(f"method {name!r} ({style}): bad options {sorted(options)}: {exc}") from None


def _load_optional() -> None:
    """Import modules that register more methods (the anchored training formats)."""
    import importlib.util

    if importlib.util.find_spec("anchored_reasoning.methods.anchored") is not None:
        importlib.import_module("anchored_reasoning.methods.anchored")
