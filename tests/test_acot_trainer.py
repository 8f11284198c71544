"""AnchoredSFTTrainer, its collator and the curriculum callback, on a tiny offline model (seconds)."""
from __future__ import annotations

import copy

import pytest
import torch

from anchored_reasoning.errors import DataError
from anchored_reasoning.methods import Rendered, get_method
from anchored_reasoning.methods.anchored import ANT, add_special_tokens
from anchored_reasoning.train.trainers.acot_trainer import AnchoredSFTConfig, AnchoredSFTTrainer
from anchored_reasoning.train.data.collate import (
    IGNORE,
    AnchoredCollator,
    anchor_label_ids,
    examples_dataset,
    tokenize_rendered,
)
from anchored_reasoning.train.callbacks.curriculum import CurriculumCallback, GenerationEvaluator, planned_steps
from anchored_reasoning.types import Example

torch.set_num_threads(1)

NAMES = ["Tom", "Alex", "Sally", "Max", "Rex", "Fae"]
CONCEPTS = ["wumpus", "tumpus", "lempus", "brimpus", "gorpus", "terpus", "sterpus", "zumpus"]


def prosqa_like(i: int) -> Example:
    """A small ProsQA-shaped example (3-step path) built by hand."""
    name = NAMES[i % len(NAMES)]
    a, b, c, d = (CONCEPTS[(i + j) % len(CONCEPTS)] for j in range(4))
    return Example(
        id=f"p{i}",
        question=f"Every {a} is a {b}. Every {b} is a {c}. {name} is a {a}. Is {name} a {c} or {d}?",
        answer=f"{name} is a {c}.",
        steps=[f"{name} is a {a}.", f"Every {a} is a {b}.", f"Every {b} is a {c}."],
        meta={"task": "prosqa"},
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anchored_reasoning.testing import make_tiny_causal_lm

    texts = [prosqa_like(i).question + " " + " ".join(prosqa_like(i).steps) for i in range(12)]
    path = make_tiny_causal_lm(tmp_path_factory.mktemp("tiny"), texts=texts, hidden_size=32, vocab_size=400)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    add_special_tokens(tok, model)
    return path, tok, model


def fresh_model(tiny):
    return copy.deepcopy(tiny[2])


def train(tiny, method, examples, tmp_path, model=None, **cfg):
    _, tok, _ = tiny
    model = fresh_model(tiny) if model is None else model
    collator = AnchoredCollator(tok, method, task="prosqa")
    callbacks = cfg.pop("callbacks", None)
    settings = {"per_device_train_batch_size": 4, "learning_rate": 1e-3, "logging_steps": 1, "disable_tqdm": True}
    args = AnchoredSFTConfig(output_dir=str(tmp_path / "out"), **{**settings, **cfg})
    trainer = AnchoredSFTTrainer(
        model=model,
        args=args,
        train_dataset=examples_dataset(examples),
        data_collator=collator,
        processing_class=tok,
        callbacks=callbacks,
    )
    trainer.train()
    return trainer, collator


# ---------------------------------------------------------------------------------------------
# render path -> labels

def test_ant_labels_sit_exactly_at_ant_positions_and_prompt_has_no_lm_loss(tiny):
    _, tok, _ = tiny
    method = get_method("acot", style="trained", k=3)
    ex = prosqa_like(0)
    rendered = method.render(ex, "prosqa")
    assert rendered.anchors == ["Tom", "wumpus", "tumpus"]
    ant_id = tok.convert_tokens_to_ids(ANT)
    item = tokenize_rendered(rendered, tok, ant_id=ant_id)
    prompt_ids = tok(rendered.prompt)["input_ids"]
    target_ids = tok(rendered.target, add_special_tokens=False)["input_ids"]
    assert item.input_ids == prompt_ids + target_ids + [tok.eos_token_id]
    # no LM loss anywhere on the prompt, LM loss on every target token and the EOS
    assert item.labels[: len(prompt_ids)] == [IGNORE] * len(prompt_ids)
    assert item.labels[len(prompt_ids) :] == target_ids + [tok.eos_token_id]
    ant_positions = [i for i, t in enumerate(item.input_ids) if t == ant_id]
    assert len(ant_positions) == 3
    labelled = [i for i, a in enumerate(item.anchor_labels) if a != IGNORE]
    assert labelled == ant_positions
    expected = [tok(" " + a, add_special_tokens=False)["input_ids"][0] for a in rendered.anchors]
    assert [item.anchor_labels[i] for i in ant_positions] == expected
    assert (item.n_slots, item.n_anchor_labels) == (3, 3)


def test_extra_slots_get_no_anchor_label(tiny):
    _, tok, _ = tiny
    ant_id = tok.convert_tokens_to_ids(ANT)
    r = Rendered(prompt="Q?\n[BoA]" + ANT * 4 + "[EoA][BoR]", target="x", anchors=["Tom"])
    item = tokenize_rendered(r, tok, ant_id=ant_id)
    slots = [i for i, t in enumerate(item.input_ids) if t == ant_id]
    assert [item.anchor_labels[slots[0]]] == anchor_label_ids(tok, "Tom")
    assert all(item.anchor_labels[p] == IGNORE for p in slots[1:])
    assert (item.n_slots, item.n_anchor_labels) == (4, 1)


def test_ant_as_last_prompt_token_is_a_clear_error(tiny):
    _, tok, _ = tiny
    r = Rendered(prompt="Q? " + ANT, target="x", anchors=["Tom"])
    with pytest.raises(DataError, match="last prompt token"):
        tokenize_rendered(r, tok, ant_id=tok.convert_tokens_to_ids(ANT), where="example 7")


def test_non_acot_methods_have_no_anchor_labels(tiny):
    _, tok, _ = tiny
    batch_rows = examples_dataset([prosqa_like(i) for i in range(3)])
    for name in ("nocot", "cot", "pause", "stepwise"):
        collator = AnchoredCollator(tok, get_method(name, style="trained"), task="prosqa")
        batch = collator([batch_rows[i] for i in range(3)])
        assert (batch["anchor_labels"] == IGNORE).all(), name


# ---------------------------------------------------------------------------------------------
# the override is the code that runs, and computes the right thing

def test_override_runs_and_logs_anchor_loss(tiny, tmp_path):
    method = get_method("acot", style="trained", k=3)
    trainer, _ = train(tiny, method, [prosqa_like(i) for i in range(8)], tmp_path, max_steps=3)
    assert trainer.compute_loss_calls == 3
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs and all(h["anchor_loss"] > 0 for h in logs)
    assert all(0.0 <= h["anchor_accuracy"] <= 1.0 for h in logs)
    assert all("lm_loss" in h for h in logs)
    # the logged total is lm + gamma * anchor (gamma 1)
    assert logs[0]["loss"] == pytest.approx(logs[0]["lm_loss"] + logs[0]["anchor_loss"], rel=1e-4)


def _loss_and_grad(tiny, gamma, batch):
    _, tok, _ = tiny
    model = fresh_model(tiny)
    args = AnchoredSFTConfig(output_dir="/tmp/unused-acot-test", gamma=gamma, disable_tqdm=True)
    trainer = AnchoredSFTTrainer(
        model=model, args=args, train_dataset=examples_dataset([prosqa_like(0)]),
        data_collator=lambda rows: rows, processing_class=tok,
    )
    model.train()
    loss = trainer.compute_loss(model, dict(batch))
    loss.backward()
    grad = model.get_input_embeddings().weight.grad.clone()
    return loss.detach(), grad, model


def test_losses_match_a_manual_computation_and_gamma_changes_the_gradient(tiny):
    _, tok, _ = tiny
    method = get_method("acot", style="trained", k=3)
    collator = AnchoredCollator(tok, method, task="prosqa")
    rows = examples_dataset([prosqa_like(i) for i in range(3)])
    batch = collator([rows[i] for i in range(3)])

    loss0, grad0, model = _loss_and_grad(tiny, 0.0, batch)
    loss1, grad1, _ = _loss_and_grad(tiny, 1.0, batch)
    loss2, grad2, _ = _loss_and_grad(tiny, 2.0, batch)

    # manual: the model's own shifted LM loss, and CE of the logits AT [ANT] slots vs the anchors
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    lm = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.size(-1)), batch["labels"][:, 1:].reshape(-1), ignore_index=IGNORE
    )
    anchor = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), batch["anchor_labels"].reshape(-1), ignore_index=IGNORE
    )
    assert loss0.item() == pytest.approx(lm.item(), rel=1e-4)
    assert loss1.item() == pytest.approx(lm.item() + anchor.item(), rel=1e-4)
    assert loss2.item() == pytest.approx(lm.item() + 2 * anchor.item(), rel=1e-4)
    assert not torch.allclose(grad0, grad1)
    # the gradient is linear in gamma
    assert torch.allclose(grad2 - grad1, grad1 - grad0, atol=1e-5)


