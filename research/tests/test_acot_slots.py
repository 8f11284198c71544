"""research/ladder/acot_slots.py: the slot readings of an ACoT model, and the mask that hides the slots
from every later position (the test that tells whether the answer reads them)."""
from __future__ import annotations

import pytest

from research.ladder import acot_slots


@pytest.fixture(scope="module")
def backbone():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import anchored_reasoning.models  # noqa: F401
    from anchored_reasoning.methods.anchored import add_special_tokens
    from anchored_reasoning.models.zoo import resolve_model

    path = resolve_model("logic-gpt2")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    add_special_tokens(tok, model)
    return model, tok


def test_hidden_positions_cannot_reach_the_answer(backbone):
    model, tok = backbone
    prompt = tok("Every wumpus is a yumpus. Bob is a wumpus. Is Bob a yumpus or jompus?")["input_ids"]
    cands = [tok(" Bob is a yumpus.", add_special_tokens=False)["input_ids"],
             tok(" Bob is a jompus.", add_special_tokens=False)["input_ids"]]
    hidden = [1, 2, 3]  # "wumpus is a"
    other = list(prompt)
    for p in hidden:
        other[p] = tok.convert_tokens_to_ids("[PAUSE]")
    plain = acot_slots.choice_scores(model, prompt, cands, [])
    masked = acot_slots.choice_scores(model, prompt, cands, hidden)
    # what the hidden positions hold changes the scores when they are visible, not when hidden
    assert acot_slots.choice_scores(model, other, cands, []) != pytest.approx(plain, abs=1e-3)
    assert acot_slots.choice_scores(model, other, cands, hidden) == pytest.approx(masked, abs=1e-4)
    assert masked != pytest.approx(plain, abs=1e-3)
    # greedy decoding under the same mask: hidden content never changes what is generated
    eos = tok.eos_token_id
    assert acot_slots.greedy(model, other, hidden, 6, eos) == acot_slots.greedy(model, prompt, hidden, 6, eos)


def test_slot_readings_and_summary_on_ladder_problems(backbone):
    from anchored_reasoning.eval.probes import hops_of
    from anchored_reasoning.generators.prosqa import generate_dataset, ladder_size
    from anchored_reasoning.methods import get_method

    model, tok = backbone
    examples = generate_dataset(2, seed=3, split="t", **ladder_size(1)) + generate_dataset(2, seed=3, split="u", **ladder_size(3))
    hops = {ex.id: hops_of(ex) for ex in examples}
    method = get_method("acot", style="trained", k=4, remove_steps_per_stage=1)
    rows = acot_slots.slot_readings(model, tok, method, examples, hops, generate=8)
    assert [r["hops"] for r in rows] == [1, 1, 3, 3]
    for r, ex in zip(rows, examples):
        assert len(r["slots"]) == 4
        anchors = [s["anchor"] for s in r["slots"] if s["anchor"] is not None]
        assert anchors == method.render(ex).anchors  # entity first, then the path
        assert all(s["kind"] in ("right", "path", "graph", "none") for s in r["slots"])
        assert all(len(s["lens"]) == model.config.n_layer for s in r["slots"])
        assert set(r["choice"]) == {"intact", "hidden", "margin_intact", "margin_hidden"}
        assert set(r["greedy"]) == {"intact", "hidden"}
    summary = acot_slots.summarize(rows, {r["id"]: True for r in rows})
    assert set(summary) == {"1", "3"}
    one = summary["1"]
    assert [s["labelled"] for s in one["slots"]] == [2, 2, 0, 0]  # 1 hop: the entity and the answer
    assert [s["labelled"] for s in summary["3"]["slots"]] == [2, 2, 2, 2]
    assert one["greedy_accuracy"] == 1.0 and 0 <= one["forced_choice"]["changed"] <= 2
    assert 0 <= one["greedy_recomputed"]["changed"] <= 2
