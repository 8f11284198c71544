"""Small byte-level BPE tokenizers trained on the task's own text, for from-scratch models.

The trainers use :func:`train_tiny_tokenizer` when a recipe asks for a tokenizer trained on the
training data (``model.tokenizer: train``) and for the synthetic-logic backbones; the tests use it
(through ``anchored_reasoning.testing``) to build tiny models offline. A short built-in sample is
always mixed in so every tokenizer covers digits, arithmetic, logic words and code punctuation.
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

BASE_SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>", "<mask>"]


def train_tiny_tokenizer(out_dir: str | os.PathLike, texts: Iterable[str] | None = None, vocab_size: int = 512):
    """Train a byte-level BPE tokenizer on ``texts`` (plus a built-in sample) and save it as a
    ``PreTrainedTokenizerFast`` with pad/bos/eos/unk/mask tokens and left padding. Returns the tokenizer.

    Deterministic for the same texts and vocabulary size. ``vocab_size`` is an upper bound: a small
    corpus may yield fewer merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = list(_BASE_TEXT) + list(texts or [])
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=BASE_SPECIAL_TOKENS,
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