def test_examples_without_anchors_train_and_are_counted(tiny, tmp_path):
    method = get_method("acot", style="trained", k=3)
    examples = [prosqa_like(i) for i in range(6)]
    examples += [Example(id=f"bare{i}", question="Is Tom a wumpus or tumpus?", answer="Tom is a wumpus.", steps=[],
                         meta={"task": "prosqa"}) for i in range(2)]
    trainer, collator = train(tiny, method, examples, tmp_path, max_steps=2, per_device_train_batch_size=4)
    assert trainer.compute_loss_calls == 2
    assert collator.stats["no_anchors"] >= 1
    assert trainer.examples_no_anchors == collator.stats["no_anchors"]
    last = [h for h in trainer.state.log_history if "loss" in h][-1]
    assert last["examples_no_anchors"] == trainer.examples_no_anchors
    # a batch made only of anchorless examples: LM loss only, finite
    only_bare = AnchoredCollator(tiny[1], method, task="prosqa")
    rows = examples_dataset(examples[-2:])
    batch = only_bare([rows[0], rows[1]])
    assert (batch["anchor_labels"] == IGNORE).all() and batch["anchor_slots"].tolist() == [3, 3]
    loss = trainer.compute_loss(trainer.model, dict(batch))
    assert torch.isfinite(loss)


