"""Coconut's training data: :class:`CoconutCollator` (rows rendered at their stage, ``<eot>`` aligned) and
:func:`check_coconut_fits` (stages and ``c`` against the traces and the model's positions, before training).

They live apart from :mod:`anchored_reasoning.train.trainers.coconut_trainer` so that the run set-up
(``train/pipelines/method_setup.py``) can build and check them without importing a trainer.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.methods.coconut import EOT
from anchored_reasoning.train.data.collate import IGNORE, ROWS_KEY, STAGE_KEY, AnchoredCollator, row_to_example

__all__ = ["CoconutCollator", "check_coconut_fits"]


@dataclass
class CoconutCollator(AnchoredCollator):
    """Renders rows with the Coconut method at the current stage (each row's stage drawn with ``uniform_prob``)
    and pads so that every row's ``<eot>`` sits in the same column (left padding), the rest on the right: the
    last thoughts of all rows then share a column and every target token comes after it (rows with fewer
    thoughts, or none under ``uniform_prob``, included), so the final pass scores the whole target."""

    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._rng = random.Random(self.seed)
        self._eot = self.tokenizer.get_vocab().get(EOT)

    def render_row(self, row: dict[str, Any]):
        method = self.staged_method
        if method is None or not hasattr(method, "draw_stage") or "example" not in row:
            return super().render_row(row)
        example = row_to_example(row)
        return method.render_at(example, self.task, method.draw_stage(example, self._rng))

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        items = [self.tokenize(r) for r in rows]
        latent = bool(getattr(self.method, "latent", False)) and self._eot is not None
        ends = [it.input_ids.index(self._eot) if latent and self._eot in it.input_ids else None for it in items]
        align = max((e for e in ends if e is not None), default=0)
        shifts = [align - e if e is not None else 0 for e in ends]
        width = max(s + len(it.input_ids) for s, it in zip(shifts, items))
        n, pad = len(items), self.tokenizer.pad_token_id
        input_ids = torch.full((n, width), pad, dtype=torch.long)
        attention = torch.zeros((n, width), dtype=torch.long)
        labels = torch.full((n, width), IGNORE, dtype=torch.long)
        for row, (s, it) in enumerate(zip(shifts, items)):
            end = s + len(it.input_ids)
            input_ids[row, s:end] = torch.tensor(it.input_ids)
            attention[row, s:end] = 1
            labels[row, s:end] = torch.tensor(it.labels)
        batch = {"input_ids": input_ids, "attention_mask": attention, "labels": labels}
        if self.keep_rows:
            batch[STAGE_KEY] = self.stage
            batch[ROWS_KEY] = list(rows)
        return batch


def check_coconut_fits(method: Any, examples: Sequence[Any], task: Any = None, tokenizer: Any = None,
                       max_positions: int | None = None) -> dict[str, int]:
    """Refuse, before training, a Coconut set-up that does not fit its traces: stages that would replace
    steps no training trace has (``max_latent_stage`` above the longest trace), traces without steps, and,
    with ``tokenizer`` and ``max_positions``, a last-stage or CoT-stage sequence (``max_latent_stage * c``
    thoughts) longer than the model's positions. Returns the numbers checked."""
    lengths = [len(method.steps_of(ex)) for ex in examples]
    if not lengths or max(lengths) == 0:
        raise ConfigError("method coconut replaces reasoning steps by thoughts, but the training examples have no "
                          "steps: train cot or nocot on them instead")
    longest = max(lengths)
    if method.max_latent_stage > longest:
        raise ConfigError(
            f"method coconut: max_latent_stage={method.max_latent_stage} stages replace up to "
            f"{method.max_latent_stage} steps, but the longest training trace has {longest} steps, so stages "
            f"{longest + 1}..{method.max_latent_stage} would train nothing new; set max_latent_stage <= {longest}")
    out = {"longest_trace_steps": longest, "max_thoughts": method.max_thoughts()}
    if tokenizer is not None and max_positions:
        worst = max(examples, key=lambda ex: len(ex.question or "") + sum(len(s) for s in method.steps_of(ex)))
        need = 0
        for stage in (0, method.num_stages - 1):
            r = method.render_at(worst, task, stage)
            need = max(need, len(tokenizer(r.prompt)["input_ids"]) + len(tokenizer(r.target)["input_ids"]) + 1)
        out["longest_sequence_tokens"] = need
        if need > max_positions:
            raise ConfigError(
                f"method coconut: the longest training sequence needs {need} positions (with up to "
                f"{method.max_thoughts()} thoughts: max_latent_stage={method.max_latent_stage} x c={method.c}), "
                f"more than the model's {max_positions}; lower c or max_latent_stage, or shorten the traces")
    return out
