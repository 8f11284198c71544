"""A written depth-first search (the ``dfs`` and ``dfs_paths`` ProsQA traces, or the search's walk as a chain
of nodes, ``walk``: the ``anchor_chain`` method with ``revisits``) replayed against the problem.

``replay(example, completion)`` walks the model's steps from the asked entity the way the trace's search
would (``generators.traces.prosqa_dfs``): a step down must be a fact of the question from the current
concept to a concept not yet visited, a step back (``Back to <parent>.``, the path line without its last
node, or in a walk the parent's name, marked ``Back <parent>`` or not) must leave a concept with no unvisited
child for its parent. The first step that breaks a rule is named, so a wrong answer can be put down to where
the search went wrong:

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

Where the first error falls is kept too: ``after``, the move before it (``start``, ``down`` or ``back``), and
per such context the moves the search made from it (``moves_after``), so ``search_summary`` gives the rate
at which a move breaks a rule right after a step down and right after a back-up (``hazard``). A step down
that breaks a rule is told apart further (``detail``): ``made_up`` to a child of another visited concept, to
a concept elsewhere in the question, or to no concept of the question; ``revisit`` to the concept the search
just backed up from or to another visited one.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

from anchored_reasoning.generators.traces import BACK_TOKEN, BACK_UP, BACK_WORD, STEP
from anchored_reasoning.types import Example

ERRORS = ("made_up", "revisit", "backed_up_early", "wrong_parent", "unparsed", "ran_on", "stopped_short")
#: the move before a move: the first one, after a step down, after a back-up
CONTEXTS = ("start", "down", "back")
#: how the search is written: the ``dfs`` trace's sentences, the ``dfs_paths`` trace's path lines, or the
#: walk's nodes separated by spaces (``Rex rempus impus rempus lempus``)
FORMS = ("dfs", "dfs_paths", "walk")


def _moves(sentences: Sequence[str], stack: list[str], form: str, marker: str = BACK_WORD):
    """Yields ("down", parent, child), ("back", to) or ("unparsed", text) per sentence (per node of a walk);
    ``stack`` is read, not changed, so path lines are compared with the path as the replay leaves it."""
    for sent in sentences:
        if form == "walk":  # a node: back when marked (``Back <node>``) or when it names the parent, else down
            marked = sent.startswith(marker + " ")
            node = sent[len(marker) + 1:] if marked else sent
            yield ("back", node) if marked or (len(stack) > 1 and node == stack[-2]) else ("down", stack[-1], node)
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
        down, back = STEP.fullmatch(sent), BACK_UP.fullmatch(sent)
        if down:
            yield "down", down.group(1), down.group(2)
        elif back:
            yield "back", back.group(1)
        else:
            yield "unparsed", sent


def replay(example: Example, completion: str, form: str = "dfs", marker: str = BACK_WORD) -> dict[str, Any]:
    """The model's search for one ProsQA problem (module doc), written in ``form`` (:data:`FORMS`): steps
    written, legal steps, the first error, the concept the search ended at, steps out of the question's
    order, and whether it equals the trace. ``marker``: the word a walk marks its back-ups with (the
    ``anchor_chain`` option ``backup_word``)."""
    from anchored_reasoning.anchors import logic_walk
    from anchored_reasoning.eval.probes import derivation_text
    from anchored_reasoning.generators.traces import proof_sentences, prosqa_dfs, question_order_children

    if form not in FORMS:
        raise ValueError(f"search form must be one of {FORMS}, got {form!r}")
    children = question_order_children(example)
    entity, options = example.meta["entity"], (example.meta["answer_concept"], example.meta["neg_concept"])
    if form == "walk":
        sentences = _walk_nodes(derivation_text(completion), marker)
        sentences = sentences[1:] if sentences[:1] == [entity] else sentences  # the walk starts at the entity
        gold = logic_walk(prosqa_dfs(example))[1:]
    else:
        sentences = proof_sentences(derivation_text(completion))
        gold = prosqa_dfs(example, paths=form == "dfs_paths")
    stack, seen = [entity], {entity}
    legal, out_of_order, error, detail = 0, 0, None, None
    after, left = "start", None  # the move before this one; the concept the last back-up left
    moves_after = dict.fromkeys(CONTEXTS, 0)
    for move in _moves(sentences, stack, form, marker):
        if stack[-1] in options:
            error = "ran_on"
            break
        moves_after[after] += 1
        unvisited = [c for c in children.get(stack[-1], ()) if c not in seen]
        if move[0] == "down":
            _, parent, child = move
            if parent != stack[-1] or child not in children.get(parent, ()):
                error, detail = "made_up", _where(child, seen, children)
            elif child in seen:
                error, detail = "revisit", "just_left" if child == left and after == "back" else "visited"
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
                left = stack.pop()
        else:
            error = "unparsed"
        if error:
            break
        legal += 1
        after = move[0]  # a move that broke no rule is a step down or a back-up
    if error is None:
        error, after = ("none" if stack[-1] in options else "stopped_short"), None
    elif error == "ran_on":
        after = None
    return {"steps": len(sentences), "legal_steps": legal, "first_error": error, "ended_at": stack[-1],
            "out_of_order": out_of_order, "after": after, "detail": detail,
            "exact": (sentences if form != "walk" else [w.split()[-1] for w in sentences]) == gold,
            "moves_after": moves_after}


def detail_key(r: dict[str, Any]) -> str:
    """A wrong step down of a :func:`replay`, as counted in ``search_summary``'s ``detail``:
    ``<error>:<where>:after_<context>``."""
    return f"{r['first_error']}:{r['detail']}:after_{r['after']}"


def _walk_nodes(text: str, marker: str = BACK_WORD) -> list[str]:
    """A walk's nodes, a marked back-up kept as one (``Back rempus``), whether written with the word
    (``impus Back rempus``; ``marker``: the run's word) or the token glued to the node before
    (``impus[Back] rempus``, kept as ``<marker> rempus``). Another word than ``marker`` is a node."""
    out: list[str] = []
    back = False
    for word in text.replace(BACK_TOKEN, f" {BACK_TOKEN} ").split():
        word = word.strip(".,")
        if word == BACK_TOKEN:
            back = True
        elif out and out[-1] == marker:
            out[-1] = f"{marker} {word}"
        elif word:
            out.append(f"{marker} {word}" if back else word)
            back = False
    return out


def _where(node: str, seen: set[str], children: dict[str, list[str]]) -> str:
    """Where a made-up step went: a child of a visited concept (a fact of the question, from the wrong
    concept), a concept of the question reached from none of them, or no concept of the question."""
    if any(node in children.get(v, ()) for v in seen):
        return "child_of_visited"
    known = set(children) | {c for kids in children.values() for c in kids}
    return "elsewhere_in_question" if node in known else "not_in_question"


def search_summary(records: Iterable[dict[str, Any]], examples: Sequence[Example], form: str = "dfs",
                   marker: str = BACK_WORD) -> dict[str, Any]:
    """Replays every first-sample record of ``examples`` (by id): how many searches were exact, reached the
    answer by legal steps, the first errors, and whether the answer follows the search (where it reached
    an option, the extracted answer names it). ``hazard``: per context (the move before), the moves made
    from it, how many of them broke a rule first, and their ratio; ``detail``: the wrong steps down as
    ``<error>:<where>:after_<context>`` counts (module doc)."""
    by_id = {ex.id: ex for ex in examples}
    out: dict[str, Any] = {"n": 0, "exact": 0, "reached_answer": 0, "answer_follows_search": 0,
                           "right_when_search_reached": 0, "right_otherwise": 0, "otherwise": 0,
                           "out_of_order_steps": 0, "steps": 0, "legal_steps": 0,
                           "first_error": {e: 0 for e in ("none", *ERRORS)},
                           "hazard": {c: {"moves": 0, "errors": 0} for c in CONTEXTS}, "detail": {}}
    for rec in records:
        ex = by_id.get(rec.get("id"))
        if ex is None or rec.get("sample", 0):
            continue
        r = replay(ex, rec.get("completion") or "", form, marker)
        out["n"] += 1
        out["exact"] += r["exact"]
        out["steps"] += r["steps"]
        out["legal_steps"] += r["legal_steps"]
        out["out_of_order_steps"] += r["out_of_order"]
        out["first_error"][r["first_error"]] += 1
        for context, moves in r["moves_after"].items():
            out["hazard"][context]["moves"] += moves
        if r["after"] is not None:  # a rule broken (not running on past an option, not stopping short)
            out["hazard"][r["after"]]["errors"] += 1
        if r["detail"]:
            out["detail"][detail_key(r)] = out["detail"].get(detail_key(r), 0) + 1
        if r["first_error"] == "none":
            out["reached_answer"] += 1
            out["right_when_search_reached"] += bool(rec.get("correct"))
            out["answer_follows_search"] += rec.get("extracted") == r["ended_at"]
        else:
            out["otherwise"] += 1
            out["right_otherwise"] += bool(rec.get("correct"))
    for h in out["hazard"].values():
        h["rate"] = round(h["errors"] / h["moves"], 4) if h["moves"] else None
    return out
