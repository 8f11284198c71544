"""The trained-style methods: one render path, curriculum stages, answer lines the graders read."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.methods import Rendered, get_method, list_methods
from anchored_reasoning.methods.anchor_chain import AnchorChain
from anchored_reasoning.methods.anchored import (
    ANT,
    BOA,
    BOR,
    EOA,
    EOR,
    PAUSE,
    SPECIAL_TOKENS,
    ACoT,
    Pause,
    Stepwise,
    TrainedCoT,
    TrainedMethod,
    TrainedNoCoT,
    add_special_tokens,
    answer_line,
    task_name_of,
)
from anchored_reasoning.tasks import get_task
from anchored_reasoning.tasks.loaders import RowContext, gsm8k_row, prontoqa_row, prosqa_row
from anchored_reasoning.types import Example, Prompt

DATA = os.environ.get("ANCHORED_REASONING_DATA")
needs_data = pytest.mark.skipif(
    not DATA or not Path(DATA).is_dir(), reason="ANCHORED_REASONING_DATA is not set to the shared data folder"
)
METHODS = ["nocot", "cot", "pause", "acot", "stepwise"]


def gsm8k_example() -> Example:
    row = {
        "question": "Janet’s ducks lay 16 eggs per day. She eats three and bakes with four. She sells the rest for $2 each. How much does she make?",
        "answer": "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18",
    }
    return gsm8k_row(row, RowContext(index=0, split="test"))


def prosqa_example() -> Example:
    row = {
        "question": "Tom is a terpus. Every terpus is a brimpus. Every brimpus is a lempus. Bob is a gorpus. Is Tom a gorpus or lempus?",
        "answer": "Tom is a lempus.",
        "steps": ["Tom is a terpus.", "Every terpus is a brimpus.", "Every brimpus is a lempus."],
        "idx_to_symbol": ["Tom", "Bob", "terpus", "brimpus", "lempus", "gorpus"],
        "edges": [[0, 2], [2, 3], [3, 4], [1, 5]],
        "root": 0,
        "target": 4,
        "neg_target": 5,
    }
    return prosqa_row(row, RowContext(index=0, split="test"))


def prontoqa_example(answer: str = "False") -> Example:
    row = {
        "question": "Stella is a zumpus. Zumpuses are gorpuses. Every gorpus is floral. True or false: Stella is not floral.",
        "steps": ["Stella is a zumpus. Zumpuses are gorpuses.", "Stella is a gorpus. Every gorpus is floral.", "Stella is floral."],
        "answer": answer,
    }
    return prontoqa_row(row, RowContext(index=0, split="test"))


EXAMPLES = {"gsm8k": gsm8k_example, "prosqa": prosqa_example, "prontoqa": prontoqa_example}


def all_variants():
    for name in METHODS:
        for opts in ({}, {"k": 2, "remove_steps_per_stage": 1}, {"step_format": "calculations"}):
            if name in ("nocot", "cot") and opts:
                continue
            method = get_method(name, style="trained", **opts)
            for stage in range(method.num_stages):
                yield method.with_stage(stage)


def between(text: str, start: str, end: str) -> str:
    return text[text.index(start) + len(start) : text.index(end)]


# ------------------------------------------------------------------------ registry


def test_trained_style_dispatch_keeps_instruct_methods():
    assert isinstance(get_method("cot", style="trained"), TrainedCoT)
    assert isinstance(get_method("nocot", style="trained"), TrainedNoCoT)
    assert not isinstance(get_method("cot"), TrainedMethod)  # plain get_method stays instruct
    assert isinstance(get_method("acot", style="trained"), ACoT)
    assert isinstance(get_method("acot"), ACoT)  # trained-only names resolve in either style
    assert isinstance(get_method("pause"), Pause) and isinstance(get_method("stepwise"), Stepwise)
    assert {"trained:cot", "acot", "pause", "stepwise"} <= set(list_methods())
    with pytest.raises(ConfigError, match="style"):
        get_method("cot", style="fancy")
    with pytest.raises(ConfigError, match="kk"):
        get_method("acot", style="trained", kk=3)
    with pytest.raises(ConfigError, match="k must be"):
        get_method("acot", style="trained", k=-1)
    with pytest.raises(ConfigError, match="stage"):
        get_method("acot", style="trained", k=2, stage=9)


def test_options_round_trip_through_json():
    for method in all_variants():
        options = json.loads(json.dumps(method.options))
        again = get_method(method.name, style="trained", **options)
        assert again == method
        for task, make in EXAMPLES.items():
            assert again.render(make(), task) == method.render(make(), task)


# ------------------------------------------------------------------------ one render path


@pytest.mark.parametrize("task", sorted(EXAMPLES))
def test_prompt_text_is_the_rendered_prompt(task):
    example = EXAMPLES[task]()
    for method in all_variants():
        rendered = method.render(example, task)
        assert isinstance(rendered, Rendered)
        prompt = method.prompt(example, task)
        assert isinstance(prompt, Prompt) and prompt.text == rendered.prompt
        assert rendered.prompt.startswith(example.question)
        # the prompt holds everything up to [BoR]; the target never holds a slot token
        assert not any(tok in rendered.target for tok in (BOA, ANT, EOA, PAUSE, BOR))
        assert rendered.prompt.endswith(BOR) == (method.name != "nocot")
        assert (EOR in rendered.target) == (method.name != "nocot")


def test_task_object_and_inferred_task_render_the_same():
    class T:
        name = "prosqa"

    method = get_method("acot", style="trained", k=3)
    for task, make in EXAMPLES.items():
        example = make()
        assert task_name_of(None, example) == task
        assert method.render(example) == method.render(example, task)
    assert method.render(prosqa_example(), T()) == method.render(prosqa_example(), "prosqa")


# ------------------------------------------------------------------------ slots and stages


def test_acot_has_min_stage_k_ant_slots_and_anchors():
    example = prosqa_example()
    method = get_method("acot", style="trained", k=2)
    assert method.num_stages == 3 and method.stage == 2  # built at its final stage
    for stage in range(method.num_stages):
        r = method.with_stage(stage).render(example, "prosqa")
        n = min(stage, 2)
        if n == 0:
            assert BOA not in r.prompt and EOA not in r.prompt and r.anchors == []
        else:
            assert between(r.prompt, BOA, EOA) == ANT * n
            assert r.prompt.count(ANT) == n
            assert r.anchors == ["Tom", "terpus", "brimpus"][:n]
    # more slots than anchors: anchors stop, slots stay (no loss on the extra ones)
    r = get_method("acot", style="trained", k=6).render(example, "prosqa")
    assert r.prompt.count(ANT) == 6 and r.anchors == ["Tom", "terpus", "brimpus", "lempus"]


def test_acot_stage_zero_is_plain_cot_and_pause_only_differs_by_slot_tokens():
    cot = get_method("cot", style="trained")
    acot = get_method("acot", style="trained", k=3)
    pause = get_method("pause", style="trained", k=3)
    for task, make in EXAMPLES.items():
        example = make()
        assert acot.with_stage(0).render(example, task) == cot.render(example, task)
        for stage in range(acot.num_stages):
            a = acot.with_stage(stage).render(example, task)
            p = pause.with_stage(stage).render(example, task)
            assert p.anchors == []
            assert p.prompt.count(PAUSE) == a.prompt.count(ANT) == min(stage, 3)
            assert p.target == a.target
            assert p.prompt.replace(PAUSE, "") == a.prompt.replace(ANT, "").replace(BOA, "").replace(EOA, "")


def test_tokens_per_anchor_widens_every_anchor_to_that_many_slots_for_acot_and_pause():
    example = gsm8k_example()
    acot = get_method("acot", style="trained", k=2, tokens_per_anchor=3)
    pause = get_method("pause", style="trained", k=2, tokens_per_anchor=3)
    for stage in range(acot.num_stages):
        a = acot.with_stage(stage).render(example, "gsm8k")
        p = pause.with_stage(stage).render(example, "gsm8k")
        assert a.prompt.count(ANT) == p.prompt.count(PAUSE) == 3 * min(stage, 2) == acot.with_stage(stage).slot_tokens()
        assert a.anchors == ["16", "3"][: min(stage, 2)]  # still one anchor per stage
        assert a.tokens_per_anchor == 3
    assert get_method("acot", style="trained", **acot.options).options == acot.options
    assert get_method("acot", style="trained", k=2).render(example, "gsm8k").prompt.count(ANT) == 2  # default 1
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="tokens_per_anchor"):
            get_method("acot", style="trained", tokens_per_anchor=bad)


def test_stage_switch_changes_rendered_data():
    example = gsm8k_example()
    method = get_method("acot", style="trained", k=2)
    renders = [method.with_stage(s).render(example, "gsm8k") for s in range(method.num_stages)]
    assert len({r.prompt for r in renders}) == method.num_stages
    assert [r.anchors for r in renders] == [[], ["16"], ["16", "3"]]
    # with_stage clamps past the end and refuses negatives
    assert method.with_stage(99).stage == method.num_stages - 1
    with pytest.raises(ConfigError):
        method.with_stage(-1)


def test_stepwise_removes_one_more_leading_step_per_stage():
    example = prosqa_example()
    steps = example.steps
    method = get_method("stepwise", style="trained", stages=2)
    assert method.num_stages == 4  # stage 0 (all steps), 1, 2, then a last stage with none
    targets = [method.with_stage(s).render(example, "prosqa").target for s in range(method.num_stages)]
    assert targets[0] == "\n".join(steps) + EOR + "\n### Tom is a lempus."
    assert targets[1] == "\n".join(steps[1:]) + EOR + "\n### Tom is a lempus."
    assert targets[2] == "\n".join(steps[2:]) + EOR + "\n### Tom is a lempus."
    assert targets[3] == EOR + "\n### Tom is a lempus."
    no_final = get_method("stepwise", style="trained", stages=2, final_stage_removes_all=False)
    assert no_final.num_stages == 3


def test_acot_prosqa_schedule_removes_steps_and_ends_with_the_answer_only():
    example = prosqa_example()
    method = get_method("acot", style="trained", k=6, remove_steps_per_stage=1)
    assert method.num_stages == 8
    final = method.render(example, "prosqa")
    assert final.target == EOR + "\n### Tom is a lempus."
    assert final.prompt.count(ANT) == 6 and final.anchors == ["Tom", "terpus", "brimpus", "lempus"]
    kept = [method.with_stage(s).render(example, "prosqa").target.count("\n") for s in range(4)]
    assert kept == [3, 2, 1, 1]  # steps joined by newlines, then "\n" before the answer line


def test_calculation_steps_for_gsm8k():
    method = get_method("cot", style="trained", step_format="calculations")
    r = method.render(gsm8k_example(), "gsm8k")
    assert r.target == "<<16-3-4=9>>\n<<9*2=18>>" + EOR + "\n#### 18"
    # tasks without calculations keep their text steps
    assert method.render(prosqa_example(), "prosqa") == get_method("cot", style="trained").render(prosqa_example(), "prosqa")
    with pytest.raises(ConfigError, match="step_format"):
        get_method("cot", style="trained", step_format="latex")


def test_step_separator_joins_the_kept_steps_and_survives_the_checkpoint_options():
    """step_separator=" " writes the steps the way the logic backbones were pretrained (space-joined); the
    option is in ``options`` (what a checkpoint records), so evaluation rebuilds the same method."""
    spaced = get_method("acot", style="trained", k=2, remove_steps_per_stage=1, step_separator=" ").with_stage(0)
    r = spaced.render(prosqa_example(), "prosqa")
    plain = get_method("acot", style="trained", k=2, remove_steps_per_stage=1).with_stage(0).render(prosqa_example(), "prosqa")
    assert r.target == plain.target.replace(".\n", ". ", len(prosqa_example().steps) - 1)
    assert "\n" not in r.target.split(EOR)[0] and r.prompt == plain.prompt
    assert get_method("acot", style="trained", **spaced.options).render(prosqa_example(), "prosqa") == r
    with pytest.raises(ConfigError, match="step_separator"):
        get_method("cot", style="trained", step_separator=" | ")


# ------------------------------------------------------------------------ answer lines and graders


def test_answer_lines():
    assert answer_line(gsm8k_example(), "gsm8k") == "#### 18"
    assert answer_line(prosqa_example(), "prosqa") == "### Tom is a lempus."
    assert answer_line(prontoqa_example(), "prontoqa") == "### False"
    concept_only = Example(id="c", question="Facts. Is Tom a gorpus or lempus?", answer="lempus")
    assert answer_line(concept_only, "prosqa") == "### Tom is a lempus."


def test_anchor_chain_decodes_the_anchors_then_answers():
    method = get_method("anchor_chain", style="trained")
    assert isinstance(method, AnchorChain) and isinstance(get_method("anchor_chain"), AnchorChain)
    example = prosqa_example()
    r = method.render(example, "prosqa")
    assert r.prompt == example.question + "\n" + BOA and method.prompt(example, "prosqa").text == r.prompt
    # every node of the path, entity first, down to the answer; no slot to label
    assert r.target == "Tom terpus brimpus lempus" + EOA + "\n### Tom is a lempus." and r.anchors == []
    assert get_method("anchor_chain", style="trained", max_anchors=2).render(example, "prosqa").target.startswith("Tom terpus" + EOA)
    g = get_method("anchor_chain", style="trained").render(gsm8k_example(), "gsm8k")
    assert g.target == "16 3 4 9 2 18" + EOA + "\n#### 18"
    assert method.num_stages == 1
    # ProntoQA: the conclusion's polarity stays on the last anchor (the answer turns on it)
    pronto = prontoqa_example()  # "... Every gorpus is floral." -> "Stella is floral."
    assert method.render(pronto, "prontoqa").target == "Stella zumpus gorpus floral" + EOA + "\nStella is floral.\n### False"
    bare = get_method("anchor_chain", style="trained", conclusion=False)
    assert bare.render(pronto, "prontoqa").target == "Stella zumpus gorpus floral" + EOA + "\n### False"
    negated = Example(id="n", question=pronto.question, answer="True",
                      steps=["Stella is a zumpus. Zumpuses are gorpuses.", "Stella is a gorpus. Every gorpus is not floral.",
                             "Stella is not floral."])
    assert method.render(negated, "prontoqa").target.startswith("Stella zumpus gorpus not floral" + EOA)
    assert get_method("anchor_chain", style="trained", negation=False).render(negated, "prontoqa").target.startswith(
        "Stella zumpus gorpus floral" + EOA)
    with pytest.raises(ConfigError, match="negation"):
        get_method("anchor_chain", style="trained", negation="yes")
    with pytest.raises(ConfigError, match="conclusion"):
        get_method("anchor_chain", style="trained", conclusion=1)
    with pytest.raises(ConfigError, match="max_anchors"):
        get_method("anchor_chain", style="trained", max_anchors=0)


def test_anchor_chain_with_revisits_writes_a_searchs_walk():
    """``revisits``: the node each step arrives at, so the chain keeps a written search's back-ups."""
    search = Example(id="s", question="Facts. Is Tom a gorpus or lempus?", answer="Tom is a lempus.",
                     steps=["Tom is a terpus.", "Every terpus is a gorpus.", "Back to terpus.", "Every terpus is a lempus."])
    walk = get_method("anchor_chain", style="trained", revisits=True)
    assert walk.render(search, "prosqa").target == "Tom terpus gorpus terpus lempus" + EOA + "\n### Tom is a lempus."
    assert get_method("anchor_chain", style="trained").render(search, "prosqa").target.startswith("Tom terpus gorpus lempus" + EOA)
    # on a proof the walk is the chain; max_anchors caps it the same way
    assert walk.render(prosqa_example(), "prosqa").target == get_method("anchor_chain", style="trained").render(
        prosqa_example(), "prosqa").target
    assert get_method("anchor_chain", style="trained", revisits=True, max_anchors=3).render(search, "prosqa").target.startswith(
        "Tom terpus gorpus" + EOA)
    with pytest.raises(ConfigError, match="revisits"):
        walk.render(gsm8k_example(), "gsm8k")
    with pytest.raises(ConfigError, match="revisits"):
        get_method("anchor_chain", style="trained", revisits="yes")


