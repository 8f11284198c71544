"""Coconut: its render path and curriculum, the latent passes against an independently written n + 1-pass
computation on a small GPT-2 with fixed weights, latent generation through the HF backend, and the refusals."""
from __future__ import annotations

import random

import pytest
import torch

from anchored_reasoning.backends.latent import latent_forward, require_latent_backend, thought_id
from anchored_reasoning.errors import ConfigError
from anchored_reasoning.methods import get_method
from anchored_reasoning.methods.coconut import BOT, EOT, THOUGHT
from anchored_reasoning.train.data.collate import IGNORE, examples_dataset
from anchored_reasoning.train.trainers.coconut_trainer import (
    CoconutCollator, CoconutSFTConfig, CoconutSFTTrainer, check_coconut_fits,
)
from anchored_reasoning.types import Example

torch.set_num_threads(1)

NAMES = ["Tom", "Alex", "Sally", "Max"]
CONCEPTS = ["wumpus", "tumpus", "lempus", "brimpus", "gorpus", "terpus"]


def example(i: int, hops: int = 3) -> Example:
    """A ProsQA-shaped example with ``hops`` steps; question lengths differ with i."""
    name = NAMES[i % len(NAMES)]
    chain = [CONCEPTS[(i + j) % len(CONCEPTS)] for j in range(hops + 1)]
    facts = " ".join(f"Every {a} is a {b}." for a, b in zip(chain, chain[1:]))
    steps = [f"{name} is a {chain[0]}."] + [f"Every {a} is a {b}." for a, b in zip(chain[1:], chain[2:])]
    return Example(id=f"c{i}", question=f"{facts} {name} is a {chain[0]}." + " Really." * (i % 3)
                   + f" Is {name} a {chain[-1]} or zumpus?", answer=f"{name} is a {chain[-1]}.",
                   steps=steps[:hops], meta={"task": "prosqa"})


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A small GPT-2 with fixed (seeded) weights, dropout off, and a tokenizer with Coconut's tokens."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from anchored_reasoning.testing import make_tiny_causal_lm
    from anchored_reasoning.train.pipelines.method_setup import prepare_for_method

    texts = [example(i).question + " " + " ".join(example(i).steps) for i in range(12)]
    path = make_tiny_causal_lm(tmp_path_factory.mktemp("tok"), texts=texts, hidden_size=16, vocab_size=300)
    tok = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tok), n_positions=256, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.2, eos_token_id=tok.eos_token_id,
                        bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id)
    model = GPT2LMHeadModel(config)
    prepare_for_method(model, tok, get_method("coconut", style="trained").added_tokens)
    return model, tok


# ---------------------------------------------------------------------------------------------
# render and curriculum

def test_stages_replace_steps_by_thoughts_and_the_last_drops_every_step():
    m = get_method("coconut", style="trained", max_latent_stage=2, c=2)
    ex = example(0, hops=3)
    assert m.num_stages == 4 and m.stage == 3  # 0 (CoT), 1, 2, then every step removed
    r0, r1, r2, r3 = (m.render_at(ex, "prosqa", s) for s in range(4))
    assert r0.prompt.endswith(BOT + EOT + "[BoR]") and r0.target.startswith(ex.steps[0])
    assert r1.prompt.count(THOUGHT) == 2 and r1.target.startswith(ex.steps[1])
    assert r2.prompt.count(THOUGHT) == 4 and r2.target.startswith(ex.steps[2])
    assert r3.prompt.count(THOUGHT) == 4 and r3.target.startswith("[EoR]")
    assert m.render(ex, "prosqa") == r3  # the method built without a stage sits at its last one


def test_padding_to_the_maximum_and_pause_as_thought():
    short = example(1, hops=1)
    padded = get_method("coconut", style="trained", max_latent_stage=3)
    unpadded = get_method("coconut", style="trained", max_latent_stage=3, pad_latent_to_max=False)
    assert padded.render(short, "prosqa").prompt.count(THOUGHT) == 3
    assert unpadded.render(short, "prosqa").prompt.count(THOUGHT) == 1  # the last stage: as many as its steps
    assert unpadded.render_at(short, "prosqa", 2).prompt.count(THOUGHT) == 2  # stage 2 trains 2, as Coconut does
    pause = get_method("coconut", style="trained", max_latent_stage=3, thought="pause")
    assert not pause.latent and pause.render(short, "prosqa").prompt.count("[PAUSE]") == 3
    assert THOUGHT not in pause.render(short, "prosqa").prompt


