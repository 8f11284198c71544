"""Generated ProsQA / ProntoQA: determinism, the published format, logical soundness, and
ProsQA statistics against the real test split."""
from __future__ import annotations

import json
import os
import re
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

from anchored_reasoning.anchors import extract_anchors
from anchored_reasoning.errors import ConfigError
from anchored_reasoning.generators import generate_dataset, generate_rows, write_json
from anchored_reasoning.generators.__main__ import main as generators_main
from anchored_reasoning.generators.prosqa import statistics as prosqa_statistics
from anchored_reasoning.tasks import get_task

DATA = os.environ.get("ANCHORED_REASONING_DATA")
needs_data = pytest.mark.skipif(
    not DATA or not Path(DATA).is_dir(), reason="ANCHORED_REASONING_DATA is not set to the shared data folder"
)
PROSQA_KEYS = {"question", "answer", "steps", "idx_to_symbol", "edges", "root", "target", "neg_target"}


def _graph(row):
    children, has_parent = defaultdict(list), set()
    for a, b in row["edges"]:
        children[a].append(b)
        has_parent.add(b)
    return children, has_parent


def _bfs_counts(children, source):
    """distance and number of shortest paths from source to every reachable node"""
    dist, count, queue = {source: 0}, {source: 1}, [source]
    for u in queue:
        for v in children[u]:
            if v not in dist:
                dist[v], count[v] = dist[u] + 1, count[u]
                queue.append(v)
            elif dist[v] == dist[u] + 1:
                count[v] += count[u]
    return dist, count


def prosqa_stats(rows):
    """Independent of the generator's own code: BFS counts of shortest paths."""
    nodes, edges, hops, paths, first = [], [], [], [], []
    for row in rows:
        children, _ = _graph(row)
        dist, count = _bfs_counts(children, row["root"])
        nodes.append(len(row["idx_to_symbol"]))
        edges.append(len(row["edges"]))
        hops.append(dist[row["target"]])
        paths.append(count[row["target"]])
        options = re.search(r"Is \w+ an? (\w+) or (\w+)\?$", row["question"]).groups()
        first.append(options[0] == row["idx_to_symbol"][row["target"]])
    mean = statistics.mean
    return {"nodes": mean(nodes), "edges": mean(edges), "hops": mean(hops), "paths": mean(paths), "first": mean(first)}


def test_library_statistics_agree_with_the_test_helper():
    rows = generate_rows("prosqa", 100, seed=5)
    lib = prosqa_statistics(rows)
    for key, value in prosqa_stats(rows).items():
        assert lib[key] == pytest.approx(value)
    assert 2 <= lib["entities"] <= 4


# ------------------------------------------------------------------------ ProsQA


def test_prosqa_is_deterministic_by_seed():
    assert generate_rows("prosqa", 20, seed=3) == generate_rows("prosqa", 20, seed=3)
    assert generate_rows("prosqa", 20, seed=3) != generate_rows("prosqa", 20, seed=4)
    a = generate_dataset("prosqa", 5, seed=3)
    assert [e.to_dict() for e in a] == [e.to_dict() for e in generate_dataset("prosqa", 5, seed=3)]


def test_prosqa_rows_are_sound_and_in_the_published_format():
    for row in generate_rows("prosqa", 200, seed=0):
        assert set(row) == PROSQA_KEYS
        symbols = row["idx_to_symbol"]
        children, has_parent = _graph(row)
        assert len(set(symbols)) == len(symbols)
        assert all(a < b for a, b in row["edges"])  # creation order, like the real files
        assert len({tuple(e) for e in row["edges"]}) == len(row["edges"])
        linked = {i for e in row["edges"] for i in e}
        assert linked == set(range(len(symbols)))  # no isolated node
        root, target, neg = row["root"], row["target"], row["neg_target"]
        assert root in (0, 1) and root not in has_parent
        dist, _ = _bfs_counts(children, root)
        assert target in dist and neg not in dist
        assert not children[target] and not children[neg]
        assert dist[target] >= 3
        # the facts of the question are exactly the edges, in the two sentence forms
        facts = re.findall(r"[^.?]+[.?]", row["question"])
        question = facts.pop().strip()
        assert question in (
            f"Is {symbols[root]} a {symbols[target]} or {symbols[neg]}?",
            f"Is {symbols[root]} a {symbols[neg]} or {symbols[target]}?",
        )
        expected = sorted(
            (f"{symbols[a]} is a {symbols[b]}." if a not in has_parent else f"Every {symbols[a]} is a {symbols[b]}.")
            for a, b in row["edges"]
        )
        assert sorted(f.strip() for f in facts) == expected
        # the steps walk a shortest path from the entity to the answer
        assert len(row["steps"]) == dist[target]
        node = symbols[root]
        for step in row["steps"]:
            assert step in expected
            subject, obj = re.match(r"(?:Every )?(\w+) is a (\w+)\.", step).groups()
            assert subject == node
            node = obj
        assert node == symbols[target]
        assert row["answer"] == f"{symbols[root]} is a {symbols[target]}."