def test_a_walk_can_mark_its_back_ups():
    """``mark_backups``: a node the walk returns to is written after ``Back``, so a back-up reads apart from a
    step down (its replay: tests/test_search_probe.py)."""
    search = Example(id="s", question="Facts. Is Tom a gorpus or lempus?", answer="Tom is a lempus.",
                     steps=["Tom is a terpus.", "Every terpus is a gorpus.", "Back to terpus.", "Every terpus is a lempus."])
    marked = get_method("anchor_chain", style="trained", revisits=True, mark_backups=True)
    assert marked.render(search, "prosqa").target == "Tom terpus gorpus Back terpus lempus" + EOA + "\n### Tom is a lempus."
    # a proof never backs up: nothing to mark
    assert marked.render(prosqa_example(), "prosqa").target == get_method("anchor_chain", style="trained").render(
        prosqa_example(), "prosqa").target
    with pytest.raises(ConfigError, match="mark_backups needs revisits"):
        get_method("anchor_chain", style="trained", mark_backups=True)
    with pytest.raises(ConfigError, match="mark_backups"):
        get_method("anchor_chain", style="trained", revisits=True, mark_backups="yes")
    # the one-token marker: ``[Back]`` glued to the node backed up from, an added token of the method's own
    token = get_method("anchor_chain", style="trained", revisits=True, mark_backups=True, backup_marker="token")
    assert token.render(search, "prosqa").target == "Tom terpus gorpus[Back] terpus lempus" + EOA + "\n### Tom is a lempus."
    assert token.added_tokens == ("[Back]",) and marked.added_tokens == ()
    with pytest.raises(ConfigError, match="backup_marker must be one of"):
        get_method("anchor_chain", style="trained", revisits=True, mark_backups=True, backup_marker="Up")
    with pytest.raises(ConfigError, match="backup_marker needs mark_backups"):
        get_method("anchor_chain", style="trained", revisits=True, backup_marker="token")
    # where the marker's embedding starts: the word's tokens, or (default) the resize's
    assert token.added_token_inits == {} and marked.added_token_inits == {}
    word_init = get_method("anchor_chain", style="trained", revisits=True, mark_backups=True, backup_marker="token",
                           backup_marker_init="word")
    assert word_init.added_token_inits == {"[Back]": " Back"}
    assert word_init.render(search, "prosqa").target == token.render(search, "prosqa").target
    with pytest.raises(ConfigError, match="backup_marker_init must be one of"):
        get_method("anchor_chain", style="trained", revisits=True, mark_backups=True, backup_marker="token",
                   backup_marker_init="zero")
    with pytest.raises(ConfigError, match="backup_marker_init needs backup_marker: token"):
        get_method("anchor_chain", style="trained", revisits=True, mark_backups=True, backup_marker_init="word")
    # a wider fresh marker: the word's two positions without its pretrained meaning
    wide = get_method("anchor_chain", style="trained", revisits=True, mark_backups=True, backup_marker="token",
                      backup_marker_width=2)
    assert wide.render(search, "prosqa").target == "Tom terpus gorpus[Back][Back] terpus lempus" + EOA + "\n### Tom is a lempus."
    assert wide.added_tokens == ("[Back]",)
    for bad in (0, True, 1.5):
        with pytest.raises(ConfigError, match="backup_marker_width must be an integer"):
            get_method("anchor_chain", style="trained", revisits=True, mark_backups=True, backup_marker="token",
                       backup_marker_width=bad)
    with pytest.raises(ConfigError, match="backup_marker_width needs backup_marker: token"):
        get_method("anchor_chain", style="trained", revisits=True, mark_backups=True, backup_marker_width=2)
    # another marker word: ``B`` (the first of ``Back``'s two tokens with the logic tokenizer)
    one = get_method("anchor_chain", style="trained", revisits=True, mark_backups=True, backup_word="B")
    assert one.render(search, "prosqa").target == "Tom terpus gorpus B terpus lempus" + EOA + "\n### Tom is a lempus."
    assert one.added_tokens == ()
    # the chain's last node as the answer: no answer line, and the task's extractor reads it from the chain
    noline = get_method("anchor_chain", style="trained", revisits=True, mark_backups=True, answer_line=False)
    target = noline.render(search, "prosqa").target
    assert target == "Tom terpus gorpus Back terpus lempus" + EOA
    from anchored_reasoning.tasks import get_task
    import dataclasses
    graded = dataclasses.replace(search, meta={"entity": "Tom", "answer_concept": "lempus", "neg_concept": "gorpus"})
    assert get_task("prosqa").extract(target, graded) == "lempus"
    assert get_task("prosqa").extract("Tom terpus gorpus" + EOA, graded) == "gorpus"  # where the chain ends
    with pytest.raises(ConfigError, match="answer_line: false needs the whole chain"):
        get_method("anchor_chain", style="trained", answer_line=False, max_anchors=3)
    with pytest.raises(ConfigError, match="answer_line must be true or false"):
        get_method("anchor_chain", style="trained", answer_line="no")
    prontoqa = Example(id="p", question="Facts. True or false: Stella is floral?", answer="False",
                       steps=["Stella is a lorpus.", "Every lorpus is not floral.", "Stella is not floral."])
    with pytest.raises(ConfigError, match="anchor_chain: option answer_line: false needs ProsQA.*'prontoqa'"):
        get_method("anchor_chain", style="trained", answer_line=False).render(prontoqa, "prontoqa")
    # a word of the question (a name, a concept) would read as a node of the walk: refused at render, naming it
    for clash in ("Tom", "lempus"):
        named = get_method("anchor_chain", style="trained", revisits=True, mark_backups=True, backup_word=clash)
        with pytest.raises(ConfigError, match=f"backup_word '{clash}' is a word of the question of example 's'"):
            named.render(search, "prosqa")
    assert get_method("anchor_chain", style="trained", revisits=True, mark_backups=True,
                      backup_word="Lemp").render(search, "prosqa").target.startswith("Tom terpus gorpus Lemp terpus")
    for bad in ("", "Go back", "B1", 3):
        with pytest.raises(ConfigError, match="backup_word must be one word of letters"):
            get_method("anchor_chain", style="trained", revisits=True, mark_backups=True, backup_word=bad)
    for needs in ({"revisits": True}, {"revisits": True, "mark_backups": True, "backup_marker": "token"}):
        with pytest.raises(ConfigError, match="backup_word needs mark_backups: true and backup_marker: word"):
            get_method("anchor_chain", style="trained", backup_word="B", **needs)


