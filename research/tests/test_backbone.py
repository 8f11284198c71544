"""research/backbones/backbone.py (the pretraining that built the logic-gpt2* assets): its corpora, its loop, its
records, and the zero-shot probes of the shipped backbones (research/backbones/backbone_probe.py, reverse_lookup.py)."""
from __future__ import annotations

import json
import math
import re

from pathlib import Path

import pytest

from anchored_reasoning.train.data import logic_text
from research.backbones import backbone


def _sentences(text: str) -> list[str]:
    return [s.strip() + "." for s in text.split(".") if s.strip()]


def test_logic_corpus_is_seeded_and_mixes_tasks():
    a = backbone.logic_corpus(200, seed=1)
    b = backbone.logic_corpus(200, seed=1)
    c = backbone.logic_corpus(200, seed=2)
    assert a == b and a != c and len(a) == 200
    counts = {t: sum(1 for tt, _ in a if tt == t) for t in ("prosqa", "prontoqa")}
    expected = {t: sum(share for tt, _, share in backbone.MIXTURE if tt == t) for t in counts}
    for t in counts:
        assert abs(counts[t] / 200 - expected[t]) < 0.05


def test_pretrain_learns_and_saves_a_checkpoint_that_loads(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anchored_reasoning.methods.anchored import SPECIAL_TOKENS

    s = backbone.pretrain(tmp_path / "bb", n_docs=300, max_steps=60, eval_every=20, batch_size=16, lr=3e-3,
                          warmup=5, config={"n_layer": 1, "n_embd": 32, "n_head": 2})
    first, last = s["history"][0], s["history"][-1]
    assert s["steps"] == 60
    assert last["derivation_loss_prosqa"] < first["derivation_loss_prosqa"]
    tok = AutoTokenizer.from_pretrained(tmp_path / "bb")
    assert s["held_out_derivation_loss"]["prosqa"] < math.log(len(tok)) - 1.0  # well below a uniform guess
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "bb")
    for t in SPECIAL_TOKENS:
        assert tok.convert_tokens_to_ids(t) != tok.unk_token_id
    assert model.get_input_embeddings().weight.shape[0] == len(tok)
    card = json.loads((tmp_path / "bb" / "backbone.json").read_text())
    assert card["steps"] == 60 and card["step_separator"] == backbone.STEP_SEPARATOR
    assert not (tmp_path / "bb" / "_tokenizer").exists()


def test_pretrain_with_token_shift_saves_a_shift_gpt2(tmp_path):
    from transformers import AutoModelForCausalLM

    s = backbone.pretrain(tmp_path / "bb", n_docs=64, max_steps=3, eval_every=100, batch_size=8, warmup=1,
                          config={"n_layer": 1, "n_embd": 32, "n_head": 2}, token_shift=2)
    assert s["config"]["token_shift"] == 2
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "bb")
    assert type(model).__name__ == "ShiftGPT2LMHeadModel" and len(model.shift_proj) == 2
    # the projections trained (they start at zero)
    assert any(float(lin.weight.abs().sum()) > 0 for lin in model.shift_proj)


def test_a_continued_backbone_names_where_it_started_without_a_scratch_path(tmp_path):
    """``backbone.json``'s ``init_from``: a shipped backbone by its place in the package, any other folder
    marked as not shipped (its record is kept under ``previous``); every shipped record reads so."""
    import json

    from anchored_reasoning.models.zoo import ASSETS_DIR, LOGIC_SHIFT_DIR

    assert backbone.init_from_record(None) is None
    assert backbone.init_from_record(LOGIC_SHIFT_DIR) == "anchored_reasoning/assets/logic-gpt2-shift"
    assert backbone.init_from_record(tmp_path / "bb") == f"{tmp_path / 'bb'} (not shipped; its record is under previous)"
    for record in ASSETS_DIR.glob("*/backbone.json"):
        node = json.loads(record.read_text())
        while node:
            start = node.get("init_from")
            assert start is None or start.startswith(("anchored_reasoning/assets/", "phase ")) or \
                (start.endswith("(not shipped; its record is under previous)") and node.get("previous")), (record, start)
            node = node.get("previous")


