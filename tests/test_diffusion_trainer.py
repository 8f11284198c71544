"""DiffusionSFTTrainer, its data encoding and the ``diffusion`` recipe runner (tiny models, seconds)."""
from __future__ import annotations

import json

import pytest
import torch

from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.train.data.diffusion_data import (
    IGNORE_INDEX,
    anchor_mask_from_strings,
    encode_prompt_response,
    encode_sft_rows,
    pack_token_blocks,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from anchored_reasoning.testing import train_tiny_tokenizer

    texts = [f"Question {i}: what is {i} plus one? The answer is {i + 1}." for i in range(50)]
    return train_tiny_tokenizer(tmp_path_factory.mktemp("tok"), texts=texts, vocab_size=320)


def tiny_model(tok, arch="mdlm", **over):
    from anchored_reasoning.models import ADLM, ADLMConfig, MDLM, MDLMConfig

    cls, cfg_cls = (MDLM, MDLMConfig) if arch == "mdlm" else (ADLM, ADLMConfig)
    sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=64)
    sizes.update(over)
    torch.manual_seed(0)
    return cls(cfg_cls.from_preset("tiny", vocab_size=len(tok), mask_token_id=tok.mask_token_id,
                                   pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, **sizes))


PROMPT = "Question: what is the next number?\n"  # one prompt text, so every row's prompt has the same length


def sft_rows(tok, n=24):
    rows = [{"id": str(i), "prompt": PROMPT, "completion": f"After {i} comes {i + 1}."} for i in range(n)]
    return encode_sft_rows(tok, rows, 48)[0]


def make_trainer(tok, model, rows, tmp_path, **cfg):
    from datasets import Dataset

    from anchored_reasoning.train.trainers.diffusion_trainer import DiffusionCollator, DiffusionSFTConfig, DiffusionSFTTrainer

    args = DiffusionSFTConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, learning_rate=3e-3,
                              logging_steps=1, save_strategy="no", disable_tqdm=True, use_cpu=True,
                              **{"max_steps": 2, **cfg})
    collator = DiffusionCollator.for_tokenizer(tok, eos_padding=args.eos_padding)
    return DiffusionSFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                               data_collator=collator, processing_class=tok)


# ----------------------------------------------------------------------------- encoding / bad input
def test_encode_masks_prompt_and_appends_eos(tok):
    row = encode_prompt_response(tok, "Question 3: what?\n", "The answer is 4.", 48)
    n_prompt = len(tok("Question 3: what?\n")["input_ids"])
    assert row["labels"][:n_prompt] == [IGNORE_INDEX] * n_prompt
    assert row["labels"][n_prompt:] == row["input_ids"][n_prompt:]
    assert row["input_ids"][-1] == tok.eos_token_id
    assert tok.decode(row["input_ids"][n_prompt:-1]) == "The answer is 4."


def test_bad_rows_raise_clear_errors(tok):
    with pytest.raises(DataError, match="empty response"):
        encode_prompt_response(tok, "Question", "   ", 48, example_id="e1")
    long_prompt = "Question " * 60
    with pytest.raises(DataError, match="fills the whole context"):
        encode_prompt_response(tok, long_prompt, "4", 16, example_id="e2")
    with pytest.raises(DataError, match=r"e3.*> max_length=12"):
        encode_prompt_response(tok, "Question 1", "The answer is 2. The answer is 2. The answer is 2.", 12, example_id="e3")


def test_overlong_rows_dropped_only_when_asked_and_counted(tok):
    rows = [{"id": "ok", "prompt": "Q", "completion": "4"},
            {"id": "long", "prompt": "Q", "completion": "The answer is 4. " * 10},
            {"id": "empty", "prompt": "Q", "completion": ""}]
    with pytest.raises(DataError, match="empty response"):
        encode_sft_rows(tok, rows, 16, overlong="drop")  # dropping is for overlong rows only
    rows = rows[:2]
    with pytest.raises(DataError, match="long"):
        encode_sft_rows(tok, rows, 16)
    out, stats = encode_sft_rows(tok, rows, 16, overlong="drop")
    assert len(out) == 1 and stats.dropped_overlong == 1 and stats.dropped_ids == ["long"]
    with pytest.raises(DataError, match="no usable rows"):
        encode_sft_rows(tok, rows[1:], 16, overlong="drop")


