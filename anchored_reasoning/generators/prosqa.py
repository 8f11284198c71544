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
"""
from __future__ import annotations

import functools
import json
import logging
import math
import random
from collections import defaultdict
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.types import Example

log = logging.getLogger(__name__)

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


@dataclass
class ProsQAConfig:
    """Size and shape of the generated graphs. Smaller ``num_nodes`` and ``min_hops`` make
    small problems for fast demos (``num_nodes=12, min_hops=2``: ~10 nodes, 2-3 hops), shortcut-free
    by default (``neg_depth``)."""

    num_nodes: int = 28  # nodes drawn before pruning
    mean_parents: float = 1.5  # Poisson mean of the number of parents of a new node
    p_group: float = 0.35  # probability of each seed's exclusive group being the candidates
    depth_weight: float = 1.5  # candidate weight = depth * depth_weight + 1
    min_hops: int = 3  # shortest path entity -> answer at least this long
    max_hops: int | None = None  # ... and at most this long (None: no bound)
    max_tries: int = 10_000  # graph draws per problem before giving up
    #: Depth of the wrong option. ``"match"`` draws an exclusive leaf of the other seed exactly as
    #: far from it as the answer is from the asked entity, and redraws the graph when there is none:
    #: no surface rule of :mod:`anchored_reasoning.generators.shortcuts` then scores above ~0.55.
    #: ``"any"`` (Coconut's construction) draws any exclusive leaf of the other seed; small graphs
    #: then let "not a direct child of an entity" pick the answer 0.68-0.85 of the time.
    #: ``"auto"`` (the default): ``"any"`` at Coconut's published size (every shape field at its
    #: default: it must match the real split), ``"match"`` at every other size where the graph
    #: allows it, and ``"any"`` with a warning where it almost never does (see :func:`resolve_neg_depth`).
    neg_depth: str = "auto"
    #: what ``neg_depth`` stands for at this size: ``"match"`` or ``"any"``
    resolved_neg_depth: str = field(init=False, repr=False, compare=False, default="")

    def __post_init__(self) -> None:
        if self.num_nodes < 4:
            raise ConfigError(f"ProsQA generator: num_nodes must be >= 4, got {self.num_nodes}")
        if self.num_nodes > 500:
            raise ConfigError(f"ProsQA generator: num_nodes must be <= 500, got {self.num_nodes}")
        if not 0 <= 2 * self.p_group <= 1:
            raise ConfigError(f"ProsQA generator: p_group must be in [0, 0.5], got {self.p_group}")
        if self.min_hops < 1 or (self.max_hops is not None and self.max_hops < self.min_hops):
            raise ConfigError(f"ProsQA generator: need 1 <= min_hops <= max_hops, got {self.min_hops}, {self.max_hops}")
        if self.neg_depth not in ("auto", "any", "match"):
            raise ConfigError(f"ProsQA generator: neg_depth must be 'auto', 'match' or 'any', got {self.neg_depth!r}")
        self.resolved_neg_depth = self.neg_depth if self.neg_depth != "auto" else resolve_neg_depth(self.shape())

    def shape(self) -> tuple:
        """The fields that shape the graphs and the question (not ``neg_depth`` or ``max_tries``)."""
        return tuple(getattr(self, name) for name in SHAPE_FIELDS)


#: ProsQAConfig fields that shape a problem; all at their defaults is Coconut's published size.
SHAPE_FIELDS = ("num_nodes", "mean_parents", "p_group", "depth_weight", "min_hops", "max_hops")
#: ``neg_depth="auto"`` probes a size with this many graph draws (its own seeded stream, so the
#: problems generated are the same as with ``neg_depth`` named) and matches the wrong option's
#: depth when at least PROBE_MATCHES of them allow it: a size where fewer do needs over
#: PROBE_DRAWS / PROBE_MATCHES draws a problem on average.
PROBE_DRAWS, PROBE_MATCHES = 4000, 4


@functools.lru_cache(maxsize=None)
def resolve_neg_depth(shape: tuple) -> str:
    """``neg_depth="auto"`` at a size (:meth:`ProsQAConfig.shape`): ``"any"`` at Coconut's published
    size, else ``"match"`` when the wrong option can be drawn as deep as the answer in at least
    PROBE_MATCHES of PROBE_DRAWS graphs; else ``"any"``, and a warning that these problems keep the
    shortcuts. Decided once per size and process."""
    defaults = {f.name: f.default for f in fields(ProsQAConfig)}
    if shape == tuple(defaults[name] for name in SHAPE_FIELDS):
        return "any"
    cfg = ProsQAConfig(**dict(zip(SHAPE_FIELDS, shape)), neg_depth="any")
    rng = random.Random("prosqa-neg-depth-probe")
    matched = 0
    for _ in range(PROBE_DRAWS):
        matched += _pick_question(rng, _draw_graph(rng, cfg)[1], cfg, "match") is not None
        if matched >= PROBE_MATCHES:
            return "match"
    size = ", ".join(f"{k}={v}" for k, v in zip(SHAPE_FIELDS, shape) if k.endswith(("nodes", "hops")) or v != defaults[k])
    log.warning(
        "ProsQA generator (%s): the wrong option can almost never be drawn as deep as the answer (%d of %d graphs "
        "allow it), so these problems use Coconut's construction (neg_depth='any') and keep its surface shortcuts "
        "(python -m anchored_reasoning.generators.shortcuts measures them). For shortcut-free problems raise "
        "num_nodes or lower min_hops; pass neg_depth='any' to choose this and silence the warning", size, matched,
        PROBE_DRAWS)
    return "any"


#: Generator sizes of the depth ladder and the demo: nodes drawn per answer depth (hops), with the
#: wrong option as deep as the answer. Each size keeps every surface rule of
#: :mod:`anchored_reasoning.generators.shortcuts` at or below 0.55 (tests/test_shortcuts.py).
LADDER_NODES = {1: 8, 2: 12, 3: 16, 4: 20}  # 5 hops needs ~31 nodes and ~45 ms a problem
#: Answer depths of the demo's problems (a mixture, evaluated per depth).
DEMO_HOPS = (1, 2, 3)


def ladder_size(hops: int) -> dict[str, Any]:
    """ProsQAConfig fields of ``hops``-hop ladder problems (exactly ``hops`` hops, matched depth)."""
    if hops not in LADDER_NODES:
        raise ConfigError(f"ProsQA ladder: no size for {hops} hops; ladder depths are {sorted(LADDER_NODES)}")
    return {"num_nodes": LADDER_NODES[hops], "min_hops": hops, "max_hops": hops, "neg_depth": "match"}


def _poisson(rng: random.Random, lam: float) -> int:
    threshold, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= threshold:
            return k
        k += 1


def _weighted_sample(rng: random.Random, items: list[int], weights: list[float], k: int) -> list[int]:
    items, weights = list(items), list(weights)
    out = []
    for _ in range(k):
        x = rng.random() * sum(weights)
        i = 0
        while i < len(items) - 1 and x >= weights[i]:
            x -= weights[i]
            i += 1
        out.append(items.pop(i))
        weights.pop(i)
    return out


def _graph(edges) -> tuple[dict[int, list[int]], set[int]]:
    """(children of every node, the nodes that have a parent) of a parent -> child edge list."""
    children: dict[int, list[int]] = defaultdict(list)
    has_parent: set[int] = set()
    for a, b in edges:
        children[a].append(b)
        has_parent.add(b)
    return children, has_parent


def _fact(symbols: list[str], entities, a: int, b: int) -> str:
    """The sentence of edge a -> b: "<entity> is a <b>." or "Every <a> is a <b>."."""
    return f"{symbols[a]} is a {symbols[b]}." if a in entities else f"Every {symbols[a]} is a {symbols[b]}."


def _bfs_tree(children: dict[int, list[int]], source: int) -> tuple[dict[int, int], dict[int, int], dict[int, int]]:
    """Breadth first from ``source`` (children in their listed order): the distance to every node it reaches,
    the number of shortest paths to it, and the parent it was first reached from."""
    dist, count, first, queue = {source: 0}, {source: 1}, {source: source}, [source]
    for u in queue:
        for v in children.get(u, ()):
            if v not in dist:
                dist[v], count[v], first[v] = dist[u] + 1, count[u], u
                queue.append(v)
            elif dist[v] == dist[u] + 1:
                count[v] += count[u]
    return dist, count, first


def _bfs_counts(children: dict[int, list[int]], source: int) -> tuple[dict[int, int], dict[int, int]]:
    """Distance from ``source`` and number of shortest paths to every node it reaches."""
    return _bfs_tree(children, source)[:2]


def shortest_path(children: dict[int, list[int]], start: int, goal: int) -> list[int] | None:
    """A shortest path start -> goal (breadth first, children in their listed order), or None."""
    first = _bfs_tree(children, start)[2]
    if goal not in first:
        return None
    path = [goal]
    while path[-1] != start:
        path.append(first[path[-1]])
    return path[::-1]


def _bfs(children: dict[int, list[int]], source: int) -> dict[int, int]:
    return _bfs_counts(children, source)[0]


def _draw_graph(rng: random.Random, cfg: ProsQAConfig) -> tuple[int, list[tuple[int, int]]]:
    """Steps 1-4: returns (number of kept nodes, edges parent->child), nodes renumbered in
    creation order (so every edge goes from a lower to a higher index, like the real files)."""
    labels = {0: 1, 1: 2}
    depth = {0: 0, 1: 0}
    groups: dict[int, list[int]] = {0: [], 1: [0], 2: [1], 3: []}
    parents: dict[int, list[int]] = {0: [], 1: []}
    for idx in range(2, cfg.num_nodes):
        n_in = _poisson(rng, cfg.mean_parents)
        r = rng.random()
        if r < cfg.p_group:
            candidates = list(groups[1])
        elif r < 2 * cfg.p_group:
            candidates = list(groups[2])
        else:
            candidates = list(range(idx))
        n_in = min(n_in, len(candidates))
        chosen = _weighted_sample(rng, candidates, [depth[c] * cfg.depth_weight + 1 for c in candidates], n_in)
        label = 0
        for c in chosen:
            label |= labels[c]
        labels[idx] = label
        groups[label].append(idx)
        parents[idx] = sorted(chosen)
        depth[idx] = max((depth[c] + 1 for c in chosen), default=0)
    keep = {i for i, lab in labels.items() if lab}
    stack = list(keep)
    while stack:
        for p in parents[stack.pop()]:
            if p not in keep:
                keep.add(p)
                stack.append(p)
    order = sorted(keep)
    new = {old: i for i, old in enumerate(order)}
    edges = [(new[p], new[c]) for c in order for p in parents[c]]
    return len(order), edges


def _shortest_paths(children: dict[int, list[int]], source: int, target: int) -> list[list[int]]:
    """Every shortest path source -> target (node lists)."""
    dist = _bfs(children, source)
    length = dist[target]
    parents: dict[int, list[int]] = defaultdict(list)
    for u, vs in list(children.items()):
        for v in vs:
            parents[v].append(u)
    to_target = {target: 0}
    queue = [target]
    for u in queue:
        for p in parents[u]:
            if p not in to_target:
                to_target[p] = to_target[u] + 1
                queue.append(p)

    def on_path(v: int) -> bool:
        return v in dist and v in to_target and dist[v] + to_target[v] == length

    paths: list[list[int]] = []

    def walk(path: list[int]) -> None:
        node = path[-1]
        if node == target:
            paths.append(path)
            return
        for v in sorted(children[node]):
            if on_path(v) and dist[v] == dist[node] + 1:
                walk(path + [v])

    walk([source])
    return paths


def _pick_question(rng: random.Random, edges, cfg: ProsQAConfig, neg_depth: str) -> tuple[int, int, int] | None:
    """Step 5 on a drawn graph: (root, target, neg_target), or None when the graph must be redrawn."""
    children, _ = _graph(edges)
    reach = [_bfs(children, 0), _bfs(children, 1)]
    leaves = [
        [v for v in reach[s] if v not in reach[1 - s] and not children[v] and v != s] for s in (0, 1)
    ]
    if not leaves[0] or not leaves[1]:
        return None
    best = [max(reach[s][v] for v in leaves[s]) for s in (0, 1)]
    root = 0 if best[0] > best[1] else 1 if best[1] > best[0] else rng.randrange(2)
    hops = best[root]
    if hops < cfg.min_hops or (cfg.max_hops is not None and hops > cfg.max_hops):
        return None
    negs = sorted(leaves[1 - root])
    if neg_depth == "match":
        negs = [v for v in negs if reach[1 - root][v] == hops]
        if not negs:
            return None
    target = rng.choice(sorted(v for v in leaves[root] if reach[root][v] == hops))
    return root, target, rng.choice(negs)


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
    from anchored_reasoning.tasks.loaders import RowContext, prosqa_row

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
