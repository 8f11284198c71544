"""Tiny models and tokenizers built locally, for tests and examples that must run offline in seconds.

>>> from anchored_reasoning.testing import make_tiny_causal_lm
>>> path = make_tiny_causal_lm("/tmp/tiny")      # a saved checkpoint loadable with from_pretrained

Library code never imports this module; the tokenizer trainer it re-exports lives in
:mod:`anchored_reasoning.tokenization`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from anchored_reasoning.tokenization import train_tiny_tokenizer

__all__ = ["make_tiny_causal_lm", "train_tiny_tokenizer"]


def make_tiny_causal_lm(
    out_dir: str | os.PathLike,
    *,
    texts: Iterable[str] | None = None,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    max_positions: int = 512,
    vocab_size: int = 512,
    seed: int = 0,
) -> Path:
    """Build a randomly initialised tiny Llama-architecture causal LM with a locally trained
    tokenizer and save both to ``out_dir``. Deterministic for a given seed. Returns the path."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    tokenizer = train_tiny_tokenizer(out, texts=texts, vocab_size=vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 4,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    return out
