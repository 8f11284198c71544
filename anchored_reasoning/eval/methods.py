"""Which method an evaluation prompts with: the registry's, or the one a checkpoint trained here learned.

A checkpoint trained by our trainers carries ``anchored_reasoning.json`` (method, options, style); it is
prompted in that trained format, and a method name it was not trained with is refused, both by
``anchored-reasoning eval --method`` and by :func:`~anchored_reasoning.eval.runner.run_eval`.

    build_method("cot")                   # instruct style, from the registry
    build_method(None, "runs/acot-ckpt")   # the format the checkpoint in that folder was trained in
    method_for_backend(None, backend)     # the same for the checkpoint ``backend`` serves
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from anchored_reasoning.checkpoints import CHECKPOINT_META, read_checkpoint_meta
from anchored_reasoning.errors import ConfigError

log = logging.getLogger(__name__)


def build_method(name: str | None, model_path: str | os.PathLike | None = None, **options: Any):
    """The method to evaluate with. A checkpoint trained by our trainer (``anchored_reasoning.json``
    in ``model_path``) gets its trained-style method and options; ``name``, when given, must then
    agree with it. Otherwise ``name`` is looked up in the method registry (instruct style)."""
    from anchored_reasoning.methods import get_method

    meta = read_checkpoint_meta(model_path)
    if meta is not None and meta.get("style", "trained") == "trained":
        trained = meta["method"]
        if name and name not in (trained, f"trained:{trained}"):
            raise ConfigError(
                f"checkpoint {model_path} was trained with method {trained!r} ({CHECKPOINT_META}); "
                f"--method {name!r} would prompt it in a format it never saw. Use --method {trained} or omit --method."
            )
        opts = {**(meta.get("method_options") or {}), **options}
        log.info("checkpoint %s: trained-style method %s %s", model_path, trained, opts)
        return get_method(trained, style="trained", **opts)
    if not name:
        raise ConfigError("no method given: pass --method (e.g. nocot or cot)")
    return get_method(name, **options)


def checkpoint_path(backend: Any, model: str | os.PathLike | None = None) -> str | None:
    """The local checkpoint directory ``backend`` serves, where there is one: its ``model_path``
    (hf, vllm, diffusion), else its model name when that is a directory (an openai backend talking to
    ``vllm serve /path/to/ckpt``), else ``model`` when that is a directory. None for a Hub id or a
    model held only in memory."""
    for candidate in (getattr(backend, "model_path", None), getattr(backend, "model", None), model):
        if isinstance(candidate, (str, os.PathLike)) and str(candidate) and Path(candidate).is_dir():
            return str(candidate)
    return None


def method_for_backend(name: str | None, backend: Any, model: str | os.PathLike | None = None, **options: Any):
    """:func:`build_method` for the checkpoint ``backend`` serves (:func:`checkpoint_path`): what
    ``anchored-reasoning eval --method NAME`` and ``run_eval(task, backend, "NAME")`` both prompt with.
    A checkpoint trained here gets the format it was trained in, or a ConfigError naming the fix."""
    return build_method(name, checkpoint_path(backend, model), **options)


def check_method_fits(method: Any, backend: Any) -> None:
    """Refuse an instruct-style method object for a checkpoint trained here: that checkpoint
    learned the trained format (``anchored_reasoning.json``) and never saw the task's instruct prompt."""
    path = checkpoint_path(backend)
    meta = read_checkpoint_meta(path)
    if meta is None or meta.get("style", "trained") != "trained" or getattr(method, "style", "instruct") != "instruct":
        return
    name = getattr(method, "name", type(method).__name__)
    raise ConfigError(
        f"checkpoint {path} was trained with method {meta['method']!r} ({CHECKPOINT_META}), but the method "
        f"object given is the instruct-style {name!r}, a prompt format it never saw. Pass the method by name "
        f"(run_eval(task, backend, {meta['method']!r}) or None) or build it with build_method(None, {str(path)!r})."
    )
