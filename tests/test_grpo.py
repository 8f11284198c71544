"""The ``grpo`` trainer on CPU in seconds: from an ACoT checkpoint trained here and from an instruct-style
model; the anchor term (same log-probs as TRL, plus exactly gamma x the slot cross-entropy); TRL's loop
calls both overrides; recipes validate and bad input fails before training; checkpoint and resume."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.train.pipelines import grpo
from anchored_reasoning.train.data.collate import IGNORE

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sft(tmp_path_factory) -> Path:
    """A tiny ACoT checkpoint (k=2 [ANT] slots) trained by the ``ar`` trainer in about a second."""
    from anchored_reasoning.train.pipelines import ar

    out = tmp_path_factory.mktemp("sft")
    return ar.run("tiny_test", [f"output_dir={out}", "training.generation_eval=false", "training.curriculum=false"])


def make_trainer(sft: Path, tmp_path: Path, **training):
    """The AnchoredGRPOTrainer ``grpo.run`` would train, for tests that look inside."""
    plan = grpo.prepare("grpo_tiny_test", [f"model.name={sft}", f"output_dir={tmp_path}"]
                        + [f"training.{k}={v}" for k, v in training.items()])
    trainer, tok = grpo.build_trainer(plan)
    rows = [dict(trainer.train_dataset[i]) for i in range(len(trainer.train_dataset))]
    return trainer, rows


def test_grpo_from_an_acot_checkpoint_keeps_its_format(sft, tmp_path):
    out = grpo.run("grpo_tiny_test", [f"model.name={sft}", f"output_dir={tmp_path}"])
    meta = json.loads((out / "anchored_reasoning.json").read_text())
    sft_meta = json.loads((sft / "anchored_reasoning.json").read_text())
    assert meta["method"] == "acot" and meta["method_options"] == sft_meta["method_options"]
    assert meta["grpo"]["steps"] == 2 and meta["grpo"]["gamma"] == 1.0
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["anchor_prompts"] == 8 and summary["style"] == "trained"
    steps = [h for h in summary["log_history"] if "anchor_loss" in h]
    assert len(steps) == 2 and all(h["anchor_loss"] > 0 for h in steps)
    assert "rewards/correctness/mean" in steps[0] and "rewards/format/mean" in steps[0]


def test_trls_loop_calls_both_overrides(sft, tmp_path):
    trainer, _ = make_trainer(sft, tmp_path)
    before = {k: v.clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    assert trainer.compute_loss_calls == 2  # compute_loss, once per optimizer step (no accumulation)
    assert trainer.anchored_forward_calls == 2  # the one-pass anchored log-probs, inside each loss
    assert trainer.anchor_table.misses == 0  # every prompt TRL tokenized was found in the table
    changed = any(not torch.equal(before[k], v) for k, v in trainer.model.named_parameters())
    assert changed  # the anchor term moves the weights even when every reward of a group ties


def test_anchor_term_is_gamma_times_the_slot_cross_entropy(sft, tmp_path):
    trainer, rows = make_trainer(sft, tmp_path)
    model = trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(0)
    inputs = trainer._generate_and_score_completions([dict(r) for r in rows[:4] for _ in range(4)])
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    width = inputs["completion_ids"].size(1)

    plain, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, width)  # TRL's own path
    labels = trainer.anchor_table.labels_for(inputs["prompt_ids"], inputs["prompt_mask"], ids.size(1))
    per_row = (labels != IGNORE).sum(1) if labels is not None else None
    assert per_row is not None and bool(((per_row > 0) & (per_row <= 2)).all())  # k = 2 [ANT] slots per prompt
    trainer._pending_anchor_labels = labels
    anchored, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, width)
    trainer._pending_anchor_labels = None
    torch.testing.assert_close(anchored, plain, rtol=1e-5, atol=1e-5)

    trainer.args.gamma = 0.0
    loss_plain = trainer.compute_loss(model, inputs)
    trainer.args.gamma = 2.0
    loss_anchored = trainer.compute_loss(model, inputs)
    with torch.no_grad():
        log_probs = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), -1)
    slots = labels != IGNORE
    ce = -log_probs[slots].gather(-1, labels[slots].unsqueeze(-1)).mean()
    torch.testing.assert_close(loss_anchored - loss_plain, 2.0 * ce, rtol=1e-4, atol=1e-5)


def test_an_instruct_model_is_prompted_with_its_chat_template(tmp_path):
    from transformers import AutoTokenizer

    from anchored_reasoning.testing import make_tiny_causal_lm

    path = make_tiny_causal_lm(tmp_path / "instruct", hidden_size=32, num_layers=1, num_heads=2, vocab_size=300)
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    tok.save_pretrained(path)
    out = grpo.run("grpo_tiny_test", [f"model.name={path}", f"output_dir={tmp_path / 'out'}", "task=prosqa",
                                      "method.name=cot", "training.max_steps=1"])
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["style"] == "instruct" and summary["global_steps"] == 1 and summary["anchor_prompts"] == 0
    assert not (out / "anchored_reasoning.json").exists()  # still an instruct model: evals prompt it with --method
    prompt = summary["log_history"][0]
    assert "rewards/correctness/mean" in prompt


class Killed(Exception):
    """Stands in for a SIGKILL right after a checkpoint is written."""


def test_a_killed_run_resumes_when_rerun(sft, tmp_path, monkeypatch):
    from transformers import Trainer

    from anchored_reasoning.errors import ResumeError

    args = [f"model.name={sft}", f"output_dir={tmp_path}", "training.max_steps=3", "training.save_steps=1"]
    save = Trainer._save_checkpoint

    def save_then_die(self, model, trial):
        save(self, model, trial)
        if self.state.global_step == 2:
            raise Killed

    monkeypatch.setattr(Trainer, "_save_checkpoint", save_then_die)
    with pytest.raises(Killed):
        grpo.run("grpo_tiny_test", args)
    monkeypatch.setattr(Trainer, "_save_checkpoint", save)
    assert (tmp_path / "checkpoint-2").is_dir() and not (tmp_path / "train_summary.json").exists()
    with pytest.raises(ResumeError, match="learning_rate"):  # another recipe in the same folder is refused
        grpo.run("grpo_tiny_test", args + ["training.learning_rate=0.5"])
    grpo.run("grpo_tiny_test", args)  # the same command again: resumes at step 2
    summary = json.loads((tmp_path / "train_summary.json").read_text())
    assert summary["global_steps"] == 3
    assert [h["step"] for h in summary["log_history"] if "loss" in h] == [1, 2, 3]  # steps 1-2 restored, not rerun
    sessions = json.loads((tmp_path / "run_config.json").read_text())["sessions"]
    assert [s["resumed_from_step"] for s in sessions] == [0, 2]
    assert grpo.run("grpo_tiny_test", args) == tmp_path  # finished: a third run does nothing
    assert len(json.loads((tmp_path / "run_config.json").read_text())["sessions"]) == 2


def test_bad_recipes_fail_before_any_model_work(sft, tmp_path):
    base = [f"model.name={sft}", f"output_dir={tmp_path}"]
    with pytest.raises(ConfigError, match="gama"):
        grpo.run("grpo_tiny_test", base + ["training.gama=1"])
    with pytest.raises(ConfigError, match="corectness"):
        grpo.run("grpo_tiny_test", base + ["rewards.corectness=1"])
    with pytest.raises(ConfigError, match="use_vllm"):  # a CPU never needs (or reaches) vLLM
        grpo.run("grpo_tiny_test", base + ["training.use_vllm=true"])
    with pytest.raises(ConfigError, match="trained with method 'acot'"):
        grpo.run("grpo_tiny_test", base + ["method.name=cot"])
    assert not (tmp_path / "train_summary.json").exists()


def test_a_gold_answer_that_does_not_parse_fails_at_load(sft, tmp_path, monkeypatch):
    import dataclasses

    from anchored_reasoning.train.data import data_sources

    real = data_sources.load_split

    def with_bad_row(spec, task_name, seed, part="train"):
        rows = real(spec, task_name, seed, part)
        meta = {k: v for k, v in rows[1].meta.items() if k != "answer_concept"}
        return [rows[0], dataclasses.replace(rows[1], id="broken", meta=meta), *rows[2:]]

    monkeypatch.setattr(data_sources, "load_split", with_bad_row)
    with pytest.raises(DataError, match=r"row 1 \(id 'broken'\)"):
        grpo.run("grpo_tiny_test", [f"model.name={sft}", f"output_dir={tmp_path}"])


def test_every_grpo_recipe_validates(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a recipe's runs/... start names a run of its own, not one in the caller's folder
    recipes = sorted((ROOT / "train").glob("grpo_*.yaml"))
    assert {"grpo_gsm8k_smollm2", "grpo_gsm8k_qwen25", "grpo_prosqa_logic_cpu"} <= {p.stem for p in recipes}
    from anchored_reasoning.train.trainers.diffusion_grpo import DiffusionGRPOConfig

    for path in recipes:
        recipe = grpo.resolve_recipe(path)
        assert recipe["trainer"] == "grpo"
        config = grpo.make_config(recipe, Path("/tmp/unused"))
        assert isinstance(config, DiffusionGRPOConfig) == ("sampler" in recipe), path.name
        if config.use_vllm:  # the GPU recipes: TRL's vLLM generation, refused on a machine without CUDA
            assert config.vllm_mode == "colocate" and config.bf16
            if not torch.cuda.is_available():
                with pytest.raises(ConfigError, match="CUDA|vLLM"):
                    grpo.check_generation_backend(config)


def test_a_policy_from_a_preset_gets_the_method_s_own_tokens(tmp_path):
    """``load_policy(extra_tokens=method.added_tokens)``: a GRPO policy built from scratch writes the one-token
    back-up marker as one token, as the supervised trainer's does."""
    from anchored_reasoning.methods import get_method
    from anchored_reasoning.train.pipelines.grpo import load_policy

    method = get_method("anchor_chain", style="trained", revisits=True, mark_backups=True, backup_marker="token")
    texts = ["Tom terpus gorpus terpus lempus"] * 20
    model, tok = load_policy({"preset": "gpt2-tiny"}, texts, tmp_path, 0, method.added_tokens)
    row = tok.convert_tokens_to_ids("[Back]")
    assert row != tok.unk_token_id and tok.convert_ids_to_tokens(row) == "[Back]"
    assert model.get_input_embeddings().weight.shape[0] == len(tok) > row
    _, plain = load_policy({"preset": "gpt2-tiny"}, texts, tmp_path / "plain", 0)
    assert "[Back]" not in plain.get_vocab()