# ---------------------------------------------------------------------------------------------
# curriculum

def test_stage_switch_changes_rendered_data(tiny):
    _, tok, _ = tiny
    method = get_method("acot", style="trained", k=3, remove_steps_per_stage=1)
    collator = AnchoredCollator(tok, method, task="prosqa")
    rows = examples_dataset([prosqa_like(0)])
    ant_id = tok.convert_tokens_to_ids(ANT)
    seen = []
    for stage in range(method.num_stages):
        collator.set_stage(stage)
        batch = collator([rows[0]])
        target = tok.decode(batch["input_ids"][0][batch["labels"][0] != IGNORE])
        seen.append(((batch["input_ids"] == ant_id).sum().item(), target.count(" is a ")))
    # one more [ANT] per stage; one more leading step removed per stage (3 steps + the answer line)
    assert seen == [(0, 4), (1, 3), (2, 2), (3, 1), (3, 1)]


def test_curriculum_callback_moves_stages_resets_optimizer_and_keeps_best(tiny, tmp_path):
    _, tok, _ = tiny
    method = get_method("acot", style="trained", k=2)
    examples = [prosqa_like(i) for i in range(8)]
    # a toy grader: "correct" when the completion is non-empty (the tiny model says something)
    evaluator = GenerationEvaluator(tok, examples[:2], grade=lambda text, ex: len(text) > 0, max_new_tokens=4)
    placeholder = AnchoredCollator(tok, method, task="prosqa")
    cb = CurriculumCallback(placeholder, method, curriculum=True, schedule="epochs", epochs_per_stage=1,
                            evaluator=evaluator, reset_optimizer=True)
    model = fresh_model(tiny)
    args = AnchoredSFTConfig(output_dir=str(tmp_path / "o"), per_device_train_batch_size=4, num_train_epochs=3,
                             learning_rate=1e-3, logging_steps=1, disable_tqdm=True)
    trainer = AnchoredSFTTrainer(model=model, args=args, train_dataset=examples_dataset(examples),
                                 data_collator=placeholder, processing_class=tok, callbacks=[cb])
    trainer.train()
    stages = [h["stage"] for h in cb.history if h["event"] == "stage"]
    assert stages == [0, 1, 2]
    # a 3-epoch run of a 3-epoch schedule switches at epochs 1 and 2 (2 steps an epoch)
    assert [h["step"] for h in cb.history if h["event"] == "stage"] == [0, 2, 4]
    assert trainer.state.max_steps == planned_steps(args, len(examples)) == 6
    assert cb.optimizer_resets == 2
    assert placeholder.stage == 2
    evals = [h for h in cb.history if h["event"] == "eval"]
    assert [e["stage"] for e in evals] == [0, 1, 2]
    assert cb.best is not None and cb.best["stage"] == 2  # only final-stage evaluations compete


