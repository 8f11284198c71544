"""Break a reasoning accuracy down: by answer depth (hops) and under the ProsQA binding probe.

Plain accuracy can rank methods wrongly while the data has a surface shortcut (CALIBRATION.md:
No-CoT 0.85 above CoT 0.72, while only CoT read the question). Two views make a number
explainable:

* **by hops** -- accuracy per shortest entity -> answer distance, so a method that solves
  1-hop problems and guesses on 3-hop ones shows as such;
* **the binding probe** -- every problem asked again about the *other* seed entity (same facts,
  same options, the right answer flips, :func:`anchored_reasoning.generators.prosqa.swapped_row`).
  A model that reads the asked entity changes its answer; one that answers from the graph's shape
  does not. ``flip_rate`` is the share of problems whose extracted answer differs between the
  two prompts; ``both_right`` the share answered right both times (a coin scores 0.25).

* **the chain check** -- every sentence of a generated ProsQA derivation read back against the
  problem's graph: is each step a fact of the problem (else the model made one up: the *lookup*
  failed), does each step start where the last one ended, and does the chain end at the answer
  (real, connected steps that end elsewhere went down the wrong branch: the *search* failed).

>>> swapped = binding_probe_examples(held_out)                 # list[Example], ids "<id>~swap"
>>> summary = probe_summary(records, swapped_records)          # from two runner record lists
>>> chains = chain_summary(records, held_out, hops)            # lookup vs search failures per depth

ProntoQA's counterpart of the binding probe negates the query instead
(:func:`prontoqa_polarity_examples`; the same :func:`probe_summary` reads it).
"""
from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from typing import Any, Iterable, Sequence

from anchored_reasoning.eval.metrics import mean_ci
from anchored_reasoning.generators.traces import STEP
from anchored_reasoning.types import Example

SWAP_SUFFIX = "~swap"


def prosqa_row_of(example: Example) -> dict[str, Any]:
    """The published-format row behind a ProsQA Example (the loader keeps the graph in ``meta``)."""
    meta = example.meta
    try:
        return {
            "question": example.question, "answer": example.answer, "steps": list(example.steps),
            "idx_to_symbol": meta["idx_to_symbol"], "edges": meta["edges"], "root": meta["root"],
            "target": meta["target"], "neg_target": meta["neg_target"],
        }
    except KeyError as exc:
        raise ValueError(f"example {example.id!r} is not a ProsQA example with its graph in meta (missing {exc})") from None


def hops_of(example: Example) -> int:
    from anchored_reasoning.generators.prosqa import hops_of as row_hops

    return row_hops(prosqa_row_of(example))


def binding_probe_examples(examples: Sequence[Example]) -> list[Example]:
    """Each problem asked about the other seed entity (answer flipped); problems without a
    well-defined swap (possible only in hand-made data) are left out and logged by the caller."""
    from anchored_reasoning.generators.prosqa import rows_to_examples, swapped_row

    out: list[Example] = []
    for ex in examples:
        row = swapped_row(prosqa_row_of(ex))
        if row is None:
            continue
        (swapped,) = rows_to_examples([row], split="probe")
        swapped.id = ex.id + SWAP_SUFFIX
        out.append(swapped)
    return out


def _by_id(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in records if r.get("sample", 0) == 0}


def _per_hop(items: Sequence[tuple[dict[str, Any], Any]], hops: dict[str, int], figures) -> dict[str, Any]:
    """``figures`` of the items grouped by the hops of their first element's record id (sorted, keys as strings)."""
    per: dict[int, list] = defaultdict(list)
    for item in items:
        if item[0]["id"] in hops:
            per[hops[item[0]["id"]]].append(item)
    return {str(h): figures(sel) for h, sel in sorted(per.items())}