def test_cot_without_its_answer_line_ends_at_the_answer_its_steps_reach():
    """``answer_line: false`` (ProsQA): the target stops at ``[EoR]`` and the grader reads the steps' last option."""
    from anchored_reasoning.generators.traces import apply_trace

    row = {
        "question": "Tom is a terpus. Every terpus is a zumpus. Every terpus is a brimpus. Every brimpus is a lempus. "
                    "Bob is a gorpus. Is Tom a gorpus or lempus?",
        "answer": "Tom is a lempus.",
        "steps": ["Tom is a terpus.", "Every terpus is a brimpus.", "Every brimpus is a lempus."],
        "idx_to_symbol": ["Tom", "Bob", "terpus", "brimpus", "lempus", "gorpus", "zumpus"],
        "edges": [[0, 2], [2, 6], [2, 3], [3, 4], [1, 5]],
        "root": 0, "target": 4, "neg_target": 5,
    }
    example = prosqa_row(row, RowContext(index=0, split="test"))
    cot = get_method("cot", style="trained")
    noline = get_method("cot", style="trained", answer_line=False)
    assert cot.render(example, "prosqa").target.endswith(EOR + "\n### Tom is a lempus.")
    rendered = noline.render(example, "prosqa")
    assert rendered.target == "Tom is a terpus.\nEvery terpus is a brimpus.\nEvery brimpus is a lempus." + EOR
    assert rendered.prompt == cot.render(example, "prosqa").prompt
    task = get_task("prosqa")
    assert task.extract(rendered.target, example) == "lempus"
    # the search: a dead end backed up from, the answer still the last option named
    (searched,) = apply_trace([example], "prosqa", "dfs")
    target = get_method("cot", style="trained", answer_line=False, step_separator=" ").render(searched, "prosqa").target
    assert target == ("Tom is a terpus. Every terpus is a zumpus. Back to terpus. Every terpus is a brimpus. "
                      "Every brimpus is a lempus." + EOR)
    assert task.extract(target, example) == "lempus"
    # steps that stop short of the answer would train a wrong (or no) answer: refused, naming the example
    short = dataclasses.replace(example, steps=["Tom is a terpus.", "Every terpus is a brimpus."])
    with pytest.raises(DataError, match="do not end at the answer"):
        noline.render(short, "prosqa")
    assert noline.prompt(short, "prosqa").text == rendered.prompt  # asking needs no target
    with pytest.raises(ConfigError, match="cot: option answer_line: false needs ProsQA.*'gsm8k'"):
        noline.render(gsm8k_example(), "gsm8k")
    with pytest.raises(ConfigError, match="answer_line must be true or false"):
        get_method("cot", style="trained", answer_line="no")
    with pytest.raises(ConfigError):  # the other trained methods have no such option
        get_method("pause", style="trained", answer_line=False)


