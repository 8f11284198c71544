"""Surface-rule baselines for ProntoQA True/False problems: can the answer be had without the proof?

ProntoQA's answer is True iff the conclusion's polarity ("Stella is floral." / "... is not floral.")
equals the query's. The queried property ends exactly two rules of the question: the proof's last rule
and a distractor with the opposite polarity. Each rule here picks one of them (or answers outright)
from the text alone, without following the entity's chain:

* ``always_false`` / ``always_true``; ``query_negated_means_false``;
* ``first_property_rule`` / ``last_property_rule``: the property rule stated first / last;
* ``positive_property_rule``: the one without "not";
* ``property_rule_of_a_recurring_concept``: the one whose concept is named elsewhere in the question.

The last one reads no chain, but on the published 5-hop split it is always right (train 9,000/9,000,
test 800/800; the generator here reproduces it): the distractor's concept is named only in its own
rule, every concept of the proof at least four times. So a model can answer the real test without
the 5-hop proof; 0.8 there is evidence of one look-up's worth of reading, not of multi-hop
reasoning (``research/ladder/trace_order.py`` shows the same from the proof's side).

    python -m anchored_reasoning.generators.prontoqa_shortcuts --file ../shared/data/prontoqa/test.json
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any, Callable, Iterable

from anchored_reasoning.generators.traces import prontoqa_rules

Rule = tuple[str, bool, str]


def parse(question: str) -> tuple[list[Rule], bool, list[Rule]]:
    """(all rules, whether the query has "not", the rules ending in the queried property)."""
    if "True or false:" not in question:
        raise ValueError(f"not a ProntoQA question (no 'True or false:'): {question[-80:]!r}")
    from anchored_reasoning.anchors import singular

    query = question.split("True or false:")[1].strip().rstrip(".")
    prop = singular(query.split()[-1]).lower()  # as prontoqa_rules writes a rule's object
    rules = prontoqa_rules(question)
    return rules, " not " in f" {query} ", [r for r in rules if r[2] == prop]


def _answer(rule: Rule, query_negated: bool) -> str:
    return "True" if rule[1] == query_negated else "False"


def _recurring(rules: list[Rule], negated: bool, with_prop: list[Rule]) -> str:
    named = Counter(w for s, _, o in rules for w in (s, o))
    return _answer(max(with_prop, key=lambda r: named[r[0]]), negated)


RULES: dict[str, Callable[[list[Rule], bool, list[Rule]], str]] = {
    "always_false": lambda rules, neg, wp: "False",
    "always_true": lambda rules, neg, wp: "True",
    "query_negated_means_false": lambda rules, neg, wp: "False" if neg else "True",
    "first_property_rule": lambda rules, neg, wp: _answer(wp[0], neg),
    "last_property_rule": lambda rules, neg, wp: _answer(wp[-1], neg),
    "positive_property_rule": lambda rules, neg, wp: _answer(next((r for r in wp if not r[1]), wp[0]), neg),
    "property_rule_of_a_recurring_concept": _recurring,
}


def rule_scores(problems: Iterable[tuple[str, str]]) -> dict[str, float]:
    """Accuracy of every rule over ``(question, answer)`` pairs. A problem whose property ends no rule
    scores 0.5 for the rules that need one (a coin flip)."""
    totals: Counter = Counter()
    n = 0
    for question, answer in problems:
        rules, negated, with_prop = parse(question)
        n += 1
        for name, fn in RULES.items():
            if not with_prop and name not in ("always_false", "always_true", "query_negated_means_false"):
                totals[name] += 0.5
            else:
                totals[name] += fn(rules, negated, with_prop) == answer
    if not n:
        raise ValueError("no problems to score")
    return {name: round(totals[name] / n, 4) for name in RULES}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--file", help="a ProntoQA JSON file (Coconut format)")
    src.add_argument("--generated", type=int, metavar="N", help="N problems from generators/prontoqa.py")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hops", type=int, default=5, help="with --generated")
    p.add_argument("--mirror-distractor", action="store_true", help="with --generated: the shortcut-free construction")
    args = p.parse_args(argv)
    if args.file:
        with open(args.file) as f:
            rows: list[dict[str, Any]] = json.load(f)
        problems = [(r["question"], r["answer"]) for r in rows]
    else:
        from anchored_reasoning.generators.prontoqa import generate_dataset

        problems = [(e.question, e.answer) for e in generate_dataset(
            args.generated, seed=args.seed, hops=args.hops, mirror_distractor=args.mirror_distractor)]
    print(json.dumps({"n": len(problems), "scores": rule_scores(problems)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
