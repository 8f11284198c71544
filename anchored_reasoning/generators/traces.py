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
sub-concept, and every concept on the chain has exactly one (``research/ladder/trace_order.py`` counts
this): after the first rule, each backward step is a lookup of the one rule that ends in the previous
step's subject. The backward trace keeps the proof's sentences verbatim (each rule as the question
states it) and ends with the same conclusion, so the answer line and grading are unchanged.

A ProsQA problem asks which of two options the entity is. Forward from the entity every concept has
several children and only a look-ahead to the options picks the right one (a random forward walk from
the entity reaches the answer 16% of the time on the real test); *backward* from an option almost every
walk reaches an entity (a random walk over parents reaches the asked entity from the answer 96% of the
time; `research/ladder/trace_order.py`), and the two options' ancestors lead to different entities. ``options_backward`` writes, for each
option in the question's order, the walk back from it to the entity it comes from, each step a fact of
the question verbatim and each walk headed by its option::

    hilpus: Every lorpus is a hilpus. | Bob is a lorpus. | sterpus: Every rempus is a sterpus. |
    Every scrompus is a rempus. | Sally is a scrompus.

The answer is then the option whose walk ends at the asked entity; the answer line is unchanged. The
anchors of this trace (``anchors.logic_nodes``) are the walks' nodes in order, so ``anchor_chain``
writes ``hilpus lorpus Bob sterpus rempus scrompus Sally``.

``dfs`` needs no look-ahead and no reverse look-up: a depth-first search *forward* from the asked entity,
each concept's children taken in the order the question states their facts, that stops at the first option
it reaches (in ProsQA only the answer is reachable from the asked entity). Going down is a fact of the
question verbatim (the forward look-up the logic backbone was pretrained on); at a concept with no
unvisited child the search backs up one level, written ``Back to <parent>.``::

    Sally is a scrompus. | Every scrompus is a lempus. | Back to scrompus. | Every scrompus is a rempus. |
    Every rempus is a sterpus.

``dfs_paths`` is the same search with the stack written out: each step is the path from the entity to the
current concept (``Sally scrompus lempus.``, then ``Sally scrompus.`` when it backs up), so backing up is a
copy of the previous line without its last node instead of a look-up of the parent. On the real test the
search takes 11.3 steps on average (at most 32), 3.5 of them back-ups; the gold proof has 3.8 steps.

``apply_trace(examples, task, order)`` is what recipes call (``data.train.trace: backward``).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Sequence

from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.generators.logic_words import BACK_UP, BACK_WORD, STEP, logic_nodes, singular  # noqa: F401 - BACK_UP, STEP re-exported
from anchored_reasoning.types import Example

TRACE_ORDERS = ("forward", "backward", "options_backward", "dfs", "dfs_paths")
#: The one-token back-up of a walk (``mark_backups`` with ``backup_marker: token``): an added token glued to
#: the node the walk backs up from (``Rex rempus impus[Back] rempus lempus``), so it costs one token a back-up
#: on any tokenizer (the space before an added token would be a token of its own).
BACK_TOKEN = "[Back]"
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
    out = []
    for sentence in proof_sentences(question.split("True or false:")[0]):
        m = _RULE.match(sentence)
        if m:
            entity = m.group(3) == "is"
            subject = m.group(2) if entity else singular(m.group(1) or m.group(2)).lower()
            out.append((subject, bool(m.group(4)), singular(m.group(5)).lower()))
    return out


def _fact(symbols: Sequence[str], a: int, b: int) -> str:
    return f"{symbols[a]} is a {symbols[b]}." if symbols[a][:1].isupper() else f"Every {symbols[a]} is a {symbols[b]}."


def _graph(example: Example) -> tuple[Sequence[str], list, int, int, int]:
    """A ProsQA example's graph from its meta: symbols, edges, the asked entity, the answer, the wrong option."""
    meta = example.meta
    try:
        return meta["idx_to_symbol"], meta["edges"], meta["root"], meta["target"], meta["neg_target"]
    except KeyError as exc:
        raise DataError(f"not a ProsQA example with its graph in meta (missing {exc})") from None


