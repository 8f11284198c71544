"""Surface-rule baselines for two-option ProsQA problems: can the answer be had without reasoning?

Each rule reads only the text of a problem (the facts and the two options) and picks an option
without following the asked entity's chain. A generator size whose problems let any rule score
well above 0.5 measures how fast a model finds that rule, not whether it reasons: the first
version of the demo's problems (7 nodes, 1-2 hops, the wrong option at any depth) let "the option
that is not a direct child of an entity" score 0.73-0.79, and fine-tuned models rode it to ~0.9 on
2-hop problems. The generator draws the wrong option as deep as the answer by default at every
size but Coconut's published one (:class:`~anchored_reasoning.generators.prosqa.ProsQAConfig`).

    python -m anchored_reasoning.generators.shortcuts --hops 3          # a ladder size
    python -m anchored_reasoning.generators.shortcuts --size '{"num_nodes": 7, "min_hops": 1, "max_hops": 2}'
    python -m anchored_reasoning.generators.shortcuts --file ../shared/data/prosqa/test.json

A rule that cannot decide (both options alike under it) scores 0.5 on that problem, the
expected score of a coin flip, so every rule's chance level is 0.5.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any, Callable, Iterable

_QUESTION = re.compile(r"Is (\S+) a (\S+) or (\S+)\?\s*$")
_FACT = re.compile(r"(Every )?(\S+) is a (\S+)\.")


def parse(question: str) -> tuple[list[tuple[bool, str, str]], str, tuple[str, str]]:
    """(facts as (is_every_fact, subject, object), asked entity, (option 1, option 2))."""
    m = _QUESTION.search(question)
    if not m:
        raise ValueError(f"not a ProsQA question (no 'Is X a A or B?'): {question[-80:]!r}")
    facts = [(bool(e), a, b) for e, a, b in _FACT.findall(question[: m.start()])]
    return facts, m.group(1), (m.group(2), m.group(3))


def _prefer(score_a: float, score_b: float, options: tuple[str, str]) -> str | None:
    if score_a == score_b:
        return None
    return options[0] if score_a > score_b else options[1]


def _first(facts, entity, options):
    return options[0]


def _second(facts, entity, options):
    return options[1]


def _object_of_every_fact(facts, entity, options):
    objs = {b for every, _, b in facts if every}
    return _prefer(options[0] in objs, options[1] in objs, options)


def _not_object_of_every_fact(facts, entity, options):
    objs = {b for every, _, b in facts if every}
    return _prefer(options[0] not in objs, options[1] not in objs, options)


def _not_direct_child_of_entity(facts, entity, options):
    objs = {b for every, _, b in facts if not every}
    return _prefer(options[0] not in objs, options[1] not in objs, options)


def _direct_child_of_entity(facts, entity, options):
    objs = {b for every, _, b in facts if not every}
    return _prefer(options[0] in objs, options[1] in objs, options)


def _more_frequent(facts, entity, options):
    c = Counter(w for _, a, b in facts for w in (a, b))
    return _prefer(c[options[0]], c[options[1]], options)


def _less_frequent(facts, entity, options):
    c = Counter(w for _, a, b in facts for w in (a, b))
    return _prefer(-c[options[0]], -c[options[1]], options)


def _last_mention(facts, entity, options):
    last = {w: i for i, (_, a, b) in enumerate(facts) for w in (a, b)}
    return _prefer(last.get(options[0], -1), last.get(options[1], -1), options)


def _first_mention(facts, entity, options):
    first: dict[str, int] = {}
    for i, (_, a, b) in enumerate(facts):
        for w in (a, b):
            first.setdefault(w, i)
    return _prefer(-first.get(options[0], 1 << 30), -first.get(options[1], 1 << 30), options)


def _more_parents(facts, entity, options):
    c = Counter(b for _, _, b in facts)
    return _prefer(c[options[0]], c[options[1]], options)


RULES: dict[str, Callable] = {
    "first option": _first,
    "second option": _second,
    "object of an Every-fact": _object_of_every_fact,
    "not the object of an Every-fact": _not_object_of_every_fact,
    "not a direct child of an entity": _not_direct_child_of_entity,
    "a direct child of an entity": _direct_child_of_entity,
    "more frequent in the facts": _more_frequent,
    "less frequent in the facts": _less_frequent,
    "more parents": _more_parents,
    "mentioned last": _last_mention,
    "mentioned first": _first_mention,
}


def rule_scores(problems: Iterable[tuple[str, str]]) -> dict[str, float]:
    """Accuracy of every rule on ``(question, gold option)`` pairs (undecided = 0.5)."""
    totals = Counter()
    n = 0
    for question, gold in problems:
        facts, entity, options = parse(question)
        if gold not in options:
            raise ValueError(f"gold option {gold!r} is not one of the question's options {options}")
        n += 1
        for name, rule in RULES.items():
            pick = rule(facts, entity, options)
            totals[name] += 0.5 if pick is None else float(pick == gold)
    if not n:
        raise ValueError("no problems to score")
    return {name: totals[name] / n for name in RULES}


def row_problems(rows: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    """(question, gold option) from ProsQA rows in the published format."""
    return [(r["question"], r["idx_to_symbol"][r["target"]]) for r in rows]


def example_problems(examples: Iterable[Any]) -> list[tuple[str, str]]:
    """(question, gold option) from ProsQA Examples (``meta['answer_concept']``)."""
    return [(ex.question, ex.meta["answer_concept"]) for ex in examples]


def worst_rule(scores: dict[str, float]) -> tuple[str, float]:
    """The best-scoring rule (the most dangerous shortcut) and its score."""
    name = max(scores, key=scores.get)
    return name, scores[name]


def main(argv: list[str] | None = None) -> int:
    import argparse
    from pathlib import Path

    from anchored_reasoning.generators import prosqa

    parser = argparse.ArgumentParser(prog="python -m anchored_reasoning.generators.shortcuts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--file", help="ProsQA rows in the published JSON format")
    src.add_argument("--hops", type=int, help="generated problems of this ladder depth")
    src.add_argument("--size", type=json.loads, help="generated problems of this size: ProsQAConfig fields as JSON")
    parser.add_argument("--n", type=int, default=1000, help="generated problems (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.size is not None and not isinstance(args.size, dict):
        parser.error(f"--size takes a JSON object of ProsQAConfig fields, got {args.size!r}")
    if args.file:
        rows, where = json.loads(Path(args.file).read_text()), args.file
    else:
        size = prosqa.ladder_size(args.hops) if args.hops else (args.size or {})
        rows, where = prosqa.generate_rows(args.n, seed=args.seed, **size), f"generated, size {size or 'default'}"
    scores = rule_scores(row_problems(rows))
    print(f"{len(rows)} problems ({where}); chance 0.5 for every rule")
    for name, score in sorted(scores.items(), key=lambda kv: -kv[1]):
        print(f"  {score:.3f}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
