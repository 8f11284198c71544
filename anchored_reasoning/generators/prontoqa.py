"""A ProntoQA-style generator: fictional ontologies, ``hops``-step proofs, True/False queries.

It writes problems in the format of the published 5-hop files (Coconut's ProntoQA split of
asaparov/prontoqa, ``--ontology fictional --ordering random``)::

    {"question": "<25 shuffled facts> <entity facts> True or false: Stella is not floral.",
     "steps": ["Stella is a zumpus. Zumpuses are gorpuses.", ..., "Stella is floral."],
     "answer": "False"}

Each problem is built from a chain of ``hops`` concepts ``X0 -> X1 -> ... -> X(h-1)``; the
entity is an ``X0``, and ``X(h-1)`` has the queried property. Like the real files, every
concept on the chain also has its own property and another super-concept (with a property),
the entity belongs to a second, distracting concept, and one unrelated concept has the
*opposite* of the queried property. The proof (``steps``) applies the ``hops`` rules in order
("E is a X_i." + the rule as stated in the question) and ends with the conclusion. The query
asks for the conclusion or its negation with probability 1/2 each (True/False balance).

This is a re-implementation that matches the published files' surface (same sentence
templates, the same fictional names and property words, 25 facts at 5 hops, 6 steps), not
the original generator: its ontologies are simpler (a chain with side branches, not a full
random tree), which is enough for training data but is not the same distribution.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.types import Example

ENTITY_NAMES = "Alex Fae Max Polly Rex Sally Sam Stella Wren".split()
CONCEPT_NAMES = (
    "brimpus dumpus gorpus grimpus impus jompus lempus lorpus numpus rompus shumpus sterpus "
    "tumpus vumpus wumpus yumpus zumpus"
).split()
# Used only when a problem needs more concepts than ProntoQA's own 17 (hops > 6).
EXTRA_CONCEPT_NAMES = (
    "bompus boompus chorpus felpus fompus gerpus gwompus hilpus jelpus kerpus quimpus rempus "
    "rorpus scrompus storpus terpus timpus worpus yerpus yimpus zhorpus"
).split()
# Property words by family: a problem never uses the queried property's family elsewhere,
# except for the one distracting concept that has its opposite.
PROPERTY_FAMILIES = [
    ["blue", "red", "brown", "orange"],
    ["small", "large"],
    ["metallic", "wooden"],
    ["luminous", "dull", "bright"],
    ["transparent", "opaque"],
    ["fast", "slow"],
    ["fruity", "floral", "earthy"],
    ["hot", "cold", "temperate"],
    ["sweet", "sour", "spicy", "bitter"],
    ["loud", "muffled", "melodic", "discordant"],
    ["happy", "feisty", "angry", "mean", "kind", "shy", "nervous", "aggressive", "amenable"],
    ["sunny", "windy", "rainy", "snowy", "overcast", "moderate"],
    ["liquid"],
]


@dataclass
class ProntoQAConfig:
    """``hops``: rules the proof applies (the published data has 5; ``steps`` = hops + 1).

    ``mirror_distractor``: the concept with the opposite property heads a chain built like the proof's
    (``hops`` concepts, each with its own property and a side super-concept) that no membership of the
    entity enters. Off (the published construction), that concept is named only in its own rule, and
    "the property rule of a concept named elsewhere" answers every problem without the proof
    (``generators/prontoqa_shortcuts.py``); on, only following the chain back to the entity tells the
    two rules apart. Twice the facts: mind the model's context at 5 hops. Needs ``hops >= 2`` (refused at
    1: one hop has no chain to mirror, and the count rule answers every problem).
    """

    hops: int = 5
    mirror_distractor: bool = False

    def n_concepts(self) -> int:
        return (4 * self.hops + 5) if self.mirror_distractor else (2 * self.hops + 4)

    def __post_init__(self) -> None:
        if not isinstance(self.hops, int) or self.hops < 1:
            raise ConfigError(f"ProntoQA generator: hops must be an integer >= 1, got {self.hops!r}")
        if not isinstance(self.mirror_distractor, bool):
            raise ConfigError(f"ProntoQA generator: mirror_distractor must be true or false, got {self.mirror_distractor!r}")
        if self.mirror_distractor and self.hops < 2:
            raise ConfigError(
                f"ProntoQA generator: mirror_distractor needs hops >= 2, got hops={self.hops}: at one hop no chain "
                "leads to the distractor, so the proof's concept is the one named more often (the entity's "
                "membership names it) and 'the property rule of a recurring concept' answers every problem")
        if self.n_concepts() > len(CONCEPT_NAMES) + len(EXTRA_CONCEPT_NAMES):
            raise ConfigError(f"ProntoQA generator: hops={self.hops} needs more concept names than available")


def _article(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _plural(word: str) -> str:
    return word + "es" if word.endswith(("s", "x", "sh", "ch")) else word + "s"


def _subtype(rng: random.Random, a: str, b: str) -> str:
    form = rng.random()
    if form < 0.5:
        return f"{_plural(a).capitalize()} are {_plural(b)}."
    return f"{'Every' if form < 0.75 else 'Each'} {a} is {_article(b)}."


def _property(rng: random.Random, a: str, prop: str, negated: bool) -> str:
    neg = "not " if negated else ""
    form = rng.random()
    if form < 0.5:
        return f"{_plural(a).capitalize()} are {neg}{prop}."
    return f"{'Every' if form < 0.75 else 'Each'} {a} is {neg}{prop}."


def generate_problem(rng: random.Random, cfg: ProntoQAConfig | None = None) -> dict[str, Any]:
    """One problem as a dict in the published format (``question, steps, answer``)."""
    cfg = cfg or ProntoQAConfig()
    h = cfg.hops
    n_concepts = cfg.n_concepts()
    pool = list(CONCEPT_NAMES)
    rng.shuffle(pool)
    if n_concepts > len(pool):
        extra = list(EXTRA_CONCEPT_NAMES)
        rng.shuffle(extra)
        pool += extra
    chain, branches = pool[:h], pool[h : 2 * h]
    spare, distractor, second, second_super = pool[2 * h : 2 * h + 4]
    entity = rng.choice(ENTITY_NAMES)

    families = list(range(len(PROPERTY_FAMILIES)))
    target_family = rng.choice([f for f in families if len(PROPERTY_FAMILIES[f]) > 1] or families)
    prop = rng.choice(PROPERTY_FAMILIES[target_family])
    negated = rng.random() < 0.5
    others = [w for f in families if f != target_family for w in PROPERTY_FAMILIES[f]]
    rng.shuffle(others)
    other_props = iter(others)

    def other() -> tuple[str, bool]:
        return next(other_props), rng.random() < 0.5

    def chain_facts(concepts: list[str], sides: list[str], last_super: str, polarity: bool) -> list[str]:
        """The rules down ``concepts`` to the queried property, then the side branches: every concept
        has its own property (except the last, whose property is the queried one) and one more
        super-concept with a property; the last one also ``last_super``."""
        out = [_subtype(rng, concepts[i], concepts[i + 1]) for i in range(len(concepts) - 1)]
        out.append(_property(rng, concepts[-1], prop, polarity))
        for i, concept in enumerate(concepts):
            if i < len(concepts) - 1:
                out.append(_property(rng, concept, *other()))
            out.append(_subtype(rng, concept, sides[i]))
            out.append(_property(rng, sides[i], *other()))
        out.append(_subtype(rng, concepts[-1], last_super))
        return out

    facts = chain_facts(chain, branches, spare, negated)
    rules = facts[:h]  # the rules the proof uses, in order
    # the distracting concept with the opposite property, and the entity's second concept
    if cfg.mirror_distractor:
        mirror = pool[2 * h + 4 : 4 * h + 5]  # h - 1 concepts above the distractor, h sides, a spare
        facts += chain_facts(mirror[: h - 1] + [distractor], mirror[h - 1 : 2 * h - 1], mirror[-1], not negated)
    else:
        facts.append(_property(rng, distractor, prop, not negated))
    facts.append(_subtype(rng, second, second_super))
    facts.append(_property(rng, second, *other()))
    rng.shuffle(facts)
    memberships = [f"{entity} is {_article(chain[0])}.", f"{entity} is {_article(second)}."]
    rng.shuffle(memberships)

    steps = [f"{entity} is {_article(chain[i])}. {rules[i]}" for i in range(h)]
    conclusion = f"{entity} is {'not ' if negated else ''}{prop}."
    steps.append(conclusion)
    answer = rng.random() < 0.5
    query_negated = negated if answer else not negated
    query = f"{entity} is {'not ' if query_negated else ''}{prop}."
    question = " ".join(facts + memberships) + f" True or false: {query}"
    return {"question": question, "steps": steps, "answer": "True" if answer else "False"}


def generate_rows(n: int, seed: int = 0, **size: Any) -> list[dict[str, Any]]:
    """``n`` problems in the published JSON format; same ``seed`` and ``size``, same rows."""
    cfg = ProntoQAConfig(**size)
    rng = random.Random(f"prontoqa-{seed}")
    return [generate_problem(rng, cfg) for _ in range(n)]


def rows_to_examples(rows: list[dict[str, Any]], split: str = "generated") -> list[Example]:
    """Examples built by the real ProntoQA loader's row hook, so they look exactly like loaded ones."""
    from anchored_reasoning.tasks.loaders import RowContext, prontoqa_row

    return [prontoqa_row(row, RowContext(index=i, split=split)) for i, row in enumerate(rows)]


def generate_dataset(n: int, seed: int = 0, split: str = "generated", **size: Any) -> list[Example]:
    """``n`` generated ProntoQA Examples (ids ``<split>-<i>``). ``size``: ``hops=5``."""
    return rows_to_examples(generate_rows(n, seed, **size), split=split)


def write_json(path: str | Path, n: int, seed: int = 0, **size: Any) -> Path:
    """Write ``n`` generated problems to ``path`` as a JSON list in the published format."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(generate_rows(n, seed, **size)))
    return path