def test_task_anchor_strings_mark_their_tokens(tok):
    response = "Tom is a wumpus. Every wumpus is a tumpus."
    mask, missing = anchor_mask_from_strings(tok, response, ["Tom", "tumpus", "zorblax"])
    enc = tok(response, add_special_tokens=False, return_offsets_mapping=True)
    marked = "".join(response[a:b] for (a, b), m in zip(enc["offset_mapping"], mask) if m)
    assert "Tom" in marked and "tumpus" in marked and "Every" not in marked
    assert missing == 1


def test_pack_blocks_keep_or_drop_last():
    ids = list(range(10))
    assert pack_token_blocks(ids, 4, keep_last=True) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert pack_token_blocks(ids, 4, keep_last=False) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_collator_eos_padding_is_supervised(tok):
    from anchored_reasoning.train.trainers.diffusion_trainer import DiffusionCollator

    rows = [{"input_ids": [5, 6, 7, 2], "labels": [-100, 6, 7, 2]}, {"input_ids": [5, 6], "labels": [-100, 6]}]
    eos = DiffusionCollator(pad_token_id=0, eos_token_id=2, eos_padding=True)(rows)
    assert eos["input_ids"][1].tolist() == [5, 6, 2, 2] and eos["labels"][1].tolist() == [-100, 6, 2, 2]
    assert eos["attention_mask"].all()
    pad = DiffusionCollator(pad_token_id=0, eos_token_id=2, eos_padding=False)(rows)
    assert pad["input_ids"][1].tolist() == [5, 6, 0, 0] and pad["labels"][1].tolist() == [-100, 6, -100, -100]
    assert pad["attention_mask"][1].tolist() == [1, 1, 0, 0]
    # LLaDA's fixed window: every response EOS-padded to 4 tokens, the rest plain padding
    fixed = DiffusionCollator(pad_token_id=0, eos_token_id=2, response_length=4)(rows)
    assert fixed["input_ids"].tolist() == [[5, 6, 7, 2, 2], [5, 6, 2, 2, 2]]
    assert fixed["labels"].tolist() == [[-100, 6, 7, 2, 2], [-100, 6, 2, 2, 2]]
    with pytest.raises(ConfigError, match="response_length=4 needs 5 positions > max_length=4"):
        DiffusionCollator(pad_token_id=0, eos_token_id=2, response_length=4, max_length=4)(rows)
    with pytest.raises(ConfigError, match="a row of 4 tokens exceeds max_length=3"):
        DiffusionCollator(pad_token_id=0, eos_token_id=2, max_length=3)(rows)


# ----------------------------------------------------------------------------- trainer
def test_override_runs_and_never_masks_the_prompt(tok, tmp_path):
    model = tiny_model(tok)
    rows = sft_rows(tok)
    seen = []
    model.register_forward_hook(lambda mod, args, kwargs, out: seen.append(kwargs["input_ids"].clone()), with_kwargs=True)
    trainer = make_trainer(tok, model, rows, tmp_path, max_steps=3)
    trainer.train()
    assert trainer.loss_calls == 3 and len(seen) == 3
    assert trainer.model_accepts_loss_kwargs is False
    mask_id = tok.mask_token_id
    prompt_len = len(tok(PROMPT)["input_ids"])
    assert all(r["labels"][:prompt_len] == [IGNORE_INDEX] * prompt_len and r["labels"][prompt_len] != IGNORE_INDEX
               for r in rows)
    masked_any = 0
    for batch in seen:
        assert not (batch[:, :prompt_len] == mask_id).any()
        masked_any += int((batch[:, prompt_len:] == mask_id).sum())
    assert masked_any > 0
    logs = [h for h in trainer.state.log_history if "nelbo" in h]
    assert logs and all("anchor_loss" not in h for h in logs)


