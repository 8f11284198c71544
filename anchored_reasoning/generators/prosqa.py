"""A ProsQA generator following Coconut's construction (arXiv 2412.06769, appendix A.2).

Each problem is a random DAG of "is-a" facts over fictional concepts, plus a question
``Is <entity> a <A> or <B>?`` where ``A`` is reachable from the entity and ``B`` is not.
Construction, per graph (our reading of the appendix; deviations are marked):

1. Nodes 0 and 1 are the two seed entities, with labels ``0b01`` and ``0b10``.
2. Each new node draws ``Poisson(1.5)`` parents. With probability 0.35 the candidates are
   the nodes reachable from node 0 only (label 1), with 0.35 those reachable from node 1
   only (label 2), otherwise any earlier node. Candidates are drawn without replacement with
   weight ``depth * 1.5 + 1`` (``depth`` = longest distance from a parentless node).
   *Deviation:* the appendix also lists the label-0 group (nodes reachable from neither
   seed) among the candidates; with it the graphs have 4.1 entities each against 2.55 in the
   published files, without it 2.55, so we leave it out.
3. A node's label is the bitwise OR of its parents' labels; a node without parents is an entity.
4. *Pruning:* only nodes reachable from a seed, and their ancestors, are kept (the published
   graphs have no isolated node and ~0.6 extra entities, each with one child).
5. The question's entity (``root``) is the seed whose farthest exclusive leaf (reachable from
   it, not from the other seed, no children) is farther; ``target`` is such a farthest leaf,
   ``neg_target`` a random exclusive leaf of the other seed. Graphs whose answer is fewer than
   ``min_hops`` hops away, or where a seed has no exclusive leaf, are redrawn.
6. Facts are listed in random order; the options' order is random; ``steps`` is a random
   shortest path written as sentences, ``answer`` the sentence ``"<entity> is a <target>."``.

*Beyond the appendix:* at any size but the published one the wrong option is, by default, drawn as
deep as the answer (``ProsQAConfig.neg_depth``), since Coconut's draw lets small graphs be answered
from the text's surface: at 7 nodes and 1-2 hops "the option that is not a direct child of an
entity" is right 0.70 of the time, with matched depth no surface rule passes ~0.55.

With the defaults (28 nodes drawn before pruning) 500 problems average 22.7 nodes, 36.2 edges,
a 3.7-hop shortest path and 1.6 shortest paths, against 22.8 / 35.8 / 3.78 / 1.57 for the
real test split (``tests/test_generators.py`` checks this). Names come from the word lists
below, which are the entity and concept names seen in the published valid/test files.

This module names the concepts and writes the problems as text; steps 1-5 and the sizes
(:class:`ProsQAConfig`, ``neg_depth``, the depth ladder) are in :mod:`anchored_reasoning.generators.prosqa_draw`,
the graph searches in :mod:`anchored_reasoning.generators.prosqa_graph`; every public name is importable from here.
"""
from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.generators.prosqa_draw import (
    DEMO_HOPS,
    LADDER_NODES,
    PROBE_DRAWS,
    PROBE_MATCHES,
    SHAPE_FIELDS,
    ProsQAConfig,
    _draw_graph,
    _pick_question,
    ladder_size,
    resolve_neg_depth,
)
from anchored_reasoning.generators.prosqa_graph import _bfs, _bfs_counts, _graph, _shortest_paths, shortest_path
from anchored_reasoning.types import Example

__all__ = [
    "CONCEPT_NAMES", "DEMO_HOPS", "ENTITY_NAMES", "LADDER_NODES", "PROBE_DRAWS", "PROBE_MATCHES", "SHAPE_FIELDS",
    "ProsQAConfig", "generate_dataset", "generate_problem", "generate_rows", "hops_of", "ladder_size",
    "resolve_neg_depth", "rows_to_examples", "shortest_path", "statistics", "swapped_row", "syllable_names",
    "write_json",
]

