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
from typing import Any

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.methods.base import Rendered

__all__ = ["Rendered", "get_method", "list_methods", "register_method"]


# name -> "module:Class"; classes take **options (e.g. k=6 anchor slots).
# Trained formats are registered as ``trained:<name>``; pause, acot, stepwise and anchor_chain are trained-only,
# so their plain names point at the same class.
_ANCHORED = "anchored_reasoning.methods.anchored"
_METHODS: dict[str, str] = {
    "nocot": "anchored_reasoning.methods.prompting:NoCoT",
    "cot": "anchored_reasoning.methods.prompting:CoT",
    "completion": "anchored_reasoning.methods.prompting:Completion",
    "trained:nocot": f"{_ANCHORED}:TrainedNoCoT",
    "trained:cot": f"{_ANCHORED}:TrainedCoT",
    **{f"{prefix}{name}": f"{_ANCHORED}:{cls}" for name, cls in (("pause", "Pause"), ("acot", "ACoT"), ("stepwise", "Stepwise"))
       for prefix in ("", "trained:")},
    "anchor_chain": "anchored_reasoning.methods.anchor_chain:AnchorChain",
    "trained:anchor_chain": "anchored_reasoning.methods.anchor_chain:AnchorChain",
    **{f"{prefix}coconut": "anchored_reasoning.methods.coconut:Coconut" for prefix in ("", "trained:")},
}


def register_method(name: str, target: str) -> None:
    """Register a method class as ``"package.module:Class"`` under ``name`` (``trained:<name>`` for a trained
    format); :func:`get_method` imports it on first use."""
    _METHODS[name] = target


def list_methods() -> list[str]:
    """The registered method names (``trained:<name>`` for a trained-style format), for :func:`get_method`."""
    return sorted(_METHODS)


def get_method(name: str, style: str = "instruct", **options: Any):
    """Build method ``name``. ``style="trained"`` picks the fine-tuned format (registered as
    ``trained:<name>``, e.g. ``trained:cot``) where one exists; ``"instruct"`` the prompting one."""
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