def test_uniform_prob_draws_stages_from_zero_to_the_trace_length():
    ex = example(2, hops=3)
    always = get_method("coconut", style="trained", max_latent_stage=3, uniform_prob=1.0).with_stage(1)
    never = get_method("coconut", style="trained", max_latent_stage=3, uniform_prob=0.0).with_stage(1)
    rng = random.Random(0)
    assert {always.draw_stage(ex, rng) for _ in range(200)} == {0, 1, 2, 3}
    assert {never.draw_stage(ex, rng) for _ in range(20)} == {1}


@pytest.mark.parametrize("options, match", [
    ({"c": 0}, "c must be an integer >= 1"),
    ({"max_latent_stage": 0}, "max_latent_stage must be"),
    ({"uniform_prob": 1.5}, "uniform_prob must be a probability"),
    ({"thought": "dense"}, "thought must be one of latent, pause"),
    ({"remove_steps_per_stage": 2}, "exactly one step"),
    ({"stage": 9, "max_latent_stage": 2}, "stage 9 out of range 0..3"),
])
def test_bad_options_are_refused(options, match):
    with pytest.raises(ConfigError, match=match):
        get_method("coconut", style="trained", **options)


def test_stages_or_thoughts_that_do_not_fit_the_traces_are_refused(gpt2):
    _, tok = gpt2
    examples = [example(i, hops=2) for i in range(4)]
    with pytest.raises(ConfigError, match=r"max_latent_stage=3 .* longest training trace has 2 steps"):
        check_coconut_fits(get_method("coconut", style="trained", max_latent_stage=3), examples)
    wide = get_method("coconut", style="trained", max_latent_stage=2, c=40)
    with pytest.raises(ConfigError, match=r"needs \d+ positions \(with up to 80 thoughts: max_latent_stage=2 x c=40\), "
                                          r"more than the model's 64"):
        check_coconut_fits(wide, examples, "prosqa", tok, 64)


# ---------------------------------------------------------------------------------------------
# the latent passes against a plain n + 1-pass computation

def reference_row(model, ids: list[int], labels: list[int], thought: int):
    """One unpadded sequence, written plainly: n full passes, each replacing the next thought's embedding
    by the last hidden state before it, then a full pass for the loss. Returns (loss sum, tokens, thoughts)."""
    x = torch.tensor([ids])
    embeds = model.transformer.wte(x).clone()
    states = []
    for p in [i for i, t in enumerate(ids) if t == thought]:
        hidden = model(inputs_embeds=embeds, output_hidden_states=True).hidden_states[-1]
        embeds = embeds.clone()
        embeds[0, p] = hidden[0, p - 1]
        states.append(hidden[0, p - 1])
    logits = model(inputs_embeds=embeds).logits[0]
    y = torch.tensor(labels)
    loss = torch.nn.functional.cross_entropy(logits[:-1], y[1:], ignore_index=IGNORE, reduction="sum")
    return loss, int((y[1:] != IGNORE).sum()), states


def coconut_batch(gpt2, stage: int, pad: bool):
    model, tok = gpt2
    method = get_method("coconut", style="trained", max_latent_stage=3, c=2, pad_latent_to_max=pad).with_stage(stage)
    examples = [example(i, hops=1 + i % 3) for i in range(4)]  # traces of 1-3 steps, questions of several lengths
    collator = CoconutCollator(tok, method, task="prosqa")
    rows = [dict(r) for r in examples_dataset(examples)]
    return method, collator, rows, collator(rows)


