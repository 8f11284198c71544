"""``anchored-reasoning ppl``: the NELBO perplexity bound on a text file or a task split."""
from __future__ import annotations

import json
import os

import pytest
import torch

from anchored_reasoning.errors import ConfigError

torch.set_num_threads(1)

TEXT = "\n".join(f"Line {i}: the quick brown fox jumps over {i} lazy dogs." for i in range(30))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A saved tiny MDLM with its tokenizer (random weights: scoring does not need training)."""
    from anchored_reasoning.models import MDLM, MDLMConfig
    from anchored_reasoning.testing import train_tiny_tokenizer

    out = tmp_path_factory.mktemp("mdlm")
    tok = train_tiny_tokenizer(out, texts=TEXT.splitlines(), vocab_size=300)
    torch.manual_seed(0)
    model = MDLM(MDLMConfig.from_preset("tiny", vocab_size=len(tok), mask_token_id=tok.mask_token_id,
                                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                        hidden_size=32, num_attention_heads=2, intermediate_size=64,
                                        max_position_embeddings=48))
    model.save_pretrained(out)
    (out / "corpus.txt").write_text(TEXT)
    return out


def test_text_file_bound_scores_every_token_deterministically(ckpt):
    from anchored_reasoning.commands.ppl import evaluate_text_file, load_model_and_tokenizer
    from anchored_reasoning.train.data.diffusion_data import read_text_documents, tokenize_documents

    model, tok, _ = load_model_and_tokenizer(str(ckpt))
    a = evaluate_text_file(model, tok, ckpt / "corpus.txt", seq_len=40, t_samples=2, seed=1)
    b = evaluate_text_file(model, tok, ckpt / "corpus.txt", seq_len=40, t_samples=2, seed=1)
    c = evaluate_text_file(model, tok, ckpt / "corpus.txt", seq_len=40, t_samples=2, seed=2)
    n_tokens = len(tokenize_documents(tok, read_text_documents(ckpt / "corpus.txt")))
    assert a == b and a["nelbo"] != c["nelbo"]
    assert a["num_tokens"] == n_tokens  # the last, shorter block is scored too
    assert a["num_sequences"] == -(-n_tokens // 40)
    # An untrained model is about as good as uniform over the vocabulary: the bound is near |V|.
    assert 0.3 * len(tok) < a["perplexity"] < 3 * len(tok)
    with pytest.raises(ConfigError, match="exceeds the model's max_position_embeddings=48"):
        evaluate_text_file(model, tok, ckpt / "corpus.txt", seq_len=64)


def test_cli_prints_and_writes_json(ckpt, tmp_path, capsys):
    from anchored_reasoning.cli import main

    out = tmp_path / "ppl.json"
    rc = main(["ppl", "--model", str(ckpt), "--text-file", str(ckpt / "corpus.txt"), "--t-samples", "2",
               "--seq-len", "32", "--out", str(out)])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert printed["seq_len"] == 32 and printed["perplexity"] > 1
    # defaults to the model's context when no pretraining summary says otherwise
    assert main(["ppl", "--model", str(ckpt), "--text-file", str(ckpt / "corpus.txt"), "--t-samples", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["seq_len"] == 48


def test_cli_bad_input(ckpt, capsys):
    from anchored_reasoning.cli import main

    assert main(["ppl", "--model", str(ckpt)]) == 1
    assert "exactly one of --text-file" in capsys.readouterr().err
    assert main(["ppl", "--model", str(ckpt), "--text-file", "no/such/file.txt"]) == 1
    assert "not found" in capsys.readouterr().err
    assert main(["ppl", "--model", str(ckpt), "--text-file", str(ckpt / "corpus.txt"), "--seq-len", "4096"]) == 1
    assert "max_position_embeddings" in capsys.readouterr().err


def test_default_seq_len_from_pretraining_summary(ckpt, tmp_path):
    from anchored_reasoning.commands.ppl import default_seq_len

    assert default_seq_len(ckpt, 48) == 48
    (tmp_path / "train_summary.json").write_text(json.dumps({"encode_stats": {"seq_len": 16}}))
    assert default_seq_len(tmp_path, 48) == 16


@pytest.mark.skipif(not os.environ.get("ANCHORED_REASONING_DATA"), reason="needs $ANCHORED_REASONING_DATA (ProsQA valid split)")
def test_task_split_scores_responses_only(tmp_path):
    """ProsQA valid rendered in the trained CoT format; rows longer than the context are counted, not cut."""
    from anchored_reasoning.commands.ppl import evaluate_task
    from anchored_reasoning.errors import DataError
    from anchored_reasoning.models import MDLM, MDLMConfig
    from anchored_reasoning.testing import train_tiny_tokenizer

    tok = train_tiny_tokenizer(tmp_path, vocab_size=400)
    torch.manual_seed(0)
    model = MDLM(MDLMConfig.from_preset("tiny", vocab_size=len(tok), mask_token_id=tok.mask_token_id,
                                        hidden_size=32, num_attention_heads=2, intermediate_size=64,
                                        max_position_embeddings=320))
    with pytest.raises(DataError, match="max_length=320"):
        evaluate_task(model, tok, "prosqa", "valid", limit=8, t_samples=1)
    result = evaluate_task(model, tok, "prosqa", "valid", limit=8, t_samples=1, overlong="drop")
    assert result["rows"] + result["dropped_overlong"] == 8 and result["method"] == "cot"
    assert result["num_tokens"] > 0 and result["perplexity"] > 1
