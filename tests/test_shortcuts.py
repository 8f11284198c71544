"""The generated problems the demo and the depth ladder train on carry no surface shortcut."""
import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.generators import prosqa
from anchored_reasoning.generators.shortcuts import RULES, parse, row_problems, rule_scores, worst_rule

N = 1000


@pytest.mark.parametrize("hops", sorted(prosqa.LADDER_NODES))
def test_ladder_sizes_have_no_surface_shortcut(hops):
    rows = prosqa.generate_rows(N if hops < 4 else 400, seed=11, **prosqa.ladder_size(hops))
    name, score = worst_rule(rule_scores(row_problems(rows)))
    # 0.55 is the bar; with 400-1000 problems a fair coin stays below it (2.5 sd at n=400)
    assert score <= 0.55, f"{hops}-hop ladder size: rule {name!r} scores {score:.3f}"


def test_demo_size_has_no_surface_shortcut():
    rows = []
    for hops in prosqa.DEMO_HOPS:
        rows += prosqa.generate_rows(N // len(prosqa.DEMO_HOPS), seed=12, **prosqa.ladder_size(hops))
    name, score = worst_rule(rule_scores(row_problems(rows)))
    assert score <= 0.55, f"demo problems: rule {name!r} scores {score:.3f}"


def test_default_size_with_matched_depth_has_no_surface_shortcut():
    rows = prosqa.generate_rows(300, seed=13, neg_depth="match")
    name, score = worst_rule(rule_scores(row_problems(rows)))
    assert score <= 0.56, f"default size, neg_depth=match: rule {name!r} scores {score:.3f}"


def test_the_check_finds_the_shortcut_of_the_old_small_size():
    # the first demo's problems: 7 nodes, 1-2 hops, wrong option at any depth
    rows = prosqa.generate_rows(N, seed=14, num_nodes=7, min_hops=1, max_hops=2, neg_depth="any")
    scores = rule_scores(row_problems(rows))
    assert scores["not a direct child of an entity"] > 0.65
    assert worst_rule(scores)[1] > 0.65


def test_matched_depth_puts_the_wrong_option_as_deep_as_the_answer():
    for row in prosqa.generate_rows(100, seed=15, **prosqa.ladder_size(3)):
        children = defaultdict(list)
        for a, b in row["edges"]:
            children[a].append(b)
        other = 1 - row["root"]
        assert prosqa._bfs(children, row["root"])[row["target"]] == 3
        assert prosqa._bfs(children, other)[row["neg_target"]] == 3
        assert row["neg_target"] not in prosqa._bfs(children, row["root"])


def test_impossible_matched_depth_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"neg_depth='match'.*num_nodes=10"):
        prosqa.generate_rows(1, seed=0, num_nodes=10, min_hops=6, max_hops=6, neg_depth="match", max_tries=200)
    with pytest.raises(ConfigError, match="neg_depth"):
        prosqa.generate_rows(1, seed=0, neg_depth="deep")
    with pytest.raises(ConfigError, match="ladder"):
        prosqa.ladder_size(9)


def test_rules_read_text_only_and_undecided_scores_half():
    q = "Tom is a wumpus. Bob is a lempus. Is Tom a wumpus or lempus?"
    facts, entity, options = parse(q)
    assert entity == "Tom" and options == ("wumpus", "lempus") and len(facts) == 2
    scores = rule_scores([(q, "wumpus")])
    assert scores["object of an Every-fact"] == 0.5  # neither option is: undecided
    assert scores["first option"] == 1.0 and scores["second option"] == 0.0
    assert set(scores) == set(RULES)
    with pytest.raises(ValueError, match="not one of"):
        rule_scores([(q, "gorpus")])


@pytest.mark.data
def test_real_test_split_is_reported():
    data = os.environ.get("ANCHORED_REASONING_DATA")
    if not data or not (Path(data) / "prosqa" / "test.json").is_file():
        pytest.skip("needs $ANCHORED_REASONING_DATA with prosqa/test.json")
    rows = json.loads((Path(data) / "prosqa" / "test.json").read_text())
    scores = rule_scores(row_problems(rows))
    # measured, not a bar: the published split lets "less frequent in the facts" score 0.662
    assert abs(scores["less frequent in the facts"] - 0.662) < 1e-3
    assert abs(scores["not a direct child of an entity"] - 0.5) > 0.04