@pytest.mark.parametrize("stage, pad", [(2, True), (3, False), (4, False), (4, True), (0, True)])
def test_trainer_loss_and_thoughts_equal_the_plain_n_plus_one_pass_computation(gpt2, tmp_path, stage, pad):
    model, tok = gpt2
    model.eval()
    method, collator, rows, batch = coconut_batch(gpt2, stage, pad)
    tid = thought_id(tok)
    # reference: each row alone, unpadded
    total, count, ref_states = 0.0, 0, []
    for r in range(batch["input_ids"].shape[0]):
        keep = batch["attention_mask"][r].bool()
        loss, n, states = reference_row(model, batch["input_ids"][r][keep].tolist(),
                                        batch["labels"][r][keep].tolist(), tid)
        total, count = total + loss, count + n
        ref_states.append(states)
    expected = total / count
    args = CoconutSFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, disable_tqdm=True)
    for cache in (True, False):
        trainer = CoconutSFTTrainer(model=model, args=args, processing_class=tok, data_collator=collator,
                                    train_dataset=examples_dataset([example(0)]), latent_cache=cache)
        inputs = {k: v.clone() for k, v in batch.items() if k in ("input_ids", "attention_mask", "labels")}
        loss, passes = trainer.compute_loss(model, inputs, return_outputs=True)
        torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
        n_thoughts = max(sum(int(t == tid) for t in row) for row in batch["input_ids"].tolist())
        assert passes.passes == n_thoughts + 1  # aligned thoughts: n + 1 passes, cached or not
        # the thoughts, in column order (rows aligned on <eot>: thought p of a row of n sits p - n before it),
        # rows in order within a column, equal the reference's
        got = passes.thoughts
        order = [(p - len(ref_states[r]), r, p) for r in range(len(ref_states)) for p in range(len(ref_states[r]))]
        want = [ref_states[r][p] for _, r, p in sorted(order)]
        assert got.shape[0] == len(want)
        if want:
            torch.testing.assert_close(got, torch.stack(want), rtol=1e-5, atol=1e-5)


def test_gradients_flow_through_the_thoughts_and_match_the_uncached_passes(gpt2):
    model, tok = gpt2
    model.eval()
    _, _, _, batch = coconut_batch(gpt2, 3, True)
    from anchored_reasoning.train.trainers.coconut_trainer import target_loss

    grads = []
    for cache in (True, False):
        model.zero_grad()
        out = latent_forward(model, batch["input_ids"], batch["attention_mask"], thought_id(tok), cache=cache)
        target_loss(out.logits, batch["labels"], out.start)[0].backward()
        grads.append(model.transformer.h[0].attn.c_attn.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)
    # a thought's state depends on the weights through the passes: the loss of a stage with thoughts is not
    # the loss with the placeholder embedded as a token
    plain = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    latent = latent_forward(model, batch["input_ids"], batch["attention_mask"], thought_id(tok), cache=False).logits
    assert not torch.allclose(plain, latent)
    model.zero_grad()


# ---------------------------------------------------------------------------------------------
# generation through the HF backend

def test_hf_backend_generates_after_the_thoughts_as_a_plain_loop_does(gpt2):
    from anchored_reasoning.backends.hf import HFBackend
    from anchored_reasoning.types import SamplingSpec

    model, tok = gpt2
    model.eval()
    tid = thought_id(tok)
    method = get_method("coconut", style="trained", max_latent_stage=3)
    prompts = [method.prompt(example(i, hops=3), "prosqa") for i in range(3)]  # three prompt lengths, one batch
    backend = HFBackend.from_loaded(model, tok, batch_size=3)
    got = [c[0].text for c in backend.generate(prompts, SamplingSpec(max_new_tokens=6, temperature=0.0))]
    for prompt, text in zip(prompts, got):
        ids = tok(prompt.text)["input_ids"]
        embeds = model.transformer.wte(torch.tensor([ids])).clone()
        with torch.no_grad():
            for p in [i for i, t in enumerate(ids) if t == tid]:
                hidden = model(inputs_embeds=embeds, output_hidden_states=True).hidden_states[-1]
                embeds[0, p] = hidden[0, p - 1]
            new = []
            for _ in range(6):  # greedy, recomputing everything each token
                nxt = int(model(inputs_embeds=embeds).logits[0, -1].argmax())
                if nxt == tok.eos_token_id:
                    break
                new.append(nxt)
                embeds = torch.cat([embeds, model.transformer.wte(torch.tensor([[nxt]]))], dim=1)
        assert text == tok.decode([t for t in new if t != tok.pad_token_id], skip_special_tokens=False)


def test_backends_that_see_token_ids_only_are_refused():
    class Fake:
        name = "vllm"

    latent = get_method("coconut", style="trained")
    with pytest.raises(ConfigError, match="backend 'vllm' cannot do.*--backend hf"):
        require_latent_backend(latent, Fake())
    require_latent_backend(get_method("coconut", style="trained", thought="pause"), Fake())  # plain tokens: fine


