"""ProntoQA surface rules (generators/prontoqa_shortcuts.py): the published construction is answered by
one look-up without the proof; ``mirror_distractor`` problems are not."""
from __future__ import annotations

import os

import pytest

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.generators.prontoqa import generate_dataset
from anchored_reasoning.generators.prontoqa_shortcuts import RULES, main, parse, rule_scores
from anchored_reasoning.generators.traces import prontoqa_rules


def _problems(examples):
    return [(e.question, e.answer) for e in examples]


def test_the_published_construction_is_answered_by_the_recurring_concepts_rule():
    scores = rule_scores(_problems(generate_dataset(300, seed=5)))
    assert set(scores) == set(RULES)
    assert scores["property_rule_of_a_recurring_concept"] == 1.0
    assert all(0.4 <= v <= 0.6 for k, v in scores.items() if k != "property_rule_of_a_recurring_concept")


@pytest.mark.parametrize("hops", [2, 3, 4, 5])
def test_mirrored_distractors_leave_no_rule_above_0_55(hops):
    scores = rule_scores(_problems(generate_dataset(1000, seed=11, hops=hops, mirror_distractor=True)))
    assert max(scores.values()) <= 0.55, scores


@pytest.mark.parametrize("hops", [2, 3, 5])
def test_mirrored_problems_keep_a_valid_proof_and_two_opposite_property_rules(hops):
    for ex in generate_dataset(100, seed=2, hops=hops, mirror_distractor=True):
        rules = prontoqa_rules(ex.question)
        for step in ex.steps[:-1]:
            assert step.split(". ", 1)[1] in ex.question
        _, negated, with_prop = parse(ex.question)
        assert len(with_prop) == 2 and with_prop[0][1] != with_prop[1][1]
        assert (" not " in ex.steps[-1]) == (negated == (ex.answer == "True"))
        # the distractor's concept is named as often as the proof's last concept (no counting shortcut)
        named = {c: sum(c in (s, o) for s, _, o in rules) for c in (with_prop[0][0], with_prop[1][0])}
        assert len(set(named.values())) == 1, named


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="True or false"):
        parse("Is Tom a wumpus or a yumpus?")
    with pytest.raises(ConfigError, match="mirror_distractor"):
        generate_dataset(1, mirror_distractor="yes")
    with pytest.raises(ConfigError, match="mirror_distractor needs hops >= 2, got hops=1"):
        generate_dataset(1, hops=1, mirror_distractor=True)  # one hop cannot hide the count rule
    with pytest.raises(ValueError):
        rule_scores([])


def test_cli_scores_generated_problems(capsys):
    assert main(["--generated", "50", "--hops", "3", "--mirror-distractor"]) == 0
    assert '"n": 50' in capsys.readouterr().out


@pytest.mark.data
@pytest.mark.skipif(not os.environ.get("ANCHORED_REASONING_DATA"), reason="ANCHORED_REASONING_DATA is not set")
def test_the_real_test_split_has_the_shortcut():
    from anchored_reasoning.tasks import get_task

    scores = rule_scores(_problems(get_task("prontoqa").load("test")))
    assert scores["property_rule_of_a_recurring_concept"] == 1.0
    assert max(v for k, v in scores.items() if k != "property_rule_of_a_recurring_concept") <= 0.55
