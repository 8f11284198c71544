"""Drawing ProsQA problems at a size: :class:`ProsQAConfig`, the random construction (steps 1-5 in
:mod:`anchored_reasoning.generators.prosqa`: :func:`_draw_graph` draws and prunes the DAG,
:func:`_pick_question` picks the asked entity, the answer and the wrong option), the wrong option's
depth the config resolves (``neg_depth="auto"``, :func:`resolve_neg_depth`, which probes the
construction), and the depth ladder's sizes (:func:`ladder_size`). Every draw takes the caller's
``random.Random``, so the same stream gives the same problems.
"""
from __future__ import annotations

import functools
import logging
import math
import random
from dataclasses import dataclass, field, fields
from typing import Any

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.generators.prosqa_graph import _bfs, _graph

# the generator's logger name from before the split, so its warning keeps reaching existing filters
log = logging.getLogger("anchored_reasoning.generators.prosqa")


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
