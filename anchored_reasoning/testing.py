"""Tiny models and tokenizers built locally, for tests and examples that must run offline in seconds.

>>> from anchored_reasoning.testing import make_tiny_causal_lm
>>> path = make_tiny_causal_lm("/tmp/tiny")      # a saved checkpoint loadable with from_pretrained
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

# A small built-in corpus so the tokenizer covers digits, logic words and code punctuation.
_BASE_TEXT = [
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "How many clips did Natalia sell altogether in April and May? The answer is 72.",
    "Every wumpus is a tumpus. Alex is a wumpus. True or false: Alex is a tumpus? True",
    "Tom is a lempus. Every lempus is a brimpus. Is Tom a gorpus or a brimpus? Tom is a brimpus.",
    "def add(a, b):\n    return a + b\n\nassert add(1, 2) == 3\n",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 + - * / = ( ) [ ] { } < > #### ### ## # . , : ; ? ! ' \"",
    "The quick brown fox jumps over the lazy dog. Step 1: 16 - 3 - 4 = 9. Step 2: 9 * 2 = 18.",
]

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>", "<mask>"]


def train_tiny_tokenizer(out_dir: str | os.PathLike, texts: Iterable[str] | None = None, vocab_size: int = 512):
    """Train a byte-level BPE tokenizer on ``texts`` (plus a built-in sample) and save it as a
    ``PreTrainedTokenizerFast`` with pad/bos/eos/unk/mask tokens. Returns the tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = list(_BASE_TEXT) + list(texts or [])
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        mask_token="<mask>",
        padding_side="left",
    )
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return fast


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