def test_prosqa_examples_match_loaded_ones_and_anchor():
    example = generate_dataset("prosqa", 3, seed=1, split="train")[0]
    assert example.id == "train-0"
    assert set(example.meta) == {"answer_concept", "neg_concept", "entity", *(PROSQA_KEYS - {"question", "answer", "steps"})}
    anchors = extract_anchors(example, "prosqa")
    assert anchors[0] == example.meta["entity"] and anchors[: len(example.steps) + 1][-1] == example.meta["answer_concept"]
    assert get_task("prosqa").grade(example.answer, example).correct


def test_prosqa_size_options_make_small_problems():
    small = generate_rows("prosqa", 100, seed=0, num_nodes=12, min_hops=2)
    stats = prosqa_stats(small)
    assert stats["nodes"] < 13 and 2 <= stats["hops"] < 3.5
    capped = generate_rows("prosqa", 50, seed=0, min_hops=3, max_hops=3)
    assert prosqa_stats(capped)["hops"] == 3
    big = generate_rows("prosqa", 5, seed=0, num_nodes=80)  # beyond the 38 real concept names
    assert all(len(set(r["idx_to_symbol"])) == len(r["idx_to_symbol"]) > 40 for r in big)
    with pytest.raises(ConfigError, match="num_nodes"):
        generate_rows("prosqa", 1, seed=0, num_nodes=2)
    with pytest.raises(ConfigError, match="min_hops"):
        generate_rows("prosqa", 1, seed=0, num_nodes=5, min_hops=9, max_tries=20)
    with pytest.raises(ConfigError, match="no generator"):
        generate_rows("gsm8k", 1)


@needs_data
def test_prosqa_statistics_match_the_real_test_split():
    """500 generated vs the 500 real test problems. Tolerances are about 4 standard errors of a
    difference of two 500-sample means (sd: nodes 2.0, edges 5.8, hops 0.8, paths 0.9-1.1,
    option order 0.5) plus the small bias of our reading of the algorithm (nodes -0.1,
    paths +0.07 on average over seeds 0-5): nodes 0.5, edges 1.5, hops 0.2, paths 0.25, order 0.1."""
    real = json.loads((Path(DATA) / "prosqa" / "test.json").read_text())
    want = prosqa_stats(real)
    got = prosqa_stats(generate_rows("prosqa", 500, seed=0))
    assert abs(got["nodes"] - want["nodes"]) < 0.5, (got, want)
    assert abs(got["edges"] - want["edges"]) < 1.5, (got, want)
    assert abs(got["hops"] - want["hops"]) < 0.2, (got, want)
    assert abs(got["paths"] - want["paths"]) < 0.25, (got, want)
    assert abs(got["first"] - want["first"]) < 0.1 and abs(got["first"] - 0.5) < 0.07, (got, want)
    # the same vocabulary as the published files
    real_names = {s for r in real for s in r["idx_to_symbol"]}
    generated_names = {s for r in generate_rows("prosqa", 300, seed=1) for s in r["idx_to_symbol"]}
    assert generated_names <= real_names


def test_prosqa_write_json_loads_through_the_task(tmp_path):
    path = write_json("prosqa", tmp_path / "prosqa" / "test.json", 30, seed=2)
    examples = get_task("prosqa").load("test", data_dir=tmp_path)
    assert len(examples) == 30
    assert [e.to_dict() for e in examples] == [e.to_dict() for e in generate_dataset("prosqa", 30, seed=2, split="test")]
    assert json.loads(path.read_text()) == generate_rows("prosqa", 30, seed=2)


