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
    # back-ups marked (``mark_backups``): the same search, and a marked node that is not the parent is no step down
    marked = [f"Back {n}" if n in walk[:i] else n for i, n in enumerate(walk)]
    assert marked[4] == "Back zhorpus"
    r = replay(ex, chain(marked), "walk")
    assert r["exact"] and r["first_error"] == "none" and r["legal_steps"] == len(walk) - 1
    assert replay(ex, chain(marked[:4] + ["Back boompus"]), "walk")["first_error"] == "wrong_parent"
    assert replay(ex, chain(marked[:3] + ["Back boompus"]), "walk")["first_error"] == "backed_up_early"
    # the one-token marker, glued to the node before the back-up: read as the same search
    glued = " ".join(n + "[Back]" if i + 1 < len(walk) and walk[i + 1] in walk[:i + 1] else n for i, n in enumerate(walk))
    assert "[Back] zhorpus" in glued
    assert replay(ex, chain([glued]), "walk") == r
    assert replay(ex, chain([glued.replace("[Back]", "[Back][Back]")]), "walk") == r  # backup_marker_width 2
    # another marker word (``backup_word``): read as the same search when named, a made-up step when not
    other = [n.replace("Back ", "B ") for n in marked]
    assert other[4] == "B zhorpus"
    assert replay(ex, chain(other), "walk", marker="B") == r
    assert replay(ex, chain(other), "walk")["first_error"] == "made_up"
    # and the default word is then a node, not a back-up: a run trained on ``B`` that writes ``Back`` steps nowhere
    assert replay(ex, chain(marked), "walk", marker="B")["first_error"] == "made_up"
    assert replay(ex, chain([" ".join(other[:4]) + " Back" + other[4][1:]] + other[5:]), "walk", marker="B")["legal_steps"] == 3


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


def test_where_the_first_error_falls_and_the_rate_after_each_kind_of_move(test_split):
    """A rule broken right after a back-up is told from one after a step down; the summary divides the
    errors after each kind of move by the moves made after it."""
    from anchored_reasoning.anchors import logic_walk

    ex = test_split[0]
    walk = logic_walk(prosqa_dfs(ex))  # Sally boompus zhorpus tumpus zhorpus(back) ...

    def chain(nodes):
        return " ".join(nodes) + "[EoA]\n### Sally is a sterpus."

    r = replay(ex, chain(walk), "walk")
    assert r["after"] is None and r["detail"] is None  # no rule broken
    assert sum(r["moves_after"].values()) == r["legal_steps"] == len(walk) - 1
    back_ups = len(walk) - len(set(walk))  # each returns to a node already written; the walk ends going down
    assert r["moves_after"]["start"] == 1 and r["moves_after"]["back"] == back_ups > 0
    just_left = replay(ex, chain(walk[:5] + ["tumpus"]), "walk")  # back at zhorpus, down to tumpus again
    assert (just_left["first_error"], just_left["after"], just_left["detail"]) == ("revisit", "back", "just_left")
    assert just_left["moves_after"] == {"start": 1, "down": 3, "back": 1}
    made_up = replay(ex, chain(walk[:3] + ["sterpus"]), "walk")  # zhorpus -> sterpus is no fact
    assert (made_up["first_error"], made_up["after"]) == ("made_up", "down")
    assert made_up["detail"] in ("child_of_visited", "elsewhere_in_question")
    assert replay(ex, chain(walk[:3] + ["wugpus"]), "walk")["detail"] == "not_in_question"
    # a child of the entity, written under zhorpus: a fact of the question from the wrong concept
    assert replay(ex, chain(walk[:3] + ["gerpus"]), "walk")["detail"] == "child_of_visited"
    records = [{"id": ex.id, "completion": chain(nodes), "correct": False}
               for nodes in (walk, walk[:5] + ["tumpus"], walk[:3] + ["wugpus"])]
    s = search_summary(records, test_split, form="walk")
    assert s["hazard"]["back"]["errors"] == 1 and s["hazard"]["down"]["errors"] == 1 and s["hazard"]["start"]["errors"] == 0
    assert s["hazard"]["down"]["rate"] == round(1 / s["hazard"]["down"]["moves"], 4)
    assert s["detail"] == {"revisit:just_left:after_back": 1, "made_up:not_in_question:after_down": 1}