@pytest.mark.parametrize("epochs, eval_steps", [(2, 2), (2, 3)])
def test_eval_steps_grade_on_schedule_and_the_last_step_once(tiny, tmp_path, epochs, eval_steps):
    """Every ``eval_steps`` steps, then at the end of training unless the last step was just graded."""
    _, tok, _ = tiny
    method = get_method("cot", style="trained")
    examples = [prosqa_like(i) for i in range(8)]
    evaluator = GenerationEvaluator(tok, examples[:2], grade=lambda text, ex: True, max_new_tokens=2)
    collator = AnchoredCollator(tok, method, task="prosqa")
    cb = CurriculumCallback(collator, method, curriculum=False, evaluator=evaluator, eval_steps=eval_steps)
    args = AnchoredSFTConfig(output_dir=str(tmp_path / "o"), per_device_train_batch_size=4, num_train_epochs=epochs,
                             learning_rate=1e-3, logging_steps=1, disable_tqdm=True)
    AnchoredSFTTrainer(model=fresh_model(tiny), args=args, train_dataset=examples_dataset(examples),
                       data_collator=collator, processing_class=tok, callbacks=[cb]).train()
    evals = [(h["step"], h["reason"]) for h in cb.history if h["event"] == "eval"]
    if eval_steps == 2:  # 4 steps: graded at 2 and 4, and not again at the end
        assert evals == [(2, "every 2 steps"), (4, "every 2 steps")]
    else:
        assert evals == [(3, "every 3 steps"), (4, "end of training")]


@pytest.mark.parametrize("keep_rows", [True, False])
def test_first_step_after_a_stage_switch_trains_the_new_format(tiny, tmp_path, keep_rows):
    """accelerate prefetches one batch; with keep_rows the trainer re-renders it at the new stage."""
    _, tok, _ = tiny
    method = get_method("acot", style="trained", k=2)
    examples = [prosqa_like(i) for i in range(24)]
    collator = AnchoredCollator(tok, method, task="prosqa", keep_rows=keep_rows)
    # switches in the middle of the one epoch (after steps 2 and 4), where the loader has prefetched
    cb = CurriculumCallback(collator, method, curriculum=True, schedule="fraction", stage_fraction=1 / 3,
                            reset_optimizer=False)
    ant_id = tok.convert_tokens_to_ids(ANT)
    seen = []

    class Recording(AnchoredSFTTrainer):
        def compute_loss(self, model, inputs, *a, **k):
            assert "collated_rows" not in inputs and "collated_stage" not in inputs
            seen.append(int((inputs["input_ids"][0] == ant_id).sum()))  # [ANT] slots = the stage rendered
            return super().compute_loss(model, inputs, *a, **k)

    args = AnchoredSFTConfig(output_dir=str(tmp_path / "o"), per_device_train_batch_size=4, max_steps=6,
                             learning_rate=1e-3, logging_steps=1, disable_tqdm=True)
    trainer = Recording(model=fresh_model(tiny), args=args, train_dataset=examples_dataset(examples),
                        data_collator=collator, processing_class=tok, callbacks=[cb])
    trainer.train()
    # stage s renders s [ANT] slots
    if keep_rows:
        assert seen == [0, 0, 1, 1, 2, 2]
        assert trainer.restaged_batches == 2
    else:  # without the rows the prefetched batch keeps the old format (why ar.py sets keep_rows)
        assert seen == [0, 0, 0, 1, 1, 2]
        assert trainer.restaged_batches == 0


