"""research/binding/assoc_recall.py: documents label each query's object and nothing else, the floor is the
no-subject score, and a short run writes a scored curve."""
from __future__ import annotations

import json
import random

import pytest

from research.binding import assoc_recall as ar


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from anchored_reasoning.models.zoo import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("logic-gpt2"))


@pytest.mark.parametrize("fmt", ["sentence", "adjacent"])
def test_each_query_is_labelled_with_its_subjects_object(tok, fmt):
    docs = ar.Docs(tok, fmt, "replace", 3, 5)
    ex, k, order = docs.make(random.Random(7))
    text = tok.decode(ex.input_ids)
    facts = text.split("\n")[0].replace("<s>", "").strip()
    link = " is a " if fmt == "sentence" else " "
    obj = {f.split(link)[0].strip(): f.split(link)[1] for f in facts.rstrip(".").split(". ")}
    assert len(obj) == k and 3 <= k <= 5
    labelled = [p for p, t in enumerate(ex.labels) if t != ar.IGNORE]
    assert len(labelled) == len(order)
    for p in labelled:
        assert ex.labels[p] == ex.input_ids[p]
        before = tok.decode(ex.input_ids[:p]).rsplit("###", 1)[1]
        subject = before.replace(" is a", "").strip()
        assert tok.decode([ex.labels[p]]).strip() == obj[subject]
    # nothing in the facts is labelled
    first_query = tok.decode(ex.input_ids).index("###")
    assert all(len(tok.decode(ex.input_ids[:p])) > first_query for p in labelled)


def test_reverse_queries_ask_an_object_for_its_one_subject(tok):
    docs = ar.Docs(tok, "sentence", "replace", 4, 6, "reverse")
    ex, k, order = docs.make(random.Random(3))
    facts = tok.decode(ex.input_ids).split("\n")[0].replace("<s>", "").strip()
    subject = {f.split(" is a ")[1]: f.split(" is a ")[0].strip() for f in facts.rstrip(".").split(". ")}
    assert len(subject) == k  # distinct objects: each names one subject
    labelled = [p for p, t in enumerate(ex.labels) if t != ar.IGNORE]
    assert len(labelled) == len(order)
    for p in labelled:
        before = tok.decode(ex.input_ids[:p]).rsplit("###", 1)[1]
        assert before.endswith(":")
        assert tok.decode([ex.labels[p]]).strip() == subject[before[:-1].strip()]


def test_floor_is_the_no_subject_score():
    class D(ar.Docs):
        def __init__(self, queries):
            self.queries = queries
    assert D("replace").floor(4, [0, 0, 1, 3]) == pytest.approx(1.0)  # 4 queries x 1/4
    assert D("shuffle").floor(3, [2, 0, 1]) == pytest.approx(1 / 3 + 1 / 2 + 1)


def test_bad_k_is_refused(tok):
    with pytest.raises(ValueError, match="k must satisfy"):
        ar.Docs(tok, "sentence", "replace", 3, 99)


def test_short_run_writes_a_scored_curve(tmp_path):
    out = tmp_path / "ar.json"
    assert ar.main(["--label", "t", "--steps", "3", "--eval-every", "2", "--eval-docs", "10", "--batch-size", "4",
                    "--llama", "1", "32", "2", "--out", str(out)]) == 0
    run = json.loads(out.read_text())["runs"]["t"]
    assert [p["step"] for p in run["curve"]] == [0, 2, 3] and run["reached_step"] == 3
    ev = run["curve"][-1]["eval"]
    assert 0.0 <= ev["acc"] <= 1.0 and 1 / 6 <= ev["floor"] <= 1 / 2 and ev["queries"] >= 10
