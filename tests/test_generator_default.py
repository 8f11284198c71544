"""The ProsQA generator is shortcut-free by default wherever the graph allows (issue 49 item 8):
small sizes draw the wrong option as deep as the answer, Coconut's published size keeps the
published construction, and a size that cannot match says so."""
from __future__ import annotations

import logging
import math

import pytest

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.generators import prosqa
from anchored_reasoning.generators.shortcuts import RULES, row_problems, rule_scores, worst_rule

N = 2000
#: Hoeffding with a union over the rules: a rule whose expected score is 0.5 (each problem scores 0,
#: 0.5 or 1) exceeds 0.5 + BOUND on N problems with probability below 1e-4. Measured on 20,000
#: problems the best rule is at 0.502-0.505 at these sizes, so the bar holds with margin.
BOUND = math.sqrt(math.log(len(RULES) / 1e-4) / (2 * N))  # 0.054 at N = 2000


@pytest.mark.parametrize("size", [
    {"num_nodes": 7, "min_hops": 1, "max_hops": 2},   # the small recipes' size: 0.73 with the old default
    {"num_nodes": 10, "min_hops": 1, "max_hops": 2},
    {"num_nodes": 14, "min_hops": 1, "max_hops": 3},
])
def test_small_sizes_are_shortcut_free_by_default(size):
    name, score = worst_rule(rule_scores(row_problems(prosqa.generate_rows(N, seed=21, **size))))
    assert score <= 0.5 + BOUND, f"{size}: rule {name!r} scores {score:.3f} with the default neg_depth"
    # the construction the default replaced still carries the shortcut, so the bar above can fail
    old = rule_scores(row_problems(prosqa.generate_rows(N, seed=21, neg_depth="any", **size)))
    assert old["not a direct child of an entity"] > 0.65


def test_auto_is_match_at_small_sizes_and_any_at_the_published_size():
    small = {"num_nodes": 7, "min_hops": 1, "max_hops": 2}
    assert prosqa.ProsQAConfig(**small).resolved_neg_depth == "match"
    assert prosqa.generate_rows(30, seed=4, **small) == prosqa.generate_rows(30, seed=4, neg_depth="match", **small)
    assert prosqa.ProsQAConfig().resolved_neg_depth == "any"  # Coconut's size must match the real split
    assert prosqa.generate_rows(30, seed=4) == prosqa.generate_rows(30, seed=4, neg_depth="any")
    # any other shape is not the published construction, even at 28 nodes
    assert prosqa.ProsQAConfig(min_hops=3, max_hops=3).resolved_neg_depth == "match"
    assert prosqa.ProsQAConfig(num_nodes=7, neg_depth="any").resolved_neg_depth == "any"  # named: kept


def test_a_size_that_cannot_match_falls_back_and_says_so(caplog):
    size = {"num_nodes": 8, "min_hops": 3, "max_hops": 3}  # two 3-hop chains need more nodes than 8 draws keep
    prosqa.resolve_neg_depth.cache_clear()
    with caplog.at_level(logging.WARNING, logger="anchored_reasoning.generators.prosqa"):
        rows = prosqa.generate_rows(5, seed=0, **size)
    assert len(rows) == 5 and all(prosqa.hops_of(r) == 3 for r in rows)
    assert prosqa.ProsQAConfig(**size).resolved_neg_depth == "any"
    (record,) = [r for r in caplog.records if "as deep as the answer" in r.getMessage()]
    message = record.getMessage()
    assert "num_nodes=8" in message and "neg_depth='any'" in message and "raise num_nodes" in message
    with pytest.raises(ConfigError, match="'auto', 'match' or 'any'"):
        prosqa.ProsQAConfig(neg_depth="deep")


def test_the_shortcut_command_measures_any_size(capsys):
    from anchored_reasoning.generators.shortcuts import main

    assert main(["--size", '{"num_nodes": 7, "min_hops": 1, "max_hops": 2, "neg_depth": "any"}', "--n", "300"]) == 0
    first = capsys.readouterr().out.splitlines()[1]
    assert first.endswith("not a direct child of an entity") and float(first.split()[0]) > 0.65
    with pytest.raises(SystemExit):
        main(["--size", "[7]"])
    assert "JSON object" in capsys.readouterr().err