# The names seen in the published valid/test files; larger graphs than those (num_nodes > 40)
# draw further concept names from :func:`syllable_names`.
ENTITY_NAMES = (
    "Alex Bob Carol Davis Eva Fae Gabriel Jack Max Oliver Polly Rex Sally Sam Stella Tom Wren"
).split()
CONCEPT_NAMES = (
    "bompus boompus brimpus chorpus dumpus felpus fompus gerpus gorpus grimpus gwompus hilpus "
    "impus jelpus jompus kerpus lempus lorpus numpus quimpus rempus rompus rorpus scrompus "
    "shumpus sterpus storpus terpus timpus tumpus vumpus worpus wumpus yerpus yimpus yumpus "
    "zhorpus zumpus"
).split()


_ONSETS = "b bl br ch d dr f fl g gl gr h j k kl l m n p pl qu r s sc sh sk sl st t tr v w y z zh".split()
_VOWELS = "a e i o u oo ee ai".split()
_CODAS = "mpus rpus lpus mbus".split()


def syllable_names(exclude: tuple[str, ...] | list[str] = ()) -> list[str]:
    """Fictional concept names by a syllable rule (onset + vowel + ``-mpus``/``-rpus``/...), in a
    fixed order, skipping ``exclude``. Used only when a graph needs more than the 38 real names."""
    skip = set(exclude)
    return [o + v + c for c in _CODAS for v in _VOWELS for o in _ONSETS if o + v + c not in skip]


def _fact(symbols: list[str], entities, a: int, b: int) -> str:
    """The sentence of edge a -> b: "<entity> is a <b>." or "Every <a> is a <b>."."""
    return f"{symbols[a]} is a {symbols[b]}." if a in entities else f"Every {symbols[a]} is a {symbols[b]}."


