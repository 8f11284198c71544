"""Trace orders: the same proof written in another order, for training CoT-family methods.

A ProntoQA proof as published walks *forward* from the entity::

    Stella is a zumpus. Zumpuses are gorpuses. | Stella is a gorpus. Gorpuses are rompuses. | ...
    | Stella is a lorpus. Every lorpus is floral. | Stella is floral.

Every concept on that walk has two super-concepts in the question (the next one and a side branch)
and the entity has two concepts, so each forward step is a choice that only a look-ahead to the
queried property can make. Read *backward* from the property, the same rules need no look-ahead
(backward chaining, as in LAMBADA, Kazemi et al. 2023)::

    Every lorpus is floral. | Each yumpus is a lorpus. | ... | Zumpuses are gorpuses. | Stella is a zumpus.
    | Stella is floral.

In the 9,000 training and 800 test problems of the real 5-hop split, the queried property ends exactly
two rules (the chain's and a distractor's with its opposite), the distractor's concept has no
sub-concept, and every concept on the chain has exactly one (``benchmarks/trace_order.py`` counts
this): after the first rule, each backward step is a lookup of the one rule that ends in the previous
step's subject. The backward trace keeps the proof's sentences verbatim (each rule as the question
states it) and ends with the same conclusion, so the answer line and grading are unchanged.

``apply_trace(examples, task, order)`` is what recipes call (``data.train.trace: backward``).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Sequence

from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.types import Example

TRACE_ORDERS = ("forward", "backward")

_SENTENCE = re.compile(r"[^.]+\.")


def proof_sentences(step: str) -> list[str]:
    """The sentences of a proof step or question, each ending in its period."""
    return [s.strip() for s in _SENTENCE.findall(step)]


def prontoqa_backward(steps: Sequence[str]) -> list[str]:
    """A forward ProntoQA proof (``"E is a X. <rule>."`` per step, then the conclusion) read backward.

    Returns the rules last-to-first, then the entity's membership fact, then the conclusion. A step
    that is not exactly two sentences, or a proof with no rule, raises :class:`DataError` naming it.
    """
    steps = [s.strip() for s in steps]
    if len(steps) < 2:
        raise DataError(f"a ProntoQA proof needs at least one rule step and a conclusion, got {len(steps)} step(s)")
    rules, first_fact = [], None
    for i, step in enumerate(steps[:-1]):
        parts = proof_sentences(step)
        if len(parts) != 2:
            raise DataError(f"ProntoQA proof step {i} is not '<entity fact>. <rule>.': {step[:80]!r}")
        if first_fact is None:
            first_fact = parts[0]
        rules.append(parts[1])
    return [*reversed(rules), first_fact, steps[-1]]


_RULE = re.compile(r"^(?:(?:Every|Each) (\w+) is|(\w+) (is|are)) (?:an? )?(not )?(\w+)\.$")


def prontoqa_rules(question: str) -> list[tuple[str, bool, str]]:
    """The facts and rules stated in a ProntoQA question as ``(subject, negated, object)``.

    Concepts are singular and lower-case, an entity keeps its name (``("Stella", False, "zumpus")``:
    "<Name> is ..." is about an entity, "Every/Each X is", "Xs are" about a concept); the ``True or
    false:`` query is not a rule, and sentences of other shapes are skipped.
    """
    from anchored_reasoning.anchors import singular

    out = []
    for sentence in proof_sentences(question.split("True or false:")[0]):
        m = _RULE.match(sentence)
        if m:
            entity = m.group(3) == "is"
            subject = m.group(2) if entity else singular(m.group(1) or m.group(2)).lower()
            out.append((subject, bool(m.group(4)), singular(m.group(5)).lower()))
    return out


_BACKWARD: dict[str, Callable[[Sequence[str]], list[str]]] = {"prontoqa": prontoqa_backward}


def check_trace(task: str | None, order: str | None) -> str:
    """The order to use ("forward" for None); :class:`ConfigError` for an unknown order or a task without it."""
    order = order or "forward"
    if order not in TRACE_ORDERS:
        raise ConfigError(f"trace must be one of {', '.join(TRACE_ORDERS)}, got {order!r}")
    if order == "backward" and (task or "") not in _BACKWARD:
        raise ConfigError(f"trace {order!r} is defined for {', '.join(sorted(_BACKWARD))}, not for task {task!r}")
    return order


def apply_trace(examples: Sequence[Example], task: str | None, order: str | None) -> list[Example]:
    """``examples`` with their proofs in ``order`` ("forward": as given; "backward": see the module doc).

    The order is recorded in each example's ``meta["trace"]``. An order a task has no rule for raises
    :class:`ConfigError` before any example is touched.
    """
    if check_trace(task, order) == "forward":
        return list(examples)
    fn = _BACKWARD[task]
    out = []
    for ex in examples:
        try:
            steps = fn(ex.steps)
        except DataError as exc:
            raise DataError(f"example {ex.id}: {exc}") from None
        out.append(dataclasses.replace(ex, steps=steps, meta={**ex.meta, "trace": order}))
    return out
