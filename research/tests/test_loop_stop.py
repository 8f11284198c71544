"""research/ladder/loop_stop.py: where a stop rule would cut a walk, and what it would cost, read off records."""
from __future__ import annotations

import json

from research.ladder import loop_stop

# Tom -> terpus -> gorpus, back to terpus, into gorpus again (a loop), back, lempus
LOOP = "Tom terpus gorpus Back terpus gorpus Back terpus lempus[EoA]"


def test_the_rule_stops_at_the_kth_step_down_into_one_node_and_not_at_back_ups():
    assert LOOP[: loop_stop.stop_at(LOOP, 2)] == "Tom terpus gorpus Back terpus gorpus"
    # back-ups into terpus do not count: it is stepped down into once
    assert loop_stop.stop_at(LOOP, 3) is None
    assert loop_stop.stop_at("Tom terpus lempus[EoA] terpus terpus", 2) is None  # nothing after [EoA] is read
    # another marker word: ``B`` backs up, ``Back`` is then a node like any other
    b_walk = "Tom terpus gorpus B terpus gorpus"
    assert b_walk[: loop_stop.stop_at(b_walk, 2, marker="B")] == b_walk
    assert loop_stop.stop_at(LOOP, 2, marker="B") is not None  # read with B, "Back" is a node: terpus twice
    # the one-token marker glued to the node it backs up from
    token = "Tom terpus gorpus[Back] terpus gorpus"
    assert token[: loop_stop.stop_at(token, 2)] == token
    assert loop_stop.stop_at("Tom terpus gorpus[Back] terpus lempus", 2) is None


def test_the_effect_counts_lost_right_answers_and_the_tokens_up_to_the_stop():
    records = [
        {"id": "a", "sample": 0, "completion": LOOP, "correct": True, "extracted": "lempus", "tokens": 12},
        {"id": "b", "sample": 0, "completion": "Tom terpus lempus[EoA]", "correct": True, "extracted": "lempus", "tokens": 4},
        {"id": "c", "sample": 0, "completion": "Tom gorpus Back Tom gorpus Back Tom gorpus", "correct": False,
         "extracted": None, "tokens": 20},
        {"id": "c", "sample": 1, "completion": LOOP, "correct": True, "extracted": "lempus", "tokens": 12},
    ]
    words = lambda text: len(text.split())  # noqa: E731
    at2 = loop_stop.rule_effect(records, 2, words)
    assert (at2["n"], at2["stopped"], at2["stopped_right"], at2["stopped_unanswered"]) == (3, 2, 1, 1)
    # a: "Tom terpus gorpus Back terpus gorpus" = 6 words; b keeps 4; c stops at "Tom gorpus Back Tom gorpus" = 5
    assert at2["tokens"] == round(36 / 3, 2) and at2["tokens_with_rule"] == round(15 / 3, 2)
    assert at2["accuracy"] == round(2 / 3, 4) and at2["accuracy_with_rule"] == round(1 / 3, 4)
    at3 = loop_stop.rule_effect(records, 3, words)
    assert (at3["stopped"], at3["stopped_right"]) == (1, 0) and at3["accuracy_with_rule"] == at3["accuracy"]


def test_a_rerun_keeps_the_runs_whose_records_are_gone(tmp_path, monkeypatch):
    records = tmp_path / "records.jsonl"
    records.write_text(json.dumps({"id": "a", "sample": 0, "completion": LOOP, "correct": True,
                                   "extracted": "lempus", "tokens": 9}) + "\n")
    walk = {"method": "anchor_chain", "method_options": {"revisits": True}, "_correct": {"a": 1}}
    graded = {"here_s0": {**walk, "run": "unused", "real_test": {"records": str(records)}},
              "gone_s0": {**walk, "run": "unused", "real_test": {"records": str(tmp_path / "gone.jsonl")}},
              "cot_s0": {"method": "cot", "_correct": {"a": 1}, "real_test": {"records": str(records)}}}
    (tmp_path / "graded.json").write_text(json.dumps(graded))
    out = tmp_path / "loop_stop.json"
    out.write_text(json.dumps({"runs": {"gone_s0": [{"k": 2, "kept": True}]}}))

    class Words:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": text.split()}

    import transformers

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", staticmethod(lambda path: Words()))
    assert loop_stop.main(["--graded", str(tmp_path / "graded.json"), "--out", str(out), "--k", "2"]) == 0
    result = json.loads(out.read_text())["runs"]
    assert set(result) == {"here_s0", "gone_s0"} and result["gone_s0"] == [{"k": 2, "kept": True}]
    assert result["here_s0"][0]["stopped_right"] == 1 and result["here_s0"][0]["tokens_with_rule"] == 6