def test_command_line_writes_a_file(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert generators_main(["prontoqa", "--n", "4", "--seed", "1", "--out", str(out), "--set", "hops=3"]) == 0
    assert json.loads(out.read_text()) == generate_rows("prontoqa", 4, seed=1, hops=3)
    assert generators_main(["prosqa", "--n", "1", "--out", str(out), "--set", "num_nodes=1"]) == 2
    assert "num_nodes" in capsys.readouterr().err


# ------------------------------------------------------------------------ ProntoQA


def test_prontoqa_is_deterministic_and_balanced():
    rows = generate_rows("prontoqa", 400, seed=0)
    assert rows == generate_rows("prontoqa", 400, seed=0)
    assert rows != generate_rows("prontoqa", 400, seed=1)
    true = sum(r["answer"] == "True" for r in rows)
    assert 160 <= true <= 240  # 0.5 +- 4 standard errors (sd of the count: 10)


@pytest.mark.parametrize("hops", [1, 3, 5, 7])
def test_prontoqa_proofs_are_sound(hops):
    for row in generate_rows("prontoqa", 50, seed=hops, hops=hops):
        assert set(row) == {"question", "steps", "answer"}
        assert len(row["steps"]) == hops + 1
        context, query = row["question"].split(" True or false: ")
        facts = set(re.findall(r"[^.]+\.", context))
        facts = {f.strip() for f in facts}
        entity = row["steps"][0].split()[0]
        for i, step in enumerate(row["steps"][:-1]):
            membership, rule = re.match(r"(.+?\.) (.+\.)$", step).groups()
            assert rule in facts, rule
            if i == 0:
                assert membership in facts  # the entity's own fact
        conclusion = row["steps"][-1]
        assert conclusion.startswith(entity + " is ")
        # True: the query is the conclusion; False: it is the conclusion's negation
        assert (query == conclusion) == (row["answer"] == "True")
        assert query.replace(" not ", " ") == conclusion.replace(" not ", " ")
        # the last rule gives the concluded property; a distracting concept states its opposite
        prop = conclusion.rstrip(".").split()[-1]
        with_prop = [f for f in facts if f.endswith(f" {prop}.")]
        assert len(with_prop) == 2 and sum(" not " in f for f in with_prop) == 1


@needs_data
def test_prontoqa_looks_like_the_real_files():
    real = json.loads((Path(DATA) / "prontoqa" / "test.json").read_text())
    gen = generate_rows("prontoqa", 200, seed=0)

    def shape(row):
        context = row["question"].split(" True or false: ")[0]
        return len(re.findall(r"[^.]+\.", context)), len(row["steps"])

    assert {shape(r) for r in real} == {(25, 6)}
    assert {shape(r) for r in gen} == {(25, 6)}

    def words(rows):
        return {w.lower() for r in rows for w in re.findall(r"[A-Za-z]+", r["question"])}

    assert words(gen) <= words(json.loads((Path(DATA) / "prontoqa" / "train.json").read_text()))
    examples = generate_dataset("prontoqa", 50, seed=0)
    task = get_task("prontoqa")
    for example in examples:
        assert task.grade(example.answer, example).correct
        anchors = extract_anchors(example, "prontoqa")
        assert len(anchors) == 6 and anchors[0] == example.steps[0].split()[0]


def test_shortest_path_walks_breadth_first_and_agrees_with_an_independent_bfs():
    from anchored_reasoning.generators.prosqa import shortest_path

    children = {0: [2, 1], 1: [3], 2: [3], 3: [4]}
    assert shortest_path(children, 0, 4) == [0, 2, 3, 4]  # the first listed child wins a tie
    assert shortest_path(children, 0, 0) == [0]
    assert shortest_path(children, 3, 0) is None and shortest_path(children, 0, 9) is None
    rows = generate_rows("prosqa", 20, seed=3)
    for row in rows:
        children, _ = _graph(row)
        dist, _ = _bfs_counts(children, row["root"])
        for node, d in dist.items():
            path = shortest_path(dict(children), row["root"], node)
            assert len(path) == d + 1 and path[0] == row["root"] and path[-1] == node
            assert all(b in children[a] for a, b in zip(path, path[1:]))