# ---------------------------------------------------------------------------------------------
# training

def test_the_plain_trainer_refuses_a_latent_method(gpt2, tmp_path):
    from anchored_reasoning.train.trainers.acot_trainer import AnchoredSFTConfig, AnchoredSFTTrainer

    model, tok = gpt2
    with pytest.raises(ConfigError, match="train it with CoconutSFTTrainer and CoconutSFTConfig"):
        AnchoredSFTTrainer(model=model, args=AnchoredSFTConfig(output_dir=str(tmp_path)), processing_class=tok,
                           method="coconut", task="prosqa", train_dataset=[example(0)])


def test_a_curriculum_that_does_not_fit_the_budget_is_refused_before_training(gpt2, tmp_path):
    model, tok = gpt2
    args = CoconutSFTConfig(output_dir=str(tmp_path), max_steps=12, curriculum=True, curriculum_schedule="fraction",
                            curriculum_min_steps_per_stage=5)
    with pytest.raises(ConfigError, match=r"12 optimizer steps for 5 stages .* below the floor of 5"):
        CoconutSFTTrainer(model=model, args=args, processing_class=tok, method="coconut", task="prosqa",
                          train_dataset=[example(i) for i in range(8)], method_options={"max_latent_stage": 3})


def test_the_fit_check_reads_every_training_trace_not_a_prefix(gpt2, tmp_path):
    # a mixture is stored in its sources' order: here 2,001 one-step traces, then one of three steps
    model, tok = gpt2
    data = [example(i, hops=1) for i in range(2001)] + [example(2001, hops=3)]
    args = CoconutSFTConfig(output_dir=str(tmp_path), max_steps=20, curriculum=True, curriculum_schedule="fraction",
                            curriculum_min_steps_per_stage=1)
    trainer = CoconutSFTTrainer(model=model, args=args, processing_class=tok, method="coconut", task="prosqa",
                                train_dataset=data, method_options={"max_latent_stage": 3})
    assert trainer.coconut_check["longest_trace_steps"] == 3
    with pytest.raises(ConfigError, match=r"max_latent_stage=4 .* longest training trace has 3 steps"):
        CoconutSFTTrainer(model=model, args=args, processing_class=tok, method="coconut", task="prosqa",
                          train_dataset=data, method_options={"max_latent_stage": 4})


def test_training_walks_the_stages_resets_the_optimizer_and_saves_the_format(gpt2, tmp_path):
    import copy
    import json

    model, tok = gpt2
    args = CoconutSFTConfig(output_dir=str(tmp_path), max_steps=12, per_device_train_batch_size=4, curriculum=True,
                            curriculum_schedule="fraction", stage_fraction=0.2, curriculum_min_steps_per_stage=2, learning_rate=1e-3,
                            disable_tqdm=True, logging_steps=1)
    trainer = CoconutSFTTrainer(model=copy.deepcopy(model), args=args, processing_class=copy.deepcopy(tok),
                                method="coconut", task="prosqa", train_dataset=[example(i) for i in range(16)],
                                method_options={"max_latent_stage": 2})
    trainer.train()
    trainer.save_model()
    stages = [h["stage"] for h in trainer.curriculum_callback.history if h.get("event") == "stage"]
    assert stages == [0, 1, 2, 3] and trainer.curriculum_callback.optimizer_resets == 3
    passes = [h["latent_passes"] for h in trainer.state.log_history if "latent_passes" in h]
    assert passes[0] == 1 and passes[-1] == 3  # stage 0: one pass; the last stage: 2 thoughts + 1
    meta = json.loads((tmp_path / "anchored_reasoning.json").read_text())
    assert meta["method"] == "coconut" and meta["method_options"]["stage"] == 3


