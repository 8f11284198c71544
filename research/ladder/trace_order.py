"""How many choices a proof makes forward (entity -> goal) and backward (goal -> entity), per task.

    ANCHORED_REASONING_DATA=../shared/data python -m research.ladder.trace_order

A forward CoT step picks one of the rules leaving the current concept; only the one that leads to the
goal is right, so every step with more than one is a choice that needs look-ahead. A backward step picks
one of the rules *ending* in the current concept. This counts, along each gold proof:

* ProntoQA (real train and test, and the generator at its default size): forward, the entity's concepts
  and each chain concept's super-concepts; backward, the rules ending in the queried property (either
  polarity) and then the rules ending in each chain concept; and how far a backward walk from a wrong
  first rule can go (0: it stops at once, so one look-up rejects it).
* ProsQA (real test; the gold proof's path in the graph): out-degree (forward) and in-degree (backward)
  of the path's nodes; and under ``walks`` (real test, and the generator at its default size), the
  chance that a random walk finds the way forward (entity -> answer) and backward (answer -> entity),
  the reason for ``trace: options_backward``.

``--records ORDER RECORDS`` (repeatable) also reads a ProntoQA CoT model's evaluation records on the
real test against the gold proof in that order (``chain_report``): exact proofs, gold sentence by
position, the first wrong sentence (a rule of the question, or made up), and whether the answer
follows a gold conclusion. Writes ``research/ladder/results/trace_order.json``. No model is involved: this is a property of the data,
the reason ``generators/traces.py`` offers ``trace: backward`` for ProntoQA.
"""
from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any, Iterable

from anchored_reasoning.generators.prontoqa import PROPERTY_FAMILIES
from benchmarks.common import chain_report


PROPERTY_WORDS = {w for family in PROPERTY_FAMILIES for w in family}


def prontoqa_choices(example) -> dict[str, Any]:
    """Choice counts along one ProntoQA proof (see the module doc)."""
    from anchored_reasoning.generators.prontoqa_shortcuts import parse
    from anchored_reasoning.generators.traces import prontoqa_backward, prontoqa_rules

    rules, _, with_property = parse(example.question)  # the rules ending in the queried property
    into: dict[str, set[str]] = collections.defaultdict(set)
    concepts_of: dict[str, set[str]] = collections.defaultdict(set)  # super-concepts (not properties)
    for subject, _, obj in rules:
        into[obj].add(subject)
        if obj not in PROPERTY_WORDS:
            concepts_of[subject].add(obj)
    backward = prontoqa_backward(example.steps)
    chain = [r[0] for r in prontoqa_rules(" ".join(backward[:-1]))]  # subjects: last concept ... entity
    property_heads = {r[0] for r in with_property}
    if chain[0] not in property_heads:
        raise ValueError(f"{example.id}: the proof's last rule does not end in the queried property")
    entity = chain[-1]
    forward = [len(concepts_of[entity])] + [len(concepts_of[c]) for c in reversed(chain[:-1])][:-1]
    back = [len(with_property)] + [len(into[c]) for c in chain[:-1]]
    wrong_depths = []
    for subject in property_heads - {chain[0]}:
        depth, frontier = 0, {subject}
        while True:
            frontier = set().union(*(into[c] for c in frontier))
            if not frontier or depth > 10:
                break
            depth += 1
        wrong_depths.append(depth)
    return {"forward": forward, "backward": back, "wrong_first_rule_depths": wrong_depths}


def prosqa_choices(example) -> dict[str, Any]:
    """Out-degree (forward) and in-degree (backward) along the example's gold proof (its ``steps``, the
    path CoT is trained to write): the entity, then each step's object."""
    from anchored_reasoning.eval.probes import derivation_steps, prosqa_children, prosqa_row_of

    row = prosqa_row_of(example)
    children = prosqa_children(example)
    parents: dict[str, set[str]] = collections.defaultdict(set)
    for a, bs in children.items():
        for b in bs:
            parents[b].add(a)
    path = [row["idx_to_symbol"][row["root"]]] + [b for _, b in derivation_steps(" ".join(example.steps))]
    missing = [(a, b) for a, b in zip(path, path[1:]) if b not in children.get(a, ())]
    if missing or path[-1] != row["idx_to_symbol"][row["target"]]:
        raise ValueError(f"{example.id}: gold steps are not a path root -> target in the graph ({missing})")
    return {"forward": [len(children.get(x, ())) for x in path[:-1]], "backward": [len(parents[x]) for x in path[1:]]}


def prosqa_walks(example) -> dict[str, Any]:
    """Search forward vs backward on a ProsQA graph, exactly (no sampling): the probability that a walk
    from the entity taking a uniformly random child at each node reaches the answer (``forward``), that one
    from the answer taking a random parent reaches the entity (``backward``), and whether any wrong turn
    exists backward at all (a parent of a node of some entity -> answer path that is on no such path)."""
    from functools import lru_cache

    from anchored_reasoning.eval.probes import prosqa_row_of

    row = prosqa_row_of(example)
    children: dict[int, list[int]] = collections.defaultdict(list)
    parents: dict[int, list[int]] = collections.defaultdict(list)
    for a, b in row["edges"]:
        children[a].append(b)
        parents[b].append(a)
    root, target = row["root"], row["target"]

    @lru_cache(maxsize=None)
    def fwd(x: int) -> float:
        return 1.0 if x == target else sum(map(fwd, children[x])) / len(children[x]) if children[x] else 0.0

    @lru_cache(maxsize=None)
    def back(x: int) -> float:
        return 1.0 if x == root else sum(map(back, parents[x])) / len(parents[x]) if parents[x] else 0.0

    on_path = {x for x in range(len(row["idx_to_symbol"])) if fwd(x) > 0 and back(x) > 0}
    wrong_back = sum(p not in on_path for x in on_path - {root} for p in parents[x])
    return {"forward": fwd(root), "backward": back(target), "backward_wrong_turns": wrong_back}


