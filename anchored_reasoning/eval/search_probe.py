"""A written depth-first search (the ``dfs`` and ``dfs_paths`` ProsQA traces, or the search's walk as a chain
of nodes, ``walk``: the ``anchor_chain`` method with ``revisits``) replayed against the problem.

``replay(example, completion)`` walks the model's steps from the asked entity the way the trace's search
would (``generators.traces.prosqa_dfs``): a step down must be a fact of the question from the current
concept to a concept not yet visited, a step back (``Back to <parent>.``, the path line without its last
node, or in a walk the parent's name) must leave a concept with no unvisited child for its parent. The first
step that breaks a rule is named, so a wrong answer can be put down to where the search went wrong:

- ``made_up``: a step down along no fact of the question (or from a concept that is not the current one);
- ``revisit``: a step down to a concept already visited;
- ``backed_up_early``: a step back from a concept with a child not yet visited;
- ``wrong_parent``: a step back to a concept that is not the current one's parent on the path;
- ``unparsed``: a sentence that is neither step (or a path line that neither extends nor shortens the path);
- ``ran_on``: steps after the search reached an option;
- ``stopped_short``: no rule broken, but the search ended before reaching an option;
- ``none``: the search reached an option by legal steps (it can only be the answer: the wrong option is
  not reachable from the asked entity).

A legal step down to an unvisited child other than the first in the question's order is counted
(``out_of_order``) but is not an error: the search stays a search.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Sequence

from anchored_reasoning.generators.traces import BACK_UP
from anchored_reasoning.types import Example

_DOWN = re.compile(r"(?:Every )?(\w+) is a (\w+)\.")
ERRORS = ("made_up", "revisit", "backed_up_early", "wrong_parent", "unparsed", "ran_on", "stopped_short")
#: how the search is written: the ``dfs`` trace's sentences, the ``dfs_paths`` trace's path lines, or the
#: walk's nodes separated by spaces (``Rex rempus impus rempus lempus``)
FORMS = ("dfs", "dfs_paths", "walk")


def _moves(sentences: Sequence[str], stack: list[str], form: str):
    """Yields ("down", parent, child), ("back", to) or ("unparsed", text) per sentence (per node of a walk);
    ``stack`` is read, not changed, so path lines are compared with the path as the replay leaves it."""
    for sent in sentences:
        if form == "walk":  # a node: back when it names the parent, otherwise a step down to it
            yield ("back", sent) if len(stack) > 1 and sent == stack[-2] else ("down", stack[-1], sent)
            continue
        if form == "dfs_paths":
            nodes = sent[:-1].split()
            if nodes[:-1] == stack and len(nodes) == len(stack) + 1:
                yield "down", stack[-1], nodes[-1]
            elif nodes == stack[:-1] and nodes:
                yield "back", nodes[-1]
            else:
                yield "unparsed", sent
            continue
        down, back = _DOWN.fullmatch(sent), BACK_UP.fullmatch(sent)
        if down:
            yield "down", down.group(1), down.group(2)
        elif back:
            yield "back", back.group(1)
        else:
            yield "unparsed", sent


def replay(example: Example, completion: str, form: str = "dfs") -> dict[str, Any]:
    """The model's search for one ProsQA problem (module doc), written in ``form`` (:data:`FORMS`): steps
    written, legal steps, the first error, the concept the search ended at, steps out of the question's
    order, and whether it equals the trace."""
    from anchored_reasoning.anchors import logic_walk
    from anchored_reasoning.eval.probes import derivation_text
    from anchored_reasoning.generators.traces import proof_sentences, prosqa_dfs, question_order_children

    if form not in FORMS:
        raise ValueError(f"search form must be one of {FORMS}, got {form!r}")
    children = question_order_children(example)
    entity, options = example.meta["entity"], (example.meta["answer_concept"], example.meta["neg_concept"])
    if form == "walk":
        sentences = [w.strip(".,") for w in derivation_text(completion).split()]
        sentences = sentences[1:] if sentences[:1] == [entity] else sentences  # the walk starts at the entity
        gold = logic_walk(prosqa_dfs(example))[1:]
    else:
        sentences = proof_sentences(derivation_text(completion))
        gold = prosqa_dfs(example, paths=form == "dfs_paths")
    stack, seen = [entity], {entity}
    legal, out_of_order, error = 0, 0, None
    for move in _moves(sentences, stack, form):
        if stack[-1] in options:
            error = "ran_on"
            break
        unvisited = [c for c in children.get(stack[-1], ()) if c not in seen]
        if move[0] == "down":
            _, parent, child = move
            if parent != stack[-1] or child not in children.get(parent, ()):
                error = "made_up"
            elif child in seen:
                error = "revisit"
            else:
                out_of_order += child != unvisited[0]
                stack.append(child)
                seen.add(child)
        elif move[0] == "back":
            if unvisited:
                error = "backed_up_early"
            elif len(stack) < 2 or move[1] != stack[-2]:
                error = "wrong_parent"
            else:
                stack.pop()
        else:
            error = "unparsed"
        if error:
            break
        legal += 1
    if error is None:
        error = "none" if stack[-1] in options else "stopped_short"
    return {"steps": len(sentences), "legal_steps": legal, "first_error": error, "ended_at": stack[-1],
            "out_of_order": out_of_order, "exact": sentences == gold}


def search_summary(records: Iterable[dict[str, Any]], examples: Sequence[Example], form: str = "dfs") -> dict[str, Any]:
    """Replays every first-sample record of ``examples`` (by id): how many searches were exact, reached the
    answer by legal steps, the first errors, and whether the answer follows the search (where it reached
    an option, the extracted answer names it)."""
    by_id = {ex.id: ex for ex in examples}
    out: dict[str, Any] = {"n": 0, "exact": 0, "reached_answer": 0, "answer_follows_search": 0,
                           "right_when_search_reached": 0, "right_otherwise": 0, "otherwise": 0,
                           "out_of_order_steps": 0, "steps": 0, "legal_steps": 0,
                           "first_error": {e: 0 for e in ("none", *ERRORS)}}
    for rec in records:
        ex = by_id.get(rec.get("id"))
        if ex is None or rec.get("sample", 0):
            continue
        r = replay(ex, rec.get("completion") or "", form)
        out["n"] += 1
        out["exact"] += r["exact"]
        out["steps"] += r["steps"]
        out["legal_steps"] += r["legal_steps"]
        out["out_of_order_steps"] += r["out_of_order"]
        out["first_error"][r["first_error"]] += 1
        if r["first_error"] == "none":
            out["reached_answer"] += 1
            out["right_when_search_reached"] += bool(rec.get("correct"))
            out["answer_follows_search"] += rec.get("extracted") == r["ended_at"]
        else:
            out["otherwise"] += 1
            out["right_otherwise"] += bool(rec.get("correct"))
    return out