def test_stage_lengths_follow_the_scaled_paper_schedule(tiny, tmp_path):
    """A 10-step run of a 10-epoch schedule with 2-epoch stages: stages 0 and 1 get 2 steps each
    (a fifth of the run each, as in the schedule), the last stage the other 6; with accumulation
    the step count the plan is made from is the Trainer's own."""
    _, tok, _ = tiny
    method = get_method("acot", style="trained", k=2)
    examples = [prosqa_like(i) for i in range(16)]
    collator = AnchoredCollator(tok, method, task="prosqa", keep_rows=True)
    cb = CurriculumCallback(collator, method, curriculum=True, schedule="epochs", epochs_per_stage=2,
                            schedule_epochs=10, min_steps_per_stage=2, reset_optimizer=True)
    args = AnchoredSFTConfig(output_dir=str(tmp_path / "o"), per_device_train_batch_size=2, gradient_accumulation_steps=2,
                             max_steps=10, learning_rate=1e-3, logging_steps=5, disable_tqdm=True)
    trainer = AnchoredSFTTrainer(model=fresh_model(tiny), args=args, train_dataset=examples_dataset(examples),
                                 data_collator=collator, processing_class=tok, callbacks=[cb])
    trainer.train()
    assert cb.plan.steps == [2, 2, 6]
    assert [(h["step"], h["stage"]) for h in cb.history if h["event"] == "stage"] == [(0, 0), (2, 1), (4, 2)]
    assert cb.stage_steps(trainer.state.global_step) == {0: 2, 1: 2, 2: 6}
    assert cb.optimizer_resets == 2