def walks_summary(examples) -> dict[str, Any]:
    rows = [prosqa_walks(ex) for ex in examples]
    n = len(rows)
    return {"n": n, "random_forward_walk_reaches_answer": round(sum(r["forward"] for r in rows) / n, 4),
            "random_backward_walk_reaches_entity": round(sum(r["backward"] for r in rows) / n, 4),
            "problems_without_a_wrong_turn_backward": round(sum(r["backward_wrong_turns"] == 0 for r in rows) / n, 4)}


def summarize(rows: Iterable[dict[str, Any]], skip_first_backward: bool) -> dict[str, Any]:
    """Share of proofs with no choice after the first backward step, and the choice-count histograms."""
    rows = list(rows)
    fwd = collections.Counter(c for r in rows for c in r["forward"])
    bwd = collections.Counter(c for r in rows for c in r["backward"])
    start = 1 if skip_first_backward else 0
    out = {
        "n": len(rows),
        "forward_choice_counts": dict(sorted(fwd.items())),
        "backward_choice_counts": dict(sorted(bwd.items())),
        "forward_steps_with_one_option": round(fwd[1] / max(1, sum(fwd.values())), 3),
        "backward_steps_with_one_option": round(bwd[1] / max(1, sum(bwd.values())), 3),
        "proofs_forward_without_choice": sum(all(c == 1 for c in r["forward"]) for r in rows),
        "proofs_backward_without_choice" + ("_after_first" if skip_first_backward else ""):
            sum(all(c == 1 for c in r["backward"][start:]) for r in rows),
    }
    if skip_first_backward:
        depths = collections.Counter(d for r in rows for d in r["wrong_first_rule_depths"])
        out["first_backward_choice_counts"] = dict(sorted(collections.Counter(r["backward"][0] for r in rows).items()))
        out["wrong_first_rule_backward_depths"] = dict(sorted(depths.items()))
    return out


def paired_cot(a_json: str, b_json: str, task: str = "prontoqa", method: str = "cot") -> dict[str, Any]:
    """``method``'s per-problem accuracy in two acot_vs_cot.py JSONs, A - B on the problems both scored."""
    from anchored_reasoning.eval.compare import mcnemar_exact
    from anchored_reasoning.eval.metrics import paired_bootstrap_diff

    a, b = (json.loads(Path(p).read_text())[task][method]["per_problem"] for p in (a_json, b_json))
    ids = sorted(set(a) & set(b))
    diff = paired_bootstrap_diff([a[i] for i in ids], [b[i] for i in ids])
    only_a = sum(a[i] > b[i] for i in ids)
    only_b = sum(b[i] > a[i] for i in ids)
    return {"a": a_json, "b": b_json, "task": task, "method": method, "n": len(ids),
            "a_accuracy": round(sum(a[i] for i in ids) / len(ids), 4), "b_accuracy": round(sum(b[i] for i in ids) / len(ids), 4),
            "diff": round(diff["diff"], 4), "ci95": [round(diff["ci_low"], 4), round(diff["ci_high"], 4)],
            "only_a_right": only_a, "only_b_right": only_b, "mcnemar_p": round(mcnemar_exact(only_a, only_b), 4)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--generated-n", type=int, default=1000, help="generated ProntoQA problems at the default size")
    p.add_argument("--records", nargs=2, action="append", metavar=("ORDER", "RECORDS_JSONL"), default=[],
                   help="also read a ProntoQA CoT model's eval records (real test) against the gold proof in ORDER")
    p.add_argument("--paired", nargs=2, metavar=("A_JSON", "B_JSON"), default=None,
                   help="two acot_vs_cot.py JSONs: ProntoQA CoT of A minus B, per problem (bootstrap + McNemar)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "trace_order.json"))
    args = p.parse_args(argv)
    from anchored_reasoning.generators.prontoqa import generate_dataset
    from anchored_reasoning.generators.prosqa import generate_dataset as prosqa_dataset
    from anchored_reasoning.tasks import get_task

    pronto, prosqa = get_task("prontoqa"), get_task("prosqa")
    chains = {}
    for order, path in args.records:
        records = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        chains[f"{order}: {path}"] = chain_report(pronto.load("test"), records, order)
    result: dict[str, Any] = {
        "prontoqa": {
            "test": summarize(map(prontoqa_choices, pronto.load("test")), True),
            "train": summarize(map(prontoqa_choices, pronto.load("train")), True),
            "generated": summarize(map(prontoqa_choices, generate_dataset(args.generated_n, seed=0)), True),
        },
        "prosqa": {"test": summarize(map(prosqa_choices, prosqa.load("test")), False),
                   "walks": {"test": walks_summary(prosqa.load("test")),
                             "generated": walks_summary(prosqa_dataset(args.generated_n, seed=0))}},
        **({"chains": chains} if chains else {}),
        **({"paired": paired_cot(*args.paired)} if args.paired else {}),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m research.ladder.trace_order " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
