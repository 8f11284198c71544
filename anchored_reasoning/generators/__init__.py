"""Generators for training data that cannot be downloaded: ProsQA (Coconut's DAG construction)
and ProntoQA-style problems. Both are seeded and produce the same ``Example`` objects (and the
same JSON files) as the published data, so a generated file can stand in for a split.

>>> from anchored_reasoning.generators import generate_dataset
>>> train = generate_dataset("prosqa", 1000, seed=0)                  # list[Example]
>>> small = generate_dataset("prosqa", 200, seed=1, num_nodes=12, min_hops=2)
>>> logic = generate_dataset("prontoqa", 1000, seed=0, hops=5)
>>> dfs = generate("prosqa", 512, seed=0, trace="dfs", num_nodes=12)  # the proofs as a depth-first search

``generate`` is the one-call entry (``anchored_reasoning.generate``): problems, then their proofs
rewritten in a trace order (:func:`anchored_reasoning.generators.traces.apply_trace`).

Command line: ``python -m anchored_reasoning.generators prosqa --n 17886 --seed 0 --out DIR/prosqa/train.json``.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.types import Example

GENERATORS = {
    "prosqa": "anchored_reasoning.generators.prosqa",
    "prontoqa": "anchored_reasoning.generators.prontoqa",
}
#: Each generator's size dataclass (in its module): its fields are the size options ``generate`` accepts.
_SIZE_CONFIGS = {"prosqa": "ProsQAConfig", "prontoqa": "ProntoQAConfig"}


def _module(task: str):
    try:
        return importlib.import_module(GENERATORS[task])
    except KeyError:
        raise ConfigError(f"no generator for task {task!r}; available: {', '.join(sorted(GENERATORS))}") from None


def generate_rows(task: str, n: int, seed: int = 0, **size: Any) -> list[dict[str, Any]]:
    """``n`` problems of ``task`` as rows in the published JSON format."""
    return _module(task).generate_rows(n, seed, **size)


def generate_dataset(task: str, n: int, seed: int = 0, split: str = "generated", **size: Any) -> list[Example]:
    """``n`` generated Examples of ``task`` ("prosqa" or "prontoqa"), deterministic in ``seed``.
    ``size`` are the generator's size options (ProsQA: num_nodes, min_hops, ...; ProntoQA: hops)."""
    return _module(task).generate_dataset(n, seed, split=split, **size)


def generate(name: str, n: int, seed: int = 0, trace: str | None = None, **params: Any) -> list[Example]:
    """``n`` generated Examples of task ``name`` ("prosqa" or "prontoqa"), deterministic in ``seed``,
    with their proofs written in ``trace`` order (None or "forward": as generated; "dfs", "backward", ...:
    :data:`~anchored_reasoning.generators.traces.TRACE_ORDERS`). ``params`` are the generator's size
    options (ProsQA: num_nodes, min_hops, max_hops, neg_depth, ...; ProntoQA: hops) and ``split``. An
    unknown task, trace or option fails before any problem is generated."""
    from anchored_reasoning.generators.traces import apply_trace, check_trace

    import dataclasses

    known = {f.name for f in dataclasses.fields(getattr(_module(name), _SIZE_CONFIGS[name]))} | {"split"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ConfigError(f"generate({name!r}): unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    check_trace(name, trace)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"generate({name!r}, n={n!r}): n must be a positive int (the number of problems)")
    return apply_trace(generate_dataset(name, n, seed, **params), name, trace)


def write_json(task: str, path: str | Path, n: int, seed: int = 0, **size: Any) -> Path:
    """Write ``n`` generated problems to ``path`` in the published format; returns the path."""
    return _module(task).write_json(path, n, seed, **size)