def test_a_method_s_own_tokens_are_added_once_and_cost_one_token_a_back_up():
    """``add_special_tokens(extra=method.added_tokens)``: ``[Back]`` becomes one token, the model's embeddings
    grow with the vocabulary, and ``impus[Back] rempus`` is one token longer than ``impus rempus``."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from anchored_reasoning.methods.anchored import add_special_tokens
    from anchored_reasoning.models.zoo import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("logic-gpt2-search"))
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_layer=1, n_head=2, n_embd=8, n_positions=64))
    method = get_method("anchor_chain", style="trained", revisits=True, mark_backups=True, backup_marker="token")
    assert add_special_tokens(tok, model, extra=method.added_tokens) >= 1
    assert add_special_tokens(tok, model, extra=method.added_tokens) == 0
    assert model.get_input_embeddings().weight.shape[0] == len(tok)
    assert tok.convert_ids_to_tokens(tok.convert_tokens_to_ids("[Back]")) == "[Back]"
    plain, marked, wide = (len(tok(text)["input_ids"]) for text in (
        " Tom terpus gorpus terpus", " Tom terpus gorpus[Back] terpus", " Tom terpus gorpus[Back][Back] terpus"))
    assert marked == plain + 1 and wide == plain + 2


@pytest.mark.parametrize("tied", [True, False])
def test_an_added_token_can_start_as_the_mean_of_a_words_embeddings(tied):
    """``add_special_tokens(init=method.added_token_inits)``: ``[Back]``'s new input row (and output row, where
    the head is not tied) is the mean of `` Back``'s token rows; a second call leaves a trained row alone."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from anchored_reasoning.models.zoo import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("logic-gpt2-search"))
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_layer=1, n_head=2, n_embd=8, n_positions=64,
                                       tie_word_embeddings=tied))
    method = get_method("anchor_chain", style="trained", revisits=True, mark_backups=True, backup_marker="token",
                        backup_marker_init="word")
    add_special_tokens(tok, model, extra=method.added_tokens, init=method.added_token_inits)
    row, word = tok.convert_tokens_to_ids("[Back]"), tok(" Back", add_special_tokens=False)["input_ids"]
    assert len(word) == 2
    for table in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
        assert torch.allclose(table[row], table[word].mean(0))
    assert (model.get_input_embeddings().weight is model.get_output_embeddings().weight) == tied
    with torch.no_grad():
        model.get_input_embeddings().weight[row] += 1.0
    trained = model.get_input_embeddings().weight[row].clone()
    add_special_tokens(tok, model, extra=method.added_tokens, init=method.added_token_inits)
    assert torch.equal(model.get_input_embeddings().weight[row], trained)


