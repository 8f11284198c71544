"""Searching the graphs of ProsQA problems (generated or published): a graph is a list of
parent -> child ``edges`` over integer nodes; these give each node's children, distances and
shortest paths (breadth first, children in their listed order, so every answer is deterministic).
"""
from __future__ import annotations

from collections import defaultdict


def _graph(edges) -> tuple[dict[int, list[int]], set[int]]:
    """(children of every node, the nodes that have a parent) of a parent -> child edge list."""
    children: dict[int, list[int]] = defaultdict(list)
    has_parent: set[int] = set()
    for a, b in edges:
        children[a].append(b)
        has_parent.add(b)
    return children, has_parent


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
