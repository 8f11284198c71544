"""eval/search_probe.py: a written depth-first search replayed against the problem, its first error named."""
from __future__ import annotations

import os

import pytest

from anchored_reasoning.eval.search_probe import replay, search_summary
from anchored_reasoning.generators.traces import prosqa_dfs
from anchored_reasoning.tasks import get_task


@pytest.fixture(scope="module")
def test_split():
    return get_task("prosqa").load("test", data_dir=os.environ.get("ANCHORED_REASONING_DATA"))


def _completion(steps, answer="sterpus"):
    return " ".join(steps) + f"[EoR]\n### Sally is a {answer}."


def test_the_trace_itself_replays_exactly_to_the_answer(test_split):
    for ex in test_split[:50]:
        for paths in (False, True):
            r = replay(ex, _completion(prosqa_dfs(ex, paths=paths)), "dfs_paths" if paths else "dfs")
            assert r["exact"] and r["first_error"] == "none" and r["ended_at"] == ex.meta["answer_concept"]
            assert r["legal_steps"] == r["steps"] and r["out_of_order"] == 0


def test_each_broken_rule_is_named(test_split):
    ex = test_split[0]  # Sally: boompus -> zhorpus -> tumpus (dead end) ... -> sterpus
    gold = prosqa_dfs(ex)
    assert gold[:4] == ["Sally is a boompus.", "Every boompus is a zhorpus.", "Every zhorpus is a tumpus.", "Back to zhorpus."]
    cases = {
        "made_up": gold[:1] + ["Every boompus is a sterpus."],
        "revisit": gold[:3] + ["Back to zhorpus.", "Back to boompus.", "Every boompus is a zhorpus."],
        "backed_up_early": gold[:2] + ["Back to boompus."],
        "wrong_parent": gold[:3] + ["Back to boompus."],
        "unparsed": gold[:2] + ["Sally likes zhorpuses."],
        "ran_on": gold + ["Back to rempus."],
        "stopped_short": gold[:5],
    }
    for error, steps in cases.items():
        r = replay(ex, _completion(steps))
        assert r["first_error"] == error, (error, r)
        assert not r["exact"]
    r = replay(ex, _completion(gold[:4]))
    assert r["first_error"] == "stopped_short" and r["ended_at"] == "zhorpus" and r["legal_steps"] == 4


def test_paths_and_a_legal_step_out_of_order(test_split):
    ex = test_split[0]
    paths = prosqa_dfs(ex, paths=True)
    assert replay(ex, _completion(paths[:2] + ["Sally boompus zhorpus tumpus rempus."]), "dfs_paths")["first_error"] == "unparsed"
    assert replay(ex, _completion(paths[:1] + ["Sally."]), "dfs_paths")["first_error"] == "backed_up_early"
    # the gold proof is a legal search with one step out of order (Sally's children, in the question's order:
    # boompus, gerpus, terpus, scrompus, zumpus; then scrompus -> rempus -> sterpus are first children)
    assert ex.steps == ["Sally is a scrompus.", "Every scrompus is a rempus.", "Every rempus is a sterpus."]
    r = replay(ex, _completion(ex.steps))
    assert r["first_error"] == "none" and r["out_of_order"] == 1 and not r["exact"] and r["legal_steps"] == 3


def test_a_walk_of_nodes_replays_like_the_search_it_abbreviates(test_split):
    """form="walk": the ``anchor_chain`` method with ``revisits`` writes the node each step arrives at."""
    from anchored_reasoning.anchors import logic_walk

    ex = test_split[0]
    walk = logic_walk(prosqa_dfs(ex))
    assert walk[:5] == ["Sally", "boompus", "zhorpus", "tumpus", "zhorpus"]

    def chain(nodes):
        return " ".join(nodes) + "[EoA]\n### Sally is a sterpus."

    r = replay(ex, chain(walk), "walk")
    assert r["exact"] and r["first_error"] == "none" and r["ended_at"] == "sterpus" and r["legal_steps"] == len(walk) - 1
    assert replay(ex, chain(walk[1:]), "walk")["exact"]  # the entity may be left out
    cases = {"made_up": walk[:2] + ["sterpus"], "backed_up_early": walk[:3] + ["boompus"],
             "revisit": walk[:5] + ["tumpus"], "stopped_short": walk[:4]}
    for error, nodes in cases.items():
        assert replay(ex, chain(nodes), "walk")["first_error"] == error, error
    with pytest.raises(ValueError, match="walk"):
        replay(ex, chain(walk), "chain")


def test_summary_counts_searches_and_whether_the_answer_follows(test_split):
    ex = test_split[0]
    gold = prosqa_dfs(ex)
    records = [
        {"id": ex.id, "sample": 0, "completion": _completion(gold), "extracted": "sterpus", "correct": True},
        {"id": ex.id, "sample": 1, "completion": "", "extracted": None, "correct": False},  # not the first sample
        {"id": ex.id, "sample": 0, "completion": _completion(gold[:2]), "extracted": "hilpus", "correct": False},
        {"id": "elsewhere", "completion": "", "correct": False},
    ]
    s = search_summary(records, test_split)
    assert s["n"] == 2 and s["exact"] == 1 and s["reached_answer"] == 1 and s["answer_follows_search"] == 1
    assert s["first_error"]["none"] == 1 and s["first_error"]["stopped_short"] == 1
    assert s["right_when_search_reached"] == 1 and s["otherwise"] == 1 and s["right_otherwise"] == 0
