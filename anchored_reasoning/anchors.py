"""Anchor extraction: which tokens of a reasoning trace the ``[ANT]`` slots are trained to predict.

Anchored Chain-of-Thought (ADLM paper, section on AR models; ``shared/PAPERS.md`` section 2)
supervises each ``[ANT]`` slot with one *anchor*, an important token of the reasoning trace:

* GSM8K: the ordered numbers of the trace, operators and punctuation removed, each number
  once (``<<16-3-4=9>> <<9*2=18>>`` -> 16, 3, 4, 9, 2, 18).
* ProntoQA / ProsQA: the ordered "valid nodes" of the reasoning path -- entity and concept
  words, with "every", "is", "a", "not", ... removed and plurals made singular -- the first
  six (``Tom, terpus, brimpus, lempus``).
* Any other task with a trace: the per-sequence frequency rule of ADLM
  (:func:`frequency_anchors`): a token is an anchor when it occurs at most ``tau`` times.

An example without a trace (or whose trace holds no anchor) gets ``[]``, never an error:
the trainer then puts no anchor loss on it.

>>> from anchored_reasoning.types import Example
>>> ex = Example(id="0", question="...", answer="18", steps=["<<16-3-4=9>>", "<<9*2=18>>"])
>>> extract_anchors(ex, "gsm8k")
['16', '3', '4', '9', '2', '18']
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Hashable, Sequence, TypeVar

from anchored_reasoning.generators.logic_words import (  # noqa: F401 - re-exported: the anchors of logic traces
    LOGIC_STOPWORDS, dedupe as _dedupe, logic_nodes, logic_walk, singular,
)
from anchored_reasoning.types import Example

T = TypeVar("T", bound=Hashable)

# A number as written in a trace: optional sign glued to digits only when it cannot be an
# operator (start of text or after another operator / bracket), thousands commas, decimals.
_NUMBER = re.compile(r"(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_ANNOTATION = re.compile(r"<<([^<>]*)>>")


def _clean_number(text: str) -> str:
    return text.replace(",", "")


def numbers_in(text: str) -> list[str]:
    """The numbers of ``text`` in order, as written (thousands commas removed, signs and
    operators dropped): ``"16-3-4=9"`` -> ``["16", "3", "4", "9"]``."""
    return [_clean_number(m.group(0)) for m in _NUMBER.finditer(text)]


def gsm8k_anchors(steps: Sequence[str], max_anchors: int | None = None) -> list[str]:
    """Ordered distinct numbers of a GSM8K trace.

    Steps may be calculator annotations only (``"<<16-3-4=9>>"``, the augmented GSM8K of
    iCoT/Coconut) or the original prose with annotations (``"Janet sells 16 - 3 - 4 =
    <<16-3-4=9>>9 duck eggs"``). When a step carries annotations only their numbers count (the
    prose repeats them); a step without annotations contributes the numbers of its text.
    A final ``#### N`` line, if a loader left it in the steps, is ignored.
    """
    found: list[str] = []
    for step in steps:
        step = step.split("####", 1)[0]
        annotations = _ANNOTATION.findall(step)
        if annotations:
            for expr in annotations:
                found.extend(numbers_in(expr))
        else:
            found.extend(numbers_in(step))
    anchors = _dedupe(found)
    return anchors[:max_anchors] if max_anchors is not None else anchors


def logic_anchors(steps: Sequence[str], max_anchors: int | None = 6) -> list[str]:
    """The first ``max_anchors`` valid nodes of a ProntoQA/ProsQA reasoning path."""
    nodes = logic_nodes(steps)
    return nodes[:max_anchors] if max_anchors is not None else nodes


def frequency_anchors(tokens: Sequence[T], tau: int = 5) -> list[T]:
    """ADLM's per-sequence rule: the distinct tokens occurring at most ``tau`` times in
    ``tokens``, in order of first occurrence. ``tau`` must be >= 1."""
    return _dedupe(t for t, keep in zip(tokens, frequency_anchor_mask(tokens, tau)) if keep)


def frequency_anchor_mask(tokens: Sequence[T], tau: int = 5) -> list[bool]:
    """Per position: True when that position's token occurs at most ``tau`` times in ``tokens``
    (ADLM marks every such position as an anchor position).

    One rule for the whole library: this is the tensor rule of training,
    :func:`anchored_reasoning.objectives.frequency_anchor_mask`, applied to one row whose ids
    number the distinct tokens (any hashable tokens: words, ids)."""
    import torch

    from anchored_reasoning.objectives import frequency_anchor_mask as tensor_rule

    index: dict[T, int] = {}
    row = [index.setdefault(t, len(index)) for t in tokens]
    mask = tensor_rule(torch.tensor([row], dtype=torch.long).reshape(1, len(row)), tau)
    return [bool(x) for x in mask[0].tolist()]


def generic_anchors(steps: Sequence[str], max_anchors: int | None = None, tau: int = 5) -> list[str]:
    """Anchors for a task without its own extractor: the words and numbers of the trace kept
    by :func:`frequency_anchors` (case-folded counting, first spelling kept)."""
    words = re.findall(r"[A-Za-z]+|\d+(?:\.\d+)?", " ".join(steps))
    if not words:
        return []
    keep = set(frequency_anchors([w.lower() for w in words], tau=tau))
    out = _dedupe(w for w in words if w.lower() in keep)
    lowered = _dedupe(w.lower() for w in out)
    firsts = {w.lower(): w for w in reversed(out)}
    anchors = [firsts[w] for w in lowered]
    return anchors[:max_anchors] if max_anchors is not None else anchors


Extractor = Callable[[Example, "int | None"], list[str]]

# task name -> (extractor, default max anchors)
_EXTRACTORS: dict[str, tuple[Extractor, int | None]] = {}


def register_anchor_extractor(task_name: str, fn: Extractor, default_max: int | None = None) -> None:
    """Register ``fn(example, max_anchors) -> list[str]`` as the anchor extractor of ``task_name``."""
    _EXTRACTORS[task_name] = (fn, default_max)


def _task_name(task: object) -> str | None:
    if task is None or isinstance(task, str):
        return task
    return getattr(task, "name", None)


def _gsm8k_example_anchors(example: Example, max_anchors: int | None) -> list[str]:
    """GSM8K anchors from the calculator annotations the loader keeps in
    ``meta["calculations"]`` (one list per step) when there are any, else from the steps."""
    calcs = (example.meta or {}).get("calculations")
    if isinstance(calcs, list) and any(calcs):
        annotated = [" ".join(f"<<{c}>>" for c in step) if isinstance(step, list) else str(step) for step in calcs]
        steps = [a if a.strip() else s for a, s in zip(annotated, example.steps)] if len(calcs) == len(example.steps) else annotated
        return gsm8k_anchors(steps, max_anchors)
    return gsm8k_anchors(example.steps, max_anchors)


register_anchor_extractor("gsm8k", _gsm8k_example_anchors, None)
register_anchor_extractor("prontoqa", lambda ex, m: logic_anchors(ex.steps, m), 6)
register_anchor_extractor("prosqa", lambda ex, m: logic_anchors(ex.steps, m), 6)

_UNSET = object()


def extract_anchors(example: Example, task_name: object = None, max_anchors: "int | None | object" = _UNSET) -> list[str]:
    """The anchors of ``example`` for ``task_name`` (a name or a Task object), in order.

    ``max_anchors`` defaults to the task's own (6 for ProntoQA/ProsQA, all for GSM8K);
    pass ``None`` for all. Tasks without an extractor use the frequency rule on the trace.
    An example with no steps, or no anchor in its steps, gives ``[]``.
    """
    name = _task_name(task_name)
    steps = [s for s in (example.steps or []) if isinstance(s, str) and s.strip()]
    if not steps:
        return []
    fn, default_max = _EXTRACTORS.get(name or "", (None, None))
    limit = default_max if max_anchors is _UNSET else max_anchors
    if fn is None:
        return generic_anchors(steps, limit)  # type: ignore[arg-type]
    return fn(dataclasses.replace(example, steps=steps), limit)  # type: ignore[arg-type]