def accuracy_by(records: Iterable[dict[str, Any]], key_of: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``{key: mean_ci}`` of ``correct`` grouped by ``key_of[record id]`` (keys as strings, sorted)."""
    groups: dict[Any, list[float]] = defaultdict(list)
    for rid, rec in _by_id(records).items():
        if rid in key_of:
            groups[key_of[rid]].append(float(bool(rec.get("correct"))))
    return {str(k): mean_ci(v) for k, v in sorted(groups.items())}


def probe_summary(records: Sequence[dict[str, Any]], swapped_records: Sequence[dict[str, Any]],
                  hops: dict[str, int] | None = None) -> dict[str, Any]:
    """Binding-probe figures from the runner records of the original and the swapped problems:
    ``swap_accuracy``, ``flip_rate``, ``both_right`` (each a mean_ci), and per hop when ``hops``
    (id -> hops of the original problem) is given."""
    orig, swap = _by_id(records), _by_id(swapped_records)
    pairs = [(orig[i], swap[i + SWAP_SUFFIX]) for i in orig if i + SWAP_SUFFIX in swap]
    if not pairs:
        raise ValueError("no problem has both an original and a swapped record")

    def figures(sel):
        return {
            "swap_accuracy": mean_ci([float(bool(s.get("correct"))) for _, s in sel]),
            "flip_rate": mean_ci([float(o.get("extracted") is not None and s.get("extracted") is not None
                                        and o.get("extracted") != s.get("extracted")) for o, s in sel]),
            "both_right": mean_ci([float(bool(o.get("correct")) and bool(s.get("correct"))) for o, s in sel]),
        }

    out = figures(pairs)
    if hops:
        out["by_hops"] = _per_hop(pairs, hops, figures)
    return out


_QUERY = re.compile(r"^(?P<head>.*True or false: \S+ is )(?P<not>not )?(?P<prop>[^.]+)\.$", re.S)


def prontoqa_polarity_examples(examples: Sequence[Example]) -> list[Example]:
    """Each ProntoQA problem with its query negated or un-negated ("True or false: Sally is sour." <->
    "... is not sour."), the answer flipped, ids ``<id>~swap`` for :func:`probe_summary`. The facts and the
    proof are unchanged, so a model that compares its conclusion with the query flips its answer; one that
    answers from the facts alone does not. Raises on a question without such a query."""
    out = []
    for ex in examples:
        m = _QUERY.match((ex.question or "").strip())
        if m is None or ex.answer not in ("True", "False"):
            raise ValueError(f"{ex.id}: not a ProntoQA True/False question ending 'True or false: X is [not] P.'")
        question = m["head"] + ("" if m["not"] else "not ") + m["prop"] + "."
        out.append(dataclasses.replace(ex, id=ex.id + SWAP_SUFFIX, question=question,
                                       answer="False" if ex.answer == "True" else "True"))
    return out


#: what :func:`chain_check` calls a derivation: right, a step made up, a wrong branch, no step at all
CHAIN_KINDS = ("ok", "lookup", "search", "none")


_CHAIN = re.compile(r"^[A-Za-z]+(?:\s+[A-Za-z]+)+$")


def derivation_text(completion: str) -> str:
    """The derivation part of a completion: the text before ``[EoR]`` / ``[EoA]`` / ``###`` (the answer that
    follows is not a step)."""
    return (completion or "").split("[EoR]")[0].split("[EoA]")[0].split("###")[0]


def derivation_steps(text: str) -> list[tuple[str, str]]:
    """(subject, object) of every "X is a Y." / "Every X is a Y." sentence of a derivation (:func:`derivation_text`).
    A derivation written as a bare chain of nodes (the ``anchor_chain`` method: ``Tom terpus lempus``) gives its
    consecutive pairs."""
    text = derivation_text(text)
    steps = [m.groups() for m in (STEP.fullmatch(s.strip()) for s in re.split(r"(?<=\.)\s+|\n", text)) if m]
    words = text.split()
    if not steps and _CHAIN.match(text.strip()) and not {"is", "a", "an", "Every"} & set(words):
        steps = list(zip(words, words[1:]))
    return steps


def prosqa_children(example: Example) -> dict[str, set[str]]:
    """The graph of a ProsQA example by name: node -> the nodes its facts say it is."""
    row = prosqa_row_of(example)
    symbols = row["idx_to_symbol"]
    children: dict[str, set[str]] = defaultdict(set)
    for a, b in row["edges"]:
        children[symbols[a]].add(symbols[b])
    return dict(children)


def reaches(children: dict[str, set[str]], start: str, target: str) -> bool:
    """Whether ``target`` is ``start`` or lies below it in the graph."""
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == target:
            return True
        if node not in seen:
            seen.add(node)
            todo.extend(children.get(node, ()))
    return False


#: Where a derivation first leaves the right track (:func:`chain_check`'s ``first_error``).
FIRST_ERRORS = ("none", "disconnected", "made_up", "wrong_branch", "stopped_short", "overshot")


def chain_check(example: Example, completion: str) -> dict[str, Any]:
    """Read the derivation in ``completion`` (the sentences before ``[EoR]`` / ``###``) against the
    graph of ProsQA ``example``: ``steps`` parsed, ``unreal`` steps that are not facts of the problem,
    ``connected`` (first step from the asked entity, each next one from the last one's object),
    ``ends_at_answer``, and ``kind``: ``none`` (no step), ``lookup`` (a step made up), ``search``
    (real steps that do not chain from the entity to the answer) or ``ok``. ``first_error`` reads the steps
    in order and names the first that leaves the right track (:data:`FIRST_ERRORS`; None for a right walk):
    ``none`` (no step), ``disconnected`` (a step not from the last one's object), ``made_up`` (a step that
    is not a fact, taken from a concept the answer is still below: a failed lookup), ``wrong_branch`` (a
    real step to a concept the answer is not below: a dead end or the other option follows, so the made-up
    steps that often come after a dead end count here, not as lookups), or ``stopped_short`` (every step
    right, ending above the answer), or ``overshot`` (it reached the answer and walked on);
    ``error_step`` is its 1-based position."""
    row = prosqa_row_of(example)
    symbols = row["idx_to_symbol"]
    children = prosqa_children(example)
    steps = derivation_steps(completion)
    unreal = sum(b not in children.get(a, ()) for a, b in steps)
    here, connected = symbols[row["root"]], True
    for a, b in steps:
        connected = connected and a == here
        here = b
    answer = symbols[row["target"]]
    ends = bool(steps) and steps[-1][1] == answer
    kind = "none" if not steps else "lookup" if unreal else "ok" if connected and ends else "search"
    here, first_error, error_step = symbols[row["root"]], None, None
    for i, (a, b) in enumerate(steps, 1):
        first_error = ("disconnected" if a != here else "overshot" if here == answer
                       else "made_up" if b not in children.get(a, ())
                       else "wrong_branch" if not reaches(children, b, answer) else None)
        if first_error:
            error_step = i
            break
        here = b
    else:
        first_error = "none" if not steps else None if here == answer else "stopped_short"
        error_step = len(steps) if first_error == "stopped_short" else None
    return {"steps": len(steps), "unreal": unreal, "connected": connected and bool(steps),
            "ends_at_answer": ends, "kind": kind, "first_error": first_error, "error_step": error_step}


def chain_summary(records: Iterable[dict[str, Any]], examples: Sequence[Example],
                  hops: dict[str, int] | None = None) -> dict[str, Any]:
    """Shares of :func:`chain_check` kinds over the records (first sample of each problem), overall
    and per hop; ``wrong_by_kind`` counts the kinds among wrongly answered problems only."""
    by_id = {ex.id: ex for ex in examples}
    checked = [(rec, chain_check(by_id[rid], rec.get("completion") or ""))
               for rid, rec in _by_id(records).items() if rid in by_id]

    def figures(sel):
        wrong = [c["kind"] for r, c in sel if not r.get("correct")]
        errors = [c["first_error"] for _, c in sel if c["first_error"]]
        return {"n": len(sel), **{k: sum(c["kind"] == k for _, c in sel) / len(sel) for k in CHAIN_KINDS},
                "wrong_by_kind": {k: wrong.count(k) for k in CHAIN_KINDS},
                "first_errors": {k: errors.count(k) for k in FIRST_ERRORS}}

    out = figures(checked) if checked else {"n": 0}
    if hops and checked:
        out["by_hops"] = _per_hop(checked, hops, figures)
    return out