def test_callback_refuses_a_run_too_short_for_its_stages_at_train_begin(tiny, tmp_path):
    from anchored_reasoning.errors import ConfigError

    _, tok, _ = tiny
    method = get_method("acot", style="trained", k=2)
    collator = AnchoredCollator(tok, method, task="prosqa")
    cb = CurriculumCallback(collator, method, curriculum=True, schedule="fraction", min_steps_per_stage=3)
    args = AnchoredSFTConfig(output_dir=str(tmp_path / "o"), per_device_train_batch_size=4, max_steps=6, disable_tqdm=True)
    trainer = AnchoredSFTTrainer(model=fresh_model(tiny), args=args, train_dataset=examples_dataset([prosqa_like(0)] * 8),
                                 data_collator=collator, processing_class=tok, callbacks=[cb])
    with pytest.raises(ConfigError, match=r"6 optimizer steps for 3 stages.*floor of 3 steps"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_validation_generates_through_the_evaluation_path(tiny, tmp_path):
    """The evaluator's completions are the eval runner's on the saved checkpoint: same prompts,
    same greedy tokens, same grades; its records are kept under out_dir."""
    import json

    from anchored_reasoning.backends import get_backend
    from anchored_reasoning.eval.runner import run_eval

    path, tok, _ = tiny
    model = fresh_model(tiny)
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    method = get_method("acot", style="trained", k=2)
    examples = [prosqa_like(i) for i in range(5)]
    evaluator = GenerationEvaluator(tok, examples, task="prosqa", max_new_tokens=6, batch_size=2,
                                    out_dir=tmp_path / "validation")
    model.train()
    result = evaluator.evaluate(model, method, name="step-0000003")
    assert model.training  # the evaluator puts the model back in training mode
    summary = run_eval("prosqa", get_backend("hf", str(tmp_path / "ckpt"), device="cpu"), method,
                       out_dir=tmp_path / "eval", examples=examples, max_new_tokens=6, progress=False)
    records = [json.loads(line) for line in (tmp_path / "eval" / "records.jsonl").read_text().splitlines()]
    kept = [json.loads(line) for line in (tmp_path / "validation" / "step-0000003" / "records.jsonl").read_text().splitlines()]
    assert [(r["id"], r["prompt"], r["completion"], r["tokens"], r["correct"]) for r in kept] == [
        (r["id"], r["prompt"], r["completion"], r["tokens"], r["correct"]) for r in records
    ]
    assert result.n == 5 and result.accuracy == summary["accuracy"]["mean"]
    assert result.mean_generated_tokens == pytest.approx(summary["tokens"]["mean"])
    assert result.samples[0]["prompt"] == method.prompt(examples[0], "prosqa").text


@pytest.mark.parametrize("arch", ["llama", "gpt2", "shift-gpt2"])
def test_every_parameter_trains(tiny, tmp_path, arch):
    """A few trainer steps move every weight of the model: the tiny Llama, GPT-2 and the token-shifted
    GPT-2 (whose shift once sat outside the backbone that TRL's fused head calls, and never trained)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from anchored_reasoning.models import ShiftGPT2LMHeadModel

    _, tok, base = tiny
    if arch == "llama":
        model = copy.deepcopy(base)
    else:
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2, n_positions=256,
                                           pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id))
        if arch == "shift-gpt2":
            model = ShiftGPT2LMHeadModel.from_gpt2(model, 3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer, _ = train(tiny, get_method("acot", style="trained"), [prosqa_like(i) for i in range(12)], tmp_path,
                       model=model, max_steps=3, weight_decay=0.0, report_to=[])
    after = trainer.model.state_dict()
    frozen = [k for k, v in before.items() if torch.equal(v, after[k])]
    assert not frozen, f"weights the trainer never changed: {frozen}"
    assert (arch == "shift-gpt2") == any(k.startswith("transformer.shift_proj.") for k in after)


def test_a_slot_method_that_keeps_every_step_is_warned_about():
    from anchored_reasoning.methods import get_method
    from anchored_reasoning.train.pipelines.ar import steps_kept_warning

    pause = get_method("pause", style="trained", k=6)
    assert "keeps every reasoning step" in steps_kept_warning(pause, curriculum=False)
    assert steps_kept_warning(pause, curriculum=True) is None
    removing = get_method("pause", style="trained", k=6, remove_steps_per_stage=1)
    assert steps_kept_warning(removing, curriculum=False) is None
    assert steps_kept_warning(get_method("cot", style="trained"), curriculum=False) is None


def test_a_backbone_pretrained_on_space_joined_steps_is_named_when_the_method_joins_them_otherwise(tmp_path):
    """The shipped logic backbones record what joined their pretraining steps (``backbone.json``); a recipe that
    leaves ``step_separator`` at the newline default on them is warned, once the rendered targets differ."""
    import json

    from anchored_reasoning.generators.prosqa import generate_dataset
    from anchored_reasoning.methods import get_method
    from anchored_reasoning.models.zoo import LOGIC_SEARCH_DIR
    from anchored_reasoning.train.data.separator import backbone_step_separator, separator_warning
    from anchored_reasoning.train.data.logic_text import STEP_SEPARATOR, qa_document

    examples = generate_dataset(5, seed=0, min_hops=3, max_hops=3)
    assert backbone_step_separator("logic-gpt2-search") == STEP_SEPARATOR == " "
    # the card says what the document writer does: the steps of a pretraining document are joined by it
    doc = qa_document(examples[0], "prosqa")
    assert STEP_SEPARATOR.join(s.strip() for s in examples[0].steps) in doc
    assert json.loads((LOGIC_SEARCH_DIR / "backbone.json").read_text())["step_separator"] == " "

    model = {"name": "logic-gpt2-search"}
    for name, k in (("cot", None), ("pause", 2), ("acot", 2), ("stepwise", None)):
        method = get_method(name, style="trained", **({"k": k, "remove_steps_per_stage": 1} if k else {}))
        warning = separator_warning(method, model, {}, examples, "prosqa")
        assert warning and "'logic-gpt2-search'" in warning and "step_separator to ' '" in warning, (name, warning)
        # set either way: no warning
        for sep in (" ", "\n"):
            chosen = get_method(name, style="trained", step_separator=sep, **({"k": k, "remove_steps_per_stage": 1} if k else {}))
            assert separator_warning(chosen, model, {"step_separator": sep}, examples, "prosqa") is None
    # a method whose targets hold no joined steps, a folder without a card, a preset: nothing to say
    assert separator_warning(get_method("nocot", style="trained"), model, {}, examples, "prosqa") is None
    chain = get_method("anchor_chain", style="trained", revisits=True)
    assert separator_warning(chain, model, {}, examples, "prosqa") is None
    (tmp_path / "config.json").write_text("{}")
    assert backbone_step_separator(str(tmp_path)) is None
    assert separator_warning(get_method("cot", style="trained"), {"name": str(tmp_path)}, {}, examples, "prosqa") is None
    assert separator_warning(get_method("cot", style="trained"), {"preset": "gpt2-tiny"}, {}, examples, "prosqa") is None
