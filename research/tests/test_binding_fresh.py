"""research/binding/binding_fresh.py: the recall drill labels each re-stated fact's object and nothing else,
and a short run scores held-out problems and writes its curve."""
from __future__ import annotations

import json
import random

from research.binding import binding_fresh as bf

QUESTION = "Every wumpus is a yumpus. Bob is a wumpus. Bob is a zumpus. Alex is a jompus. Is Bob a yumpus or jompus?"


def test_facts_and_their_objects():
    facts = bf.split_facts(QUESTION)
    assert facts == ["Every wumpus is a yumpus.", "Bob is a wumpus.", "Bob is a zumpus.", "Alex is a jompus."]
    assert bf.objects_by_subject(facts) == {"Every wumpus is a": {"yumpus"}, "Bob is a": {"wumpus", "zumpus"},
                                            "Alex is a": {"jompus"}}


def test_recall_doc_labels_objects_only():
    from transformers import AutoTokenizer

    from anchored_reasoning.models.zoo import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("logic-gpt2"))
    facts = bf.split_facts(QUESTION)
    ids, labels, heads = bf.recall_doc(tok, facts, random.Random(0), "### ")
    assert len(ids) == len(labels) and sorted(heads) == sorted(f[:-1].rsplit(" ", 1)[0] for f in facts)
    labelled = [(p, t) for p, t in enumerate(labels) if t != bf.IGNORE]
    assert len(labelled) == len(facts)
    for (p, t), head in zip(labelled, heads):
        assert ids[p] == t  # the label is the token at that position (the loss shifts it)
        assert tok.decode([t]).strip() in bf.objects_by_subject(facts)[head]
    # the re-stated part starts after the facts: nothing in the facts themselves is labelled
    n_facts = len(tok(" ".join(facts) + "\n")["input_ids"])
    assert all(p >= n_facts for p, _ in labelled)


def test_short_run_writes_a_scored_curve(tmp_path):
    out = tmp_path / "binding.json"
    assert bf.main(["--label", "t", "--steps", "2", "--eval-every", "2", "--eval-n", "4", "--batch-size", "4",
                    "--recall", "0.5", "--out", str(out)]) == 0
    run = json.loads(out.read_text())["runs"]["t"]
    assert run["reached_step"] == 2 and [p["step"] for p in run["curve"]] == [1, 2]
    score = run["curve"][-1]["eval"]["1"]
    assert score["n"] >= 1 and 0.0 <= score["acc"] <= 1.0 and 0.0 <= score["recall_hit"] <= 1.0
    assert score["both"] <= score["acc"]


def test_recall_floor_names_the_most_frequent_object_for_every_fact():
    # every object once: the first, "yumpus", is named; only the wumpus fact has it as an object
    assert bf.recall_floor(bf.split_facts(QUESTION)) == (1, 4)
    shared = "Bob is a wumpus. Bob is a zumpus. Alex is a zumpus. Is Bob a wumpus or zumpus?"
    # "zumpus" is the most frequent object and an object of both subjects: the floor is perfect here
    assert bf.recall_floor(bf.split_facts(shared)) == (3, 3)


def test_floors_are_per_depth_shares():
    held = bf.held_out([1], 6)
    floor = bf.floors(held, [1])
    assert set(floor) == {"1"} and 0.0 < floor["1"] <= 1.0


def test_forced_choice_context_is_the_training_prefix_of_the_answer_word():
    """The scored position must be the one training predicts the answer word from (regression: a
    trailing space used to end the context with a lone " " token, never seen before an object)."""
    from anchored_reasoning.generators.prosqa import rows_to_examples

    bench = bf.Bench(bf.parse_args(["--label", "t", "--eval-n", "3"]))
    row = bench.held[0][0]
    ex = bench.encode(row)
    r = bench.method.render(rows_to_examples([row])[0], bench.task)
    answer = row["answer"].rstrip(".").split()[-1]
    ctx = bench.context_ids(r.prompt, r.target[: r.target.rindex(answer)])
    answer_tok = bench.tok(" " + answer, add_special_tokens=False)["input_ids"][0]
    assert ex.input_ids[: len(ctx)] == ctx and ex.input_ids[len(ctx)] == answer_tok