def test_question_aware_corpus_keeps_the_question_and_drills_restate_facts():
    corpus = backbone.qa_corpus(300, seed=3)
    assert corpus == backbone.qa_corpus(300, seed=3)  # seeded
    kinds = {t for t, _ in corpus}
    assert kinds == {"prosqa", "prontoqa", "drill"}
    for task, doc in corpus:
        head, tail = doc.split("\n", 1)
        if task == "prosqa":
            assert " Is " in head and head.endswith("?") and " ### " in tail and tail.endswith(".")
            entity = head[head.rfind(" Is ") + 4:].split(" ")[0]
            assert tail.startswith(entity + " is a ")  # the first step depends on the asked entity
            assert logic_text.document_answer(tail) == tail.rstrip(".").split()[-1]  # the format's reader
        elif task == "prontoqa":
            assert "True or false:" in head and tail.rsplit("### ", 1)[1] in ("True", "False")
            assert logic_text.document_answer(tail) == tail.rsplit("### ", 1)[1]
        else:
            facts = {f.strip() + "." for f in head.split(".") if f.strip()}
            restated = [s.strip() + "." for s in tail.split(".") if s.strip()]
            assert restated and all(s in facts for s in restated)


def test_shipped_shift_backbone_looks_facts_up_and_reads_the_entity():
    """logic-gpt2-shift, zero-shot on held-out shortcut-free problems (research/backbones/backbone_probe.py): its
    first derivation step is a fact of the problem, and on 1 hop its answer is right and follows the asked
    entity; the plain logic-gpt2 on the same problems answers the same whichever entity is asked."""
    from anchored_reasoning.models.zoo import resolve_model
    from research.backbones import backbone_probe

    shift = backbone_probe.probe(resolve_model("logic-gpt2-shift"), [1, 2], 40, 777)
    assert shift["1"]["first_step_is_a_fact"] >= 0.9 and shift["2"]["first_step_is_a_fact"] >= 0.9
    assert shift["1"]["right"] >= 0.8 and shift["1"]["same_under_swap"] <= 0.2
    plain = backbone_probe.probe(resolve_model("logic-gpt2"), [1], 40, 777)
    assert plain["1"]["same_under_swap"] >= 0.5


def test_shipped_search_backbone_searches_and_reads_the_entity_at_every_depth():
    """logic-gpt2-search zero-shot (research/backbones/backbone_probe.py, the committed probe's problems): it writes the
    search from the asked entity and its answer is right and flips with the asked entity on >= 90% of the
    held-out problems at 1, 2 and 3 hops (issue 10, item 1's bar; backbone_probe_search.json)."""
    from anchored_reasoning.models.zoo import resolve_model
    from research.backbones import backbone_probe

    got = backbone_probe.probe(resolve_model("logic-gpt2-search"), [1, 2, 3], 100, 4242, max_new_tokens=160)
    for h, r in got.items():
        assert r["entity_first"] == 1.0, h
        assert r["answer_right"] >= 0.9 and r["answer_flips"] >= 0.9, (h, r["answer_right"], r["answer_flips"])
        assert r["search_first_error"].get("none", 0.0) >= 0.8, (h, r["search_first_error"])


def test_probe_branch_choice_on_a_hand_built_graph():
    """backbone_probe's branch breakdown on a graph known by hand: Tom -> a -> x (the answer),
    Tom -> b -> c (a dead end), Tom -> d -> y (the other option)."""
    from research.backbones import backbone_probe as bp

    children = {"Tom": {"a", "b", "d"}, "a": {"x"}, "b": {"c"}, "d": {"y"}}
    choice = bp.branch_choice([(children, [("Tom", "a")], "Tom", "x"), (children, [("Tom", "b"), ("b", "c")], "Tom", "x"),
                               (children, [], "Tom", "x"), (children, [("Bob", "a")], "Tom", "x")])
    # one of Tom's three children reaches x: a random branch scores 1/3; one of these four derivations took it
    assert choice == {"3+": {"n": 4, "first_step_reaches_answer": 0.25, "random_branch": pytest.approx(1 / 3)}}
    assert bp.branch_choice([({"Tom": {"a"}, "a": {"x"}}, [("Tom", "a")], "Tom", "x")])["1"]["random_branch"] == 1.0