def test_an_init_text_must_be_base_vocabulary():
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from anchored_reasoning.models.zoo import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("logic-gpt2-search"))
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_layer=1, n_head=2, n_embd=8, n_positions=64))
    with pytest.raises(ConfigError, match="cannot initialise"):
        add_special_tokens(tok, model, extra=["[Back]"], init={"[Back]": "[BoA]"})


@pytest.mark.parametrize("task", sorted(EXAMPLES))
def test_gold_targets_grade_correct(task):
    grader = get_task(task)
    examples = [EXAMPLES[task]()] + ([prontoqa_example("True")] if task == "prontoqa" else [])
    for example in examples:
        for method in [*all_variants(), get_method("anchor_chain", style="trained")]:
            target = method.render(example, task).target
            grade = grader.grade(target, example)
            assert grade.correct, (method.name, method.stage, target, grade)


@needs_data
@pytest.mark.parametrize("task", ["gsm8k", "prosqa", "prontoqa"])
def test_gold_targets_grade_correct_on_real_data(task):
    t = get_task(task)
    examples = t.load("test", data_dir=DATA)
    methods = [get_method(n, style="trained") for n in METHODS] + [
        get_method("acot", style="trained", k=6, remove_steps_per_stage=1).with_stage(s) for s in (0, 2)
    ] + [get_method("acot", style="trained", k=2, step_format="calculations"), get_method("anchor_chain", style="trained")]
    for example in examples:
        for method in methods:
            r = method.render(example, task)
            assert t.grade(r.target, example).correct, (example.id, method.name, r.target)
            assert method.prompt(example, task).text == r.prompt


# ------------------------------------------------------------------------ tokenizer


def test_add_special_tokens_is_idempotent_and_resizes(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anchored_reasoning.testing import make_tiny_causal_lm

    path = make_tiny_causal_lm(tmp_path / "tiny")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    before = len(tok)
    assert add_special_tokens(tok, model) == len(SPECIAL_TOKENS)
    assert len(tok) == before + len(SPECIAL_TOKENS)
    assert model.get_input_embeddings().weight.shape[0] >= len(tok)
    assert model.get_output_embeddings().weight.shape[0] >= len(tok)
    assert add_special_tokens(tok, model) == 0 and len(tok) == before + len(SPECIAL_TOKENS)
    # each special token is one id, whatever surrounds it
    r = get_method("acot", style="trained", k=3).render(prosqa_example(), "prosqa")
    ids = tok(r.prompt, add_special_tokens=False)["input_ids"]
    ant = tok.convert_tokens_to_ids(ANT)
    assert ids.count(ant) == 3
    assert ids[-6:] == [tok.convert_tokens_to_ids(t) for t in (BOA, ANT, ANT, ANT, EOA, BOR)]