def test_anchored_needs_adlm_and_logs_anchor_loss(tok, tmp_path):
    rows = sft_rows(tok)
    with pytest.raises(ConfigError, match="needs an ADLM"):
        make_trainer(tok, tiny_model(tok, "mdlm"), rows, tmp_path, anchored=True)
    trainer = make_trainer(tok, tiny_model(tok, "adlm"), rows, tmp_path, anchored=True, max_steps=4,
                           anchor_gamma=0.01, gamma_warmup_ratio=0.5)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "nelbo" in h]
    assert [h["gamma"] for h in logs] == pytest.approx([0.0, 0.005, 0.01, 0.01])
    assert all(h["anchor_loss"] > 0 for h in logs)
    assert logs[-1]["loss"] == pytest.approx(logs[-1]["nelbo"] + 0.01 * logs[-1]["anchor_loss"], rel=1e-4)


def test_gamma_zero_loss_is_the_denoiser_nelbo(tok, tmp_path):
    from anchored_reasoning.train.trainers.diffusion_trainer import DiffusionCollator

    model = tiny_model(tok, "adlm")
    trainer = make_trainer(tok, model, sft_rows(tok), tmp_path, anchored=False)
    batch = DiffusionCollator.for_tokenizer(tok)(sft_rows(tok)[:4])
    torch.manual_seed(1)
    loss = trainer.compute_loss(model, dict(batch))
    assert trainer._metrics["train"]["nelbo"][-1] == pytest.approx(float(loss.detach()), rel=1e-6)
    assert trainer._metrics["train"]["anchor_loss"][-1] > 0  # logged even when it is not trained


def test_pretraining_nelbo_decreases(tok, tmp_path):
    from anchored_reasoning.objectives import perplexity_bound
    from anchored_reasoning.train.data.diffusion_data import packed_rows, tokenize_documents

    text = [f"Question {i}: what is {i} plus one? The answer is {i + 1}." for i in range(40)]
    blocks = pack_token_blocks(tokenize_documents(tok, text), 32, keep_last=False)
    model = tiny_model(tok)
    x = torch.tensor(blocks)
    before = perplexity_bound(model, x, num_t_samples=4, seed=0).nelbo
    trainer = make_trainer(tok, model, packed_rows(blocks), tmp_path, diffusion_mode="pretrain", max_steps=40)
    assert trainer.args.loss_normalization == "token"
    trainer.train()
    after = perplexity_bound(model, x, num_t_samples=4, seed=0).nelbo
    assert after < 0.8 * before, (before, after)


def test_config_validation():
    from anchored_reasoning.train.trainers.diffusion_trainer import DiffusionSFTConfig

    with pytest.raises(ConfigError, match="diffusion_mode"):
        DiffusionSFTConfig(output_dir="/tmp/x", diffusion_mode="ar")
    with pytest.raises(ConfigError, match="anchor_tau"):
        DiffusionSFTConfig(output_dir="/tmp/x", anchor_tau=0)
    cfg = DiffusionSFTConfig(output_dir="/tmp/x")
    assert cfg.loss_normalization == "sequence" and cfg.remove_unused_columns is False
    assert cfg.dataset_kwargs == {"skip_prepare_dataset": True} and cfg.gradient_checkpointing is False
    assert cfg.bf16 is bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


# ----------------------------------------------------------------------------- recipes / run
def test_recipe_unknown_key_fails_before_work(tmp_path):
    from anchored_reasoning.train.pipelines.diffusion import run

    with pytest.raises(ConfigError, match=r"training\.learnig_rate"):
        run("diffusion_tiny_test", [f"output_dir={tmp_path}", "training.learnig_rate=1"])
    with pytest.raises(ConfigError, match=r"data\.text_fil"):
        run("diffusion_tiny_test", [f"output_dir={tmp_path}", "data.text_fil=x.txt"])
    assert not any(tmp_path.iterdir())


def test_bf16_guard_on_cpu(tmp_path):
    from anchored_reasoning.train.pipelines.diffusion import make_config

    if torch.cuda.is_available():
        pytest.skip("the guard is about machines without CUDA")
    assert make_config({"training": {"bf16": "auto"}}, tmp_path).bf16 is False
    with pytest.raises(ConfigError, match="bf16"):
        make_config({"training": {"bf16": True}}, tmp_path)


def test_response_length_must_fit_the_context(tmp_path):
    from anchored_reasoning.train.pipelines.diffusion import run

    with pytest.raises(ConfigError, match="response_length=190"):
        run("diffusion_tiny_test", [f"output_dir={tmp_path}", "training.response_length=190"])