def generate_problem(rng: random.Random, cfg: ProsQAConfig | None = None) -> dict[str, Any]:
    """One problem as a dict in the published ProsQA format (``question, answer, steps,
    idx_to_symbol, edges, root, target, neg_target``)."""
    cfg = cfg or ProsQAConfig()
    for _ in range(cfg.max_tries):
        n, edges = _draw_graph(rng, cfg)
        picked = _pick_question(rng, edges, cfg, cfg.resolved_neg_depth)
        if picked is not None:
            root, target, neg_target = picked
            children, has_parent = _graph(edges)
            break
    else:
        extra = ""
        if cfg.resolved_neg_depth == "match":
            extra = " with the wrong option as deep as the answer (neg_depth='match'"
            extra += ", chosen by the default 'auto'; neg_depth='any' allows any depth)" if cfg.neg_depth == "auto" else ")"
        raise ConfigError(
            f"ProsQA generator: no graph with min_hops={cfg.min_hops} max_hops={cfg.max_hops}{extra} in "
            f"{cfg.max_tries} draws of num_nodes={cfg.num_nodes}; raise num_nodes or lower min_hops"
        )
    entities = [i for i in range(n) if i not in has_parent]
    concepts = [i for i in range(n) if i in has_parent]
    concept_pool = list(CONCEPT_NAMES)
    if len(concepts) > len(concept_pool):
        concept_pool += syllable_names(CONCEPT_NAMES)
    entity_pool = list(ENTITY_NAMES)
    if len(entities) > len(entity_pool):  # very large graphs: "Alex2", ...
        entity_pool += [f"{name}{i}" for i in range(2, 2 + len(entities) // len(ENTITY_NAMES) + 1) for name in ENTITY_NAMES]
    names: dict[int, str] = {}
    names.update(zip(entities, rng.sample(entity_pool, len(entities))))
    names.update(zip(concepts, rng.sample(concept_pool, len(concepts))))
    symbols = [names[i] for i in range(n)]

    facts = [_fact(symbols, entities, a, b) for a, b in edges]
    rng.shuffle(facts)
    options = [symbols[target], symbols[neg_target]]
    rng.shuffle(options)
    question = " ".join(facts) + f" Is {symbols[root]} a {options[0]} or {options[1]}?"
    path = rng.choice(_shortest_paths(children, root, target))
    steps = [_fact(symbols, entities, a, b) for a, b in zip(path, path[1:])]
    return {
        "question": question,
        "answer": f"{symbols[root]} is a {symbols[target]}.",
        "steps": steps,
        "idx_to_symbol": symbols,
        "edges": [[a, b] for a, b in edges],
        "root": root,
        "target": target,
        "neg_target": neg_target,
    }


def generate_rows(n: int, seed: int = 0, **size: Any) -> list[dict[str, Any]]:
    """``n`` problems in the published JSON format; same ``seed`` and ``size``, same rows."""
    cfg = ProsQAConfig(**size)
    rng = random.Random(f"prosqa-{seed}")
    return [generate_problem(rng, cfg) for _ in range(n)]


def hops_of(row: dict[str, Any]) -> int:
    """Shortest entity -> answer distance of a ProsQA row (generated or published)."""
    children, _ = _graph(row["edges"])
    return _bfs(children, row["root"])[row["target"]]


def swapped_row(row: dict[str, Any]) -> dict[str, Any] | None:
    """The binding probe: the same facts and options, asked about the *other* seed entity, so the
    right answer flips to the other option. None when the other seed does not reach the wrong
    option (then the swap has no right answer) -- never the case for generated rows, whose wrong
    option is an exclusive leaf of the other seed.
    """
    other = 1 - row["root"] if row["root"] in (0, 1) else None
    if other is None:
        return None
    children, has_parent = _graph(row["edges"])
    reach_other, reach_root = _bfs(children, other), _bfs(children, row["root"])
    neg, target = row["neg_target"], row["target"]
    if neg not in reach_other or target in reach_other or neg in reach_root:
        return None
    symbols = row["idx_to_symbol"]
    cut = row["question"].rfind(" Is ")
    tail = row["question"][cut:]
    prefix = f" Is {symbols[row['root']]} a "
    if not tail.startswith(prefix):
        return None
    question = row["question"][:cut] + f" Is {symbols[other]} a " + tail[len(prefix):]
    path = _shortest_paths(children, other, neg)[0]
    entities = set(range(len(symbols))) - has_parent
    return {**row, "question": question, "answer": f"{symbols[other]} is a {symbols[neg]}.",
            "steps": [_fact(symbols, entities, a, b) for a, b in zip(path, path[1:])],
            "root": other, "target": neg, "neg_target": target}


def rows_to_examples(rows: list[dict[str, Any]], split: str = "generated") -> list[Example]:
    """Examples built by the real ProsQA loader's row hook, so they look exactly like loaded ones."""
    from anchored_reasoning.tasks.row_hooks import RowContext, prosqa_row

    return [prosqa_row(row, RowContext(index=i, split=split)) for i, row in enumerate(rows)]


def generate_dataset(n: int, seed: int = 0, split: str = "generated", **size: Any) -> list[Example]:
    """``n`` generated ProsQA Examples (ids ``<split>-<i>``). ``size``: :class:`ProsQAConfig` fields."""
    return rows_to_examples(generate_rows(n, seed, **size), split=split)


def write_json(path: str | Path, n: int, seed: int = 0, **size: Any) -> Path:
    """Write ``n`` generated problems to ``path`` as a JSON list in the published format
    (loadable by ``get_task("prosqa")`` from a data folder). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(generate_rows(n, seed, **size)))
    return path


def statistics(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean graph statistics of ProsQA rows (generated or published): ``nodes``, ``edges``,
    ``hops`` (shortest entity -> answer path), ``paths`` (number of such shortest paths),
    ``first`` (fraction of questions naming the right option first), ``entities``."""
    totals = defaultdict(float)
    for row in rows:
        children, has_parent = _graph(row["edges"])
        dist, count = _bfs_counts(children, row["root"])
        symbols = row["idx_to_symbol"]
        totals["nodes"] += len(symbols)
        totals["edges"] += len(row["edges"])
        totals["hops"] += dist[row["target"]]
        totals["paths"] += count[row["target"]]
        option = row["question"].rsplit(" or ", 1)[0].rsplit(" ", 1)[-1]
        totals["first"] += option == symbols[row["target"]]
        totals["entities"] += len(symbols) - len(has_parent)
    n = max(len(rows), 1)
    return {k: v / n for k, v in totals.items()}
