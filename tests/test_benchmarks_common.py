"""benchmarks/common.py's readers of ProntoQA written proofs (prontoqa_mirror's ``chains``): a CoT model's proofs
sentence by sentence (and rule by rule) against the gold proof in an order, an anchor_chain model's bare chains
anchor by anchor against the chain the method trains on."""
from __future__ import annotations

from anchored_reasoning.generators.prontoqa import generate_dataset
from anchored_reasoning.generators.traces import apply_trace
from benchmarks.common import anchor_chain_report, chain_report


def test_chain_report_reads_written_proofs_against_the_gold_order():
    ex = generate_dataset(3, seed=4)
    gold = [s for step in apply_trace([ex[0]], "prontoqa", "backward")[0].steps for s in step.split(". ") if s]
    gold = [s if s.endswith(".") else s + "." for s in gold]
    records = [
        {"id": ex[0].id, "completion": "\n".join(gold) + "[EoR]\n### " + ex[0].answer, "correct": True},
        {"id": ex[1].id, "completion": "Every notaconcept is floral.[EoR]\n### True", "correct": False},
        {"id": ex[2].id, "completion": "[EoR]\n### False", "correct": ex[2].answer == "False"},
    ]
    r = chain_report(ex, records, "backward")
    assert r["n"] == 3 and r["exact_proofs"] == 1 and r["conclusion_is_gold"] == 1
    assert r["first_error"] == {"none": 1, "step_made_up": 1, "stopped_short": 1}
    assert r["gold_sentence_at_position"][0] == 1
    assert r["by_rule"]["exact_proofs"] == 1

    # the same proof with one rule in other words: wrong as text, right as a rule
    i = next(k for k, s in enumerate(gold) if s.startswith(("Every ", "Each ")))
    q, _, rest = gold[i].partition(" ")
    reworded = gold[:i] + [("Each " if q == "Every" else "Every ") + rest] + gold[i + 1:]
    records[0] = {"id": ex[0].id, "completion": "\n".join(reworded) + "[EoR]\n### " + ex[0].answer, "correct": True}
    r = chain_report(ex, records, "backward")
    assert r["exact_proofs"] == 0 and r["by_rule"]["exact_proofs"] == 1
    assert r["first_error"]["step_in_question"] == 1 and r["by_rule"]["first_error"]["none"] == 1


def test_anchor_chain_report_reads_written_chains_against_the_gold_chain():
    """The bare chain ``Sally rompus impus not sour[EoA]`` is read anchor by anchor against the target the
    method trains on; the first wrong anchor is a real word of the question or a made-up one."""
    from anchored_reasoning.methods.anchor_chain import AnchorChain

    ex = generate_dataset(4, seed=4, hops=2, mirror_distractor=True)
    gold = [AnchorChain().render(e, "prontoqa").target for e in ex]
    chain0 = gold[0].split("[EoA]")[0].split()
    other = next(w for w in ex[1].question.replace(".", " ").split() if w.endswith("pus") and w not in gold[1])
    records = [
        {"id": ex[0].id, "completion": gold[0], "correct": True},
        {"id": ex[1].id, "completion": " ".join(gold[1].split("[EoA]")[0].split()[:1] + [other]) + "[EoA]\nx\n### True",
         "correct": False},
        {"id": ex[2].id, "completion": gold[2].split()[0] + " blorpus[EoA]\n### False", "correct": False},
        {"id": ex[3].id, "completion": gold[3].split("[EoA]")[0].split()[0] + "[EoA]\n### True", "correct": False},
    ]
    r = anchor_chain_report(ex, records)
    assert r["n"] == 4 and r["exact_chains"] == 1 and r["conclusion_is_gold"] == 1
    assert r["answer_right_when_conclusion_is_gold"] == 1
    assert r["first_error"] == {"none": 1, "in_question": 1, "made_up": 1, "stopped_short": 1}
    assert r["gold_anchor_at_position"][: len(chain0)] == [4, 1] + [1] * (len(chain0) - 2)
