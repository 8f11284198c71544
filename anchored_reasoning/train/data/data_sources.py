"""A recipe's ``data.train`` / ``data.valid`` section turned into Examples.

A section is one source -- generated problems ``{generator, n, seed, params}`` or a task split
``{split, limit, data_dir, holdout}`` -- or a ``mix`` of sources, concatenated in order::

    data:
      train:
        mix:                                  # 1,800 shortcut-free problems at each depth ...
          - {generator: prontoqa, n: 1800, seed: 100, params: {hops: 2, mirror_distractor: true}}
          - {generator: prontoqa, n: 1800, seed: 100, params: {hops: 5, mirror_distractor: true}}
          - {generator: prontoqa, n: 1800, seed: 101, params: {hops: 5}, exclude_split: test}
      valid: {split: test}                    # ... plus the published construction; graded on the real test

Any section or source may add ``trace: backward`` (generators/traces.py: the proofs read from the goal
back; on a mix it applies to every source) and ``exclude_split: NAME``, which drops every example whose question is also one of the task's
split NAME (generated training data that must not contain a test question). Generated sources of a mix
get ids ``gen-<part><i>-<k>``, so ids stay unique across sources; two sources that yield the same id
(the same split twice) are refused. A generated source may set ``name: PREFIX`` for ids ``PREFIX-<k>``
instead: ids are part of a run's data fingerprint (train/checkpointing.py), so a run started on data
named one way resumes only on data named the same way.
"""
from __future__ import annotations

import functools
import importlib
from pathlib import Path
from typing import Any, Mapping

from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.types import Example


def generate_examples(
    name: str, n: int, seed: int, params: Mapping[str, Any] | None = None, split: str = "generated"
) -> list[Example]:
    """``n`` examples from the generator ``anchored_reasoning.generators.<name>`` (seeded; ids ``<split>-<i>``)."""
    try:
        module = importlib.import_module(f"anchored_reasoning.generators.{name}")
    except ModuleNotFoundError:
        raise ConfigError(f"unknown data generator {name!r} (anchored_reasoning.generators.{name} not found)") from None
    fn = getattr(module, "generate_dataset", None)
    if fn is None:
        raise ConfigError(f"anchored_reasoning.generators.{name} has no generate_dataset() function")
    try:
        out = fn(int(n), seed=int(seed), split=split, **dict(params or {}))
    except TypeError as exc:
        raise ConfigError(f"generator {name!r}: bad params {sorted(params or {})}: {exc}") from None
    return list(out)


def load_split(
    spec: Mapping[str, Any] | None, task_name: str | None, default_seed: int, part: str = "train"
) -> list[Example]:
    """Examples for one ``data.<part>`` section (module docstring): a source, or a ``mix`` of sources."""
    if not spec:
        return []
    if spec.get("mix") is not None:
        from anchored_reasoning.generators.traces import apply_trace, check_trace

        trace = check_trace(task_name, spec.get("trace"))  # a mix-level trace applies to every source
        if spec.get("trace") and any(isinstance(s, Mapping) and s.get("trace") for s in spec["mix"]):
            raise ConfigError(f"data.{part}: a trace on the mix and on its sources too; give it in one place")
        examples = apply_trace(_load_mix(spec, task_name, default_seed, part), task_name, trace)
    else:
        examples = _load_source(spec, task_name, default_seed, part, part)
    return _exclude(examples, spec, task_name, f"data.{part}")


def _load_mix(spec: Mapping[str, Any], task_name: str | None, default_seed: int, part: str) -> list[Example]:
    sources = spec["mix"]
    if not isinstance(sources, list) or not sources:
        raise ConfigError(f"data.{part}.mix must be a non-empty list of data sources, got {sources!r}")
    stray = sorted(k for k, v in spec.items() if k not in ("mix", "exclude_split", "trace") and v is not None)
    if stray:
        raise ConfigError(f"data.{part}: with 'mix', {', '.join(stray)} belong inside its sources")
    out: list[Example] = []
    for i, source in enumerate(sources):
        where = f"data.{part}.mix[{i}]"
        if not isinstance(source, Mapping):
            raise ConfigError(f"{where} must be a mapping (a generator or split section), got {source!r}")
        if source.get("mix") is not None:
            raise ConfigError(f"{where}: a mix cannot contain another mix")
        examples = _exclude(_load_source(source, task_name, default_seed, part, f"{part}{i}"), source, task_name, where)
        if not examples:
            raise DataError(f"{where} produced no examples")
        out += examples
    seen: set[str] = set()
    for ex in out:
        if ex.id in seen:
            raise DataError(f"data.{part}.mix: example id {ex.id!r} comes from two sources (the same split twice?)")
        seen.add(ex.id)
    return out


def _load_source(
    spec: Mapping[str, Any], task_name: str | None, default_seed: int, part: str, tag: str
) -> list[Example]:
    from anchored_reasoning.generators.traces import apply_trace, check_trace

    trace = check_trace(task_name or spec.get("generator"), spec.get("trace"))  # a bad value fails before data work
    name = spec.get("name")
    if name is not None and (not spec.get("generator") or not isinstance(name, str) or not name.strip()
                             or name != name.strip() or " " in name):
        raise ConfigError(f"data.{part}: 'name' is the id prefix of a generated source, a word without spaces; "
                          f"got {name!r}" + ("" if spec.get("generator") else " on a source with no generator"))
    if spec.get("generator"):
        examples = generate_examples(
            spec["generator"], spec.get("n", 1000), spec.get("seed", default_seed), spec.get("params"),
            split=name or f"gen-{tag}",
        )
        return apply_trace(examples, task_name or spec["generator"], trace)
    if spec.get("split"):
        if not task_name:
            raise ConfigError("data.*.split needs a top-level 'task' in the recipe")
        from anchored_reasoning.tasks import get_task

        holdout = int(spec.get("holdout") or 0)
        limit = None if holdout else spec.get("limit")  # a holdout is cut from the whole split
        examples = list(get_task(task_name).load(spec["split"], data_dir=spec.get("data_dir"), limit=limit))
        if holdout:
            if not 0 < holdout < len(examples):
                raise ConfigError(f"data.{part}.holdout={holdout} must be between 1 and the split's {len(examples) - 1}")
            examples = examples[-holdout:] if part == "valid" else examples[:-holdout]
            examples = examples[: spec["limit"]] if spec.get("limit") else examples
        return apply_trace(examples, task_name, trace)
    raise ConfigError("each data section needs 'generator' (with n) or 'split'")


def _exclude(examples: list[Example], spec: Mapping[str, Any], task_name: str | None, where: str) -> list[Example]:
    """``exclude_split: NAME``: drop the examples whose question is one of the task's split NAME."""
    name = spec.get("exclude_split")
    if not name:
        return examples
    if not task_name:
        raise ConfigError(f"{where}.exclude_split needs a top-level 'task' in the recipe")
    from anchored_reasoning.resources import data_dir

    held = _split_questions(task_name, str(name), data_dir(spec.get("data_dir")))  # the folder, resolved: the key
    return [e for e in examples if e.question not in held]


@functools.lru_cache(maxsize=8)
def _split_questions(task_name: str, split: str, folder: Path | None) -> frozenset[str]:
    """The questions of a task's split, read once per process and folder (a mix excludes the same split per
    source)."""
    from anchored_reasoning.tasks import get_task

    return frozenset(e.question for e in get_task(task_name).load(split, data_dir=folder))