def prosqa_options_backward(example: Example) -> list[str]:
    """For each option of a ProsQA example (the question's order), the walk from it back to the entity
    it comes from: ``"<option>: <fact ending in the option>"``, then the facts up to the entity's own.
    The answer's walk is the gold proof reversed; the other option's is a shortest path from the entity
    that reaches it. A problem whose wrong option no entity reaches raises :class:`DataError`."""
    from anchored_reasoning.generators.prosqa import shortest_path

    symbols, edges, root, target, neg = _graph(example)
    children: dict[int, list[int]] = {}
    for a, b in sorted(map(tuple, edges)):
        children.setdefault(a, []).append(b)
    index = {name: i for i, name in enumerate(symbols)}
    gold = [index[n] for n in logic_nodes(example.steps)]
    if gold[0] != root or gold[-1] != target:
        raise DataError(f"the gold proof does not walk from {symbols[root]} to {symbols[target]}")
    walks = {target: gold}
    entities = [i for i, name in enumerate(symbols) if name[:1].isupper() and i != root]
    found = [p for p in (shortest_path(children, e, neg) for e in entities) if p]
    if not found:
        raise DataError(f"no entity reaches the wrong option {symbols[neg]}")
    walks[neg] = min(found, key=len)
    question = example.question.rsplit("?", 1)[0]
    order = sorted((target, neg), key=lambda i: question.rfind(" " + symbols[i]))
    steps = []
    for option in order:
        back = walks[option][::-1]
        facts = [_fact(symbols, b, a) for a, b in zip(back, back[1:])]
        steps += [f"{symbols[option]}: {facts[0]}", *facts[1:]]
    return steps


def question_order_children(example: Example) -> dict[str, list[str]]:
    """Each concept's (and entity's) children in a ProsQA example, in the order the question states their
    facts (a fact the question does not state goes last): the order ``dfs`` searches in."""
    symbols, edges, _, _, _ = _graph(example)
    question = example.question
    children: dict[int, list[int]] = {}
    for a, b in map(tuple, edges):
        children.setdefault(a, []).append(b)
    for a, kids in children.items():
        kids.sort(key=lambda b: (question.find(_fact(symbols, a, b)) % (len(question) + 1), b))
    return {symbols[a]: [symbols[b] for b in kids] for a, kids in children.items()}


def prosqa_dfs(example: Example, paths: bool = False) -> list[str]:
    """The depth-first search from the asked entity to the first option it reaches (module doc): facts and
    ``Back to <parent>.`` steps, or with ``paths`` the path to the current concept at every step. Children
    are taken in the order the question states their facts. :class:`DataError` when the search reaches the
    wrong option or no option."""
    symbols, _, root, target, neg = _graph(example)
    children = question_order_children(example)
    options = (symbols[target], symbols[neg])
    seen, stack, steps = {symbols[root]}, [symbols[root]], []
    while stack:
        node = stack[-1]
        if node in options:
            if node != options[0]:
                raise DataError(f"the search from {symbols[root]} reaches the wrong option {node}")
            return steps
        nxt = next((c for c in children.get(node, ()) if c not in seen), None)
        if nxt is not None:
            seen.add(nxt)
            stack.append(nxt)
            steps.append(" ".join(stack) + "." if paths else
                         f"{node} is a {nxt}." if node[:1].isupper() else f"Every {node} is a {nxt}.")
        else:
            stack.pop()
            if stack:
                steps.append(" ".join(stack) + "." if paths else back_up(stack[-1]))
    raise DataError(f"no option is reachable from {symbols[root]}")


def back_up(parent: str) -> str:
    """The ``dfs`` step that backs up to ``parent`` (matched by :data:`BACK_UP`)."""
    return f"Back to {parent}."


#: Each order other than "forward", by (task, order): the new steps from the whole example.
_ORDERS: dict[tuple[str, str], Callable[[Example], list[str]]] = {
    ("prontoqa", "backward"): lambda ex: prontoqa_backward(ex.steps),
    ("prosqa", "options_backward"): prosqa_options_backward,
    ("prosqa", "dfs"): prosqa_dfs,
    ("prosqa", "dfs_paths"): lambda ex: prosqa_dfs(ex, paths=True),
}


def check_trace(task: str | None, order: str | None) -> str:
    """The order to use ("forward" for None); :class:`ConfigError` for an unknown order or a task without it."""
    order = order or "forward"
    if order not in TRACE_ORDERS:
        raise ConfigError(f"trace must be one of {', '.join(TRACE_ORDERS)}, got {order!r}")
    if order != "forward" and ((task or ""), order) not in _ORDERS:
        tasks = sorted(t for t, o in _ORDERS if o == order)
        raise ConfigError(f"trace {order!r} is defined for {', '.join(tasks)}, not for task {task!r}")
    return order


def apply_trace(examples: Sequence[Example], task: str | None, order: str | None) -> list[Example]:
    """``examples`` with their proofs in ``order`` ("forward": as given; "backward": see the module doc).

    The order is recorded in each example's ``meta["trace"]``. An order a task has no rule for raises
    :class:`ConfigError` before any example is touched.
    """
    order = check_trace(task, order)
    if order == "forward":
        return list(examples)
    fn = _ORDERS[(task or "", order)]
    out = []
    for ex in examples:
        try:
            steps = fn(ex)
        except DataError as exc:
            raise DataError(f"example {ex.id}: {exc}") from None
        out.append(dataclasses.replace(ex, steps=steps, meta={**ex.meta, "trace": order}))
    return out