def test_backward_corpus_walks_back_from_the_options_and_drills_reverse_lookups():
    """corpus="backward": walks from each option back to its entity (each step a fact of the problem whose
    object is the previous step's subject) and reverse drills ("<object>: <fact ending in it>")."""
    corpus = backbone.qa_corpus(400, seed=5, mixture="backward")
    assert corpus == backbone.qa_corpus(400, seed=5, mixture="backward")
    assert {t for t, _ in corpus} == {"prosqa", "prontoqa", "drill", "prosqa_back", "rdrill"}
    seen = {"prosqa_back": 0, "rdrill": 0}
    for task, doc in corpus:
        head, tail = doc.split("\n", 1)
        facts = {f.strip() + "." for f in head.split(".") if f.strip() and "?" not in f}
        if task == "rdrill":
            for line in re.findall(r"(\w+): ([^.]+\.)", tail):
                assert line[1] in facts and line[1][:-1].split()[-1] == line[0]
                seen[task] += 1
        elif task == "prosqa_back":
            options = re.search(r"Is (\w+) a (\w+) or (\w+)\?", head).groups()
            walk, answer = tail.rsplit(" ### ", 1)
            heads = re.findall(r"(\w+): ", walk)
            assert sorted(heads) == sorted(options[1:]) and answer == f"{options[0]} is a " + answer.split()[-1]
            prev = None
            for sentence in re.findall(r"(?:\w+: )?([^.:]+\.)", walk):
                sentence = sentence.strip()
                assert sentence in facts
                subject, obj = re.match(r"(?:Every )?(\w+) is a (\w+)\.", sentence).groups()
                if prev is not None and obj != prev:  # a new option's walk starts at the option itself
                    assert obj in options[1:]
                prev = subject
            seen[task] += 1
    assert seen["prosqa_back"] >= 100 and seen["rdrill"] >= 200
    with pytest.raises(ValueError, match="mixture must be"):
        backbone.qa_corpus(10, mixture="backwards")


def test_search_corpus_writes_prosqa_as_the_depth_first_search():
    """corpus="search": ProsQA derivations are the dfs trace -- steps down along facts of the question from the
    asked entity, ``Back to <parent>.`` at dead ends, ending at the answer -- beside ProntoQA and drills; no
    forward proof."""
    corpus = backbone.qa_corpus(300, seed=5, mixture="search")
    assert corpus == backbone.qa_corpus(300, seed=5, mixture="search")
    assert {t for t, _ in corpus} == {"prosqa_dfs", "prontoqa", "drill"}
    backed = 0
    for task, doc in corpus:
        if task != "prosqa_dfs":
            continue
        head, tail = doc.split("\n", 1)
        entity, right, wrong = re.search(r"Is (\w+) a (\w+) or (\w+)\?", head).groups()
        facts = {f.strip() + "." for f in head.split("?")[0].split(".") if f.strip() and not f.strip().startswith("Is ")}
        search, answer = tail.rsplit(" ### ", 1)
        path = [entity]
        for sentence in _sentences(search):
            back = re.fullmatch(r"Back to (\w+)\.", sentence)
            if back:
                path.pop()
                assert path[-1] == back.group(1)
                backed += 1
                continue
            assert sentence in facts
            subject, obj = re.fullmatch(r"(?:Every )?(\w+) is a (\w+)\.", sentence).groups()
            assert subject == path[-1] and obj not in path
            path.append(obj)
        assert path[-1] in (right, wrong) and answer == f"{entity} is a {path[-1]}."
    assert backed > 0
    with pytest.raises(ValueError, match="corpus_kind must be"):
        backbone.pretrain(Path("unused"), corpus_kind="dfs")


def test_reverse_lookup_probe_grades_both_directions():
    import random
    from research.backbones import reverse_lookup

    q = ("Tom is a wumpus. Every wumpus is a lempus. Every gerpus is a lempus. Sam is a gerpus. "
         "Every lempus is a rorpus. Is Tom a rorpus or gerpus?")
    assert reverse_lookup.parse_facts(q)[:2] == [("Tom", "wumpus"), ("wumpus", "lempus")]
    made = reverse_lookup.queries(q, random.Random(1))
    fwd, rev = made["forward"], made["reverse"]
    assert rev["prompt"].endswith(f"{rev['object']}:") and "Is Tom" not in rev["prompt"]
    lempus = {"prompt": "", "right": ["gerpus", "wumpus"], "chance": 0.3, "object": "lempus"}
    assert reverse_lookup.grade("reverse", lempus, " Every gerpus is a lempus. Every")
    assert not reverse_lookup.grade("reverse", lempus, " Every rorpus is a lempus.")
    assert not reverse_lookup.grade("reverse", lempus, " Every gerpus is a rorpus.")
    assert reverse_lookup.grade("forward", {"right": ["lempus"]}, " lempus. Every") and fwd["right"]