def test_a_recipe_trains_coconut_with_its_trainer_and_the_checkpoint_evaluates_through_hf(tmp_path):
    """The recipe path (``anchored-reasoning train``) picks CoconutSFTTrainer for method coconut, validates with
    latent generation, and the saved checkpoint is prompted in its format by the evaluation runner."""
    import json

    from anchored_reasoning.backends.hf import HFBackend
    from anchored_reasoning.eval.runner import run_eval
    from anchored_reasoning.generators import generate
    from anchored_reasoning.train.pipelines import ar

    out = ar.run("tiny_test", [f"output_dir={tmp_path / 'run'}", "method.name=coconut",
                               "method.options={max_latent_stage: 2}", "training.max_steps=8",
                               "training.stage_fraction=0.2"])
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["final_stage"] == 3 and summary["optimizer_resets"] == 3
    assert [h["latent_passes"] for h in summary["log_history"] if "latent_passes" in h][-1] == 3
    assert json.loads((out / "anchored_reasoning.json").read_text())["method"] == "coconut"
    backend = HFBackend(str(out), batch_size=4)
    ex = generate("prosqa", 3, seed=9, num_nodes=6, min_hops=1, max_hops=2, neg_depth="any")
    result = run_eval("prosqa", backend, None, out_dir=tmp_path / "eval", examples=ex, max_new_tokens=8, progress=False)
    assert result["accuracy"]["n"] == 3


def test_a_token_shift_backbone_gets_its_shifted_embeddings_in_the_latent_passes():
    """The shipped logic backbones add a token shift to their input embeddings (models/shift.py): the latent
    passes feed the same vectors the model computes from ids (no thought: the model's own logits), and with
    thoughts equal a plain n + 1-pass computation on the shifted embeddings."""
    from anchored_reasoning.models.shift import ShiftGPT2Config, ShiftGPT2LMHeadModel

    torch.manual_seed(0)
    model = ShiftGPT2LMHeadModel(ShiftGPT2Config(token_shift=2, vocab_size=40, n_positions=64, n_embd=16, n_layer=2,
                                                 n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).eval()
    for lin in model.shift_proj:
        torch.nn.init.normal_(lin.weight, std=0.3)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(latent_forward(model, ids, mask, thought=39).logits, plain)
        thought = torch.tensor([[5, 6, 39, 39, 8, 9]])
        got = latent_forward(model, thought, mask, thought=39)
        embeds = model.shifted_embeddings(thought, attention_mask=mask).clone()
        for p in (2, 3):  # a plain n + 1-pass reference on the shifted embeddings
            embeds[0, p] = model(inputs_embeds=embeds, output_hidden_states=True).hidden_states[-1][0, p - 1]
        torch.testing.assert_close(got.logits[0, -1], model(inputs_embeds=embeds).logits[0, -1], rtol=1e-5, atol=1e-5)


def test_hf_backend_latent_generation_on_a_token_shift_backbone_matches_a_plain_loop(gpt2):
    """Cached generate after the latent prefill reads thought positions through the shift as token ids (the
    <thought> embedding), exactly as the passes do: the same text as recomputing everything per token."""
    from anchored_reasoning.backends.hf import HFBackend
    from anchored_reasoning.models.shift import ShiftGPT2Config, ShiftGPT2LMHeadModel
    from anchored_reasoning.types import SamplingSpec

    _, tok = gpt2
    torch.manual_seed(1)
    model = ShiftGPT2LMHeadModel(ShiftGPT2Config(token_shift=3, vocab_size=len(tok), n_positions=256, n_embd=32,
                                                 n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                                 initializer_range=0.2, eos_token_id=tok.eos_token_id,
                                                 pad_token_id=tok.pad_token_id)).eval()
    for lin in model.shift_proj:
        torch.nn.init.normal_(lin.weight, std=0.2)
    tid = thought_id(tok)
    method = get_method("coconut", style="trained", max_latent_stage=2)
    prompts = [method.prompt(example(i, hops=2), "prosqa") for i in range(2)]
    got = [c[0].text for c in HFBackend.from_loaded(model, tok, batch_size=2).generate(
        prompts, SamplingSpec(max_new_tokens=5, temperature=0.0))]
    for prompt, text in zip(prompts, got):
        ids = tok(prompt.text)["input_ids"]
        new = []
        with torch.no_grad():
            for _ in range(5):
                x = torch.tensor([ids + new])
                embeds = model.shifted_embeddings(x, attention_mask=torch.ones_like(x)).clone()
                for p in [i for i, t in enumerate(ids) if t == tid]:
                    embeds[0, p] = model(inputs_embeds=embeds, output_hidden_states=True).hidden_states[-1][0, p - 1]
                nxt = int(model(inputs_embeds=embeds).logits[0, -1].argmax())
                if nxt == tok.eos_token_id:
                    break
                new.append(nxt)
        assert text == tok.decode([t for t in new if t != tok.pad_token_id], skip_special_tokens=False)