def test_acot_method_rejected_for_diffusion(tmp_path):
    from anchored_reasoning.train.pipelines.diffusion import run

    with pytest.raises(ConfigError, match="anchors the response"):
        run("diffusion_tiny_test", [f"output_dir={tmp_path}", "method.name=acot"])


def test_tiny_recipe_trains_saves_and_reloads(tmp_path):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from anchored_reasoning.train.pipelines.diffusion import run

    out = run("diffusion_tiny_test", [f"output_dir={tmp_path / 'ckpt'}"])
    meta = json.loads((out / "anchored_reasoning.json").read_text())
    assert meta["method"] == "cot" and meta["style"] == "trained" and meta["backend"] == "diffusion"
    assert meta["gen_length"] == 48  # training.response_length: the window the backend fills by default
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["global_steps"] == 4 and summary["encode_stats"]["rows"] == 32
    assert any("anchor_loss" in h for h in summary["log_history"])
    model = AutoModelForMaskedLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert type(model).__name__ == "ADLM" and model.config.mask_token_id == tok.mask_token_id
    assert "[BoR]" in tok.get_vocab()


def test_pretrain_recipe_on_a_text_file(tmp_path):
    from anchored_reasoning.train.pipelines.diffusion import run

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"Line {i}: the quick brown fox jumps over {i} lazy dogs." for i in range(80)))
    out = run("diffusion_pretrain_tiny_mdlm", [
        f"output_dir={tmp_path / 'ckpt'}", f"data.text_file={corpus}", f"data.valid_text_file={corpus}",
        "data.seq_len=32", "model.tokenizer_vocab_size=300", "training.max_steps=3", "training.logging_steps=1",
        "model.config.max_position_embeddings=32", "data.ppl_t_samples=2",
    ])
    summary = json.loads((out / "train_summary.json").read_text())
    bound = summary["valid_perplexity_bound"]
    assert bound["perplexity"] > 1 and bound["num_tokens"] > 0 and summary["encode_stats"]["seq_len"] == 32
    with pytest.raises(ConfigError, match="exceeds the model's max_position_embeddings"):
        run("diffusion_pretrain_tiny_mdlm", [f"output_dir={tmp_path / 'c2'}", f"data.text_file={corpus}",
                                             "data.seq_len=64", "model.config.max_position_embeddings=32",
                                             "model.tokenizer_vocab_size=300"])


def test_resize_vocab_keeps_adlm_denoiser_input(tok):
    from anchored_reasoning.train.pipelines.diffusion import resize_vocab

    model = tiny_model(tok, "adlm").eval()
    x = torch.tensor([[5, 6, 7, tok.mask_token_id]])
    with torch.no_grad():
        before = model.anchor_proj(model.anchor_forward(x))
        resize_vocab(model, len(tok) + 3)
        after = model.anchor_proj(model.anchor_forward(x))
    assert model.config.vocab_size == len(tok) + 3 and model.lm_head.out_features == len(tok) + 3
    torch.testing.assert_close(before, after)


@pytest.mark.slow
def test_accelerate_launch_two_processes(tmp_path):
    """`accelerate launch` runs a diffusion recipe unchanged, as a real 2-process gloo group on CPU."""
    import os
    import shutil
    import subprocess
    from pathlib import Path

    from anchored_reasoning.resources import builtin_dir

    if shutil.which("accelerate") is None:
        pytest.skip("the accelerate launcher is not on PATH")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    out = tmp_path / "ddp"
    import socket

    with socket.socket() as sock:  # a free rendezvous port: never collide with another run's default 29500
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = ["accelerate", "launch", "--config_file", str(builtin_dir("train") / "accelerate" / "ddp_cpu.yaml"),
           "--main_process_port", str(port),
           "-m", "anchored_reasoning.cli", "train", "diffusion_tiny_test", f"output_dir={out}", "training.max_steps=2",
           "training.per_device_train_batch_size=4"]
    proc = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_steps"] == 2
    assert (out / "model.safetensors").is_file() and (out / "anchored_reasoning.json").is_file()
