"""Turning text into the token rows the diffusion trainer and the perplexity command read.

Two shapes:

* **prompt / response** (SFT): ``input_ids = prompt_ids + response_ids + [eos]`` and ``labels``
  equal to ``input_ids`` on the response (and its EOS), ``-100`` on the prompt. The prompt and the
  response are tokenized *separately* so that the prompt tokens are exactly the ones the diffusion
  backend feeds at inference (``tokenizer(prompt)``) and the response starts on a token boundary.
  Bad rows are never truncated silently (see :func:`encode_prompt_response`).
* **packed text** (pretraining, perplexity): documents are tokenized, joined with EOS and cut into
  blocks of ``seq_len`` tokens (:func:`pack_token_blocks`). Every token is a loss token.

Optional ``anchor_mask`` (1 at anchor positions) is built here from a task's anchor strings located
in the response text. (The ADLM frequency rule needs no column: the trainer applies it per batch.)
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from anchored_reasoning.errors import ConfigError, DataError

log = logging.getLogger(__name__)

IGNORE_INDEX = -100

#: What to do with a row longer than ``max_length``: raise (default), or drop it and count it.
OVERLONG_POLICIES = ("error", "drop")


class OverlongRow(DataError):
    """A row that does not fit ``max_length`` (its prompt alone, or prompt + response + EOS)."""


@dataclass
class EncodeStats:
    """Counts reported after encoding a data set (dropped rows are never silent)."""

    rows: int = 0
    dropped_overlong: int = 0
    without_anchors: int = 0
    anchors_not_found: int = 0
    dropped_ids: list[str] = field(default_factory=list)

    def log(self, where: str) -> None:
        log.info(
            "%s: %d rows encoded, %d dropped as too long%s, %d without anchors, %d anchor strings not found in the response",
            where, self.rows, self.dropped_overlong,
            f" (first ids: {', '.join(self.dropped_ids[:5])})" if self.dropped_ids else "",
            self.without_anchors, self.anchors_not_found,
        )


def _ids(tokenizer, text: str, *, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def anchor_mask_from_strings(tokenizer, response: str, anchors: Sequence[str]) -> tuple[list[int], int]:
    """Mark the response tokens that spell the anchor strings.

    Anchors are searched for in order, each from where the previous one was found (a trace names
    its nodes in order), case-insensitively; when an anchor is not found after the previous one it
    is searched from the start. Returns (mask over ``tokenizer(response)`` tokens, number of anchors
    not found). Needs a fast tokenizer (offset mappings).
    """
    enc = tokenizer(response, add_special_tokens=False, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    mask = [0] * len(offsets)
    lower = response.lower()
    missing = 0
    cursor = 0
    for anchor in anchors:
        needle = anchor.lower().strip()
        if not needle:
            continue
        start = lower.find(needle, cursor)
        if start == -1:
            start = lower.find(needle)
        if start == -1:
            missing += 1
            continue
        end = start + len(needle)
        cursor = end
        for i, (a, b) in enumerate(offsets):
            if a < end and b > start and b > a:
                mask[i] = 1
    return mask, missing


def encode_prompt_response(
    tokenizer,
    prompt: str,
    response: str,
    max_length: int,
    *,
    example_id: str = "?",
    anchors: Sequence[str] | None = None,
) -> dict[str, list[int]]:
    """Encode one SFT row. Raises :class:`DataError` for an empty response, a prompt that fills the
    whole context (nothing left to generate), or a row longer than ``max_length``.

    ``anchors`` (strings from a task's extractor) adds an ``anchor_mask`` over the full row
    (0 on the prompt and on the EOS).
    """
    if not response or not response.strip():
        raise DataError(f"example {example_id}: empty response; every SFT row needs a non-empty target")
    if tokenizer.eos_token_id is None:
        raise ConfigError("the tokenizer has no eos_token; diffusion SFT appends EOS to every response")
    prompt_ids = _ids(tokenizer, prompt, special=True)
    response_ids = _ids(tokenizer, response, special=False) + [tokenizer.eos_token_id]
    if len(prompt_ids) >= max_length:
        raise OverlongRow(
            f"example {example_id}: the prompt alone is {len(prompt_ids)} tokens and fills the whole context "
            f"(max_length={max_length}); raise max_length (up to the model's max_position_embeddings) or shorten the prompt"
        )
    total = len(prompt_ids) + len(response_ids)
    if total > max_length:
        raise OverlongRow(
            f"example {example_id}: prompt + response + EOS is {total} tokens > max_length={max_length}; "
            "raise max_length, or set overlong: drop in the recipe to skip such rows (they are counted in the log)"
        )
    row = {
        "input_ids": prompt_ids + response_ids,
        "labels": [IGNORE_INDEX] * len(prompt_ids) + response_ids,
    }
    if anchors is not None:
        mask, _ = anchor_mask_from_strings(tokenizer, response, anchors)
        row["anchor_mask"] = [0] * len(prompt_ids) + mask + [0]
    return row


def encode_sft_rows(
    tokenizer,
    rows: Iterable[dict[str, Any]],
    max_length: int,
    *,
    overlong: str = "error",
    anchor_source: str | None = None,
    where: str = "train",
) -> tuple[list[dict[str, list[int]]], EncodeStats]:
    """Encode rows ``{"id", "prompt", "completion", "anchors"?}``.

    ``anchor_source="task"`` adds an ``anchor_mask`` from the row's ``anchors`` strings (the task's
    anchor extractor); None adds nothing (the trainer's frequency rule, if anchored, needs no column).
    """
    if overlong not in OVERLONG_POLICIES:
        raise ConfigError(f"overlong must be one of {OVERLONG_POLICIES}, got {overlong!r}")
    if anchor_source not in (None, "task"):
        raise ConfigError(f"anchor_source must be None or 'task', got {anchor_source!r}")
    stats = EncodeStats()
    out: list[dict[str, list[int]]] = []
    for i, row in enumerate(rows):
        ex_id = str(row.get("id", i))
        anchors = None
        if anchor_source == "task":
            anchors = list(row.get("anchors") or [])
        try:
            enc = encode_prompt_response(
                tokenizer, row["prompt"], row["completion"], max_length, example_id=ex_id, anchors=anchors,
            )
        except OverlongRow:
            if overlong != "drop":
                raise
            stats.dropped_overlong += 1
            stats.dropped_ids.append(ex_id)
            continue
        if anchor_source == "task":
            _, missing = anchor_mask_from_strings(tokenizer, row["completion"], anchors or [])
            stats.anchors_not_found += missing
        if anchor_source == "task" and not any(enc["anchor_mask"]):
            stats.without_anchors += 1
        out.append(enc)
        stats.rows += 1
    if not out:
        raise DataError(f"{where}: no usable rows after encoding ({stats.dropped_overlong} dropped as longer than {max_length} tokens)")
    stats.log(where)
    return out, stats


def tokenize_documents(tokenizer, documents: Iterable[str]) -> list[int]:
    """Tokenize documents and join them with EOS (one EOS after each document)."""
    if tokenizer.eos_token_id is None:
        raise ConfigError("the tokenizer has no eos_token; packing joins documents with EOS")
    ids: list[int] = []
    for doc in documents:
        if doc:
            ids.extend(_ids(tokenizer, doc, special=False))
            ids.append(tokenizer.eos_token_id)
    return ids


def pack_token_blocks(ids: Sequence[int], seq_len: int, *, keep_last: bool) -> list[list[int]]:
    """Cut a token stream into blocks of ``seq_len``. The last, shorter block is kept when
    ``keep_last`` (evaluation: every token counts) and dropped otherwise (training: equal shapes)."""
    if seq_len < 2:
        raise ConfigError(f"seq_len must be at least 2, got {seq_len}")
    blocks = [list(ids[i:i + seq_len]) for i in range(0, len(ids), seq_len)]
    if blocks and len(blocks[-1]) < seq_len and not keep_last:
        blocks.pop()
    return blocks


def packed_rows(blocks: list[list[int]]) -> list[dict[str, list[int]]]:
    """Pretraining rows: every token is a loss token (``labels == input_ids``)."""
    return [{"input_ids": list(block), "labels": list(block)} for block in blocks]


def read_text_documents(path, *, split_lines: bool = False) -> list[str]:
    """Read a text corpus. By default the whole file is one document (its newlines are tokens);
    ``split_lines`` makes every non-empty line a document (EOS between lines)."""
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        raise DataError(f"text file {p} does not exist")
    text = p.read_text(encoding="utf-8")
    if not text.strip():
        raise DataError(f"text file {p} is empty")
    if split_lines:
        return [line for line in text.splitlines() if line.strip()]
    return [text]
