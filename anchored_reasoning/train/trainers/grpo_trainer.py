"""AnchoredGRPOTrainer: TRL's GRPOTrainer plus gamma x the anchor cross-entropy at the prompt's [ANT] slots.

    loss = TRL's GRPO loss (any loss_type)  +  gamma * CE(hidden state at each [ANT] slot -> its gold anchor)

The anchor labels are the SFT collator's (:func:`anchored_reasoning.train.data.collate.tokenize_rendered`),
looked up per prompt in an :class:`AnchorTable`. ``compute_loss`` adds the term; the completion's
per-token log-probabilities and the anchor log-probabilities come from ONE fused-head forward: the
override of ``_get_per_token_logps_and_entropies`` writes each slot's anchor id into the pre-shifted
labels (a slot is never the last prompt token, so it carries no completion label) and reads both out.
With ``gamma = 0``, without a table, or for a batch without slots it is exactly TRL's GRPO step.

Pinned to trl 1.16: ``_get_per_token_logps_and_entropies`` and ``self._metrics`` are TRL internals;
tests/test_grpo.py fails when TRL's loop stops calling the overrides or when the log-probs differ from TRL's.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

import torch
from trl import GRPOConfig, GRPOTrainer

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.train.trainers.acot_trainer import _accelerator_available
from anchored_reasoning.train.data.collate import IGNORE

logger = logging.getLogger(__name__)


@dataclass
class AnchoredGRPOConfig(GRPOConfig):
    """GRPOConfig (every TRL loss type and default) plus the anchor term; defaults fit a CPU."""

    gamma: float = field(default=1.0, metadata={"help": "weight of the anchor cross-entropy at [ANT] slots (0 = plain GRPO)"})
    ant_token: str = field(default="[ANT]", metadata={"help": "the anchor slot token"})
    max_train_seconds: float | None = field(default=None, metadata={"help": "stop training after this many seconds"})
    extend_max_steps: bool = field(
        default=False, metadata={"help": "let a rerun raise max_steps and go on from the last checkpoint (train/checkpointing.py)"}
    )
    save_every_minutes: float | None = field(
        default=None, metadata={"help": "also save a checkpoint after this much wall time (train/checkpointing.py)"})
    report_to: str | list[str] | None = "none"
    bf16: bool | None = False
    save_strategy: str = "no"
    logging_steps: float = 1
    remove_unused_columns: bool | None = False

    def __post_init__(self):
        if not self.use_cpu and not _accelerator_available():
            self.use_cpu = True  # see AnchoredSFTConfig: a CPU multi-process launch then forms a gloo group
        super().__post_init__()
        if self.gamma < 0:
            raise ConfigError(f"training.gamma must be >= 0, got {self.gamma}")


class AnchorTable:
    """Anchor labels of every training prompt, keyed by its token ids (TRL tokenizes prompts itself, with
    the same ``tokenizer(text)`` call as the SFT collator, so the ids match)."""

    def __init__(self, tokenizer, ant_token: str = "[ANT]"):
        self.tokenizer = tokenizer
        self.ant_id = tokenizer.get_vocab().get(ant_token)
        self._labels: dict[tuple[int, ...], torch.Tensor] = {}
        self.misses = 0

    def __len__(self) -> int:
        return len(self._labels)

    def add(self, prompt: str, anchors: Sequence[str], where: str = "") -> None:
        from anchored_reasoning.methods import Rendered
        from anchored_reasoning.train.data.collate import tokenize_rendered

        if self.ant_id is None or not anchors:
            return
        item = tokenize_rendered(Rendered(prompt, "", list(anchors)), self.tokenizer, ant_id=self.ant_id,
                                 add_eos=False, where=where)
        if item.n_anchor_labels:
            self._labels[tuple(item.input_ids)] = torch.tensor(item.anchor_labels, dtype=torch.long)

    def labels_for(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, width: int) -> torch.Tensor | None:
        """(B, width) anchor labels for left-padded prompts followed by completions; None when no row has any."""
        out = torch.full((prompt_ids.size(0), width), IGNORE, dtype=torch.long, device=prompt_ids.device)
        plen, found = prompt_ids.size(1), False
        for row in range(prompt_ids.size(0)):
            ids = prompt_ids[row][prompt_mask[row].bool()].tolist()
            labels = self._labels.get(tuple(ids))
            if labels is None:
                self.misses += 1
                continue
            out[row, plen - len(ids):plen] = labels
            found = True
        return out if found else None


class AnchoredGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose loss adds ``gamma x`` the anchor cross-entropy at the prompt's [ANT] slots.

    ``compute_loss`` looks up the batch's anchor labels and adds the term; the per-token log-probabilities
    and the anchor log-probabilities come from ONE fused-head forward (the override of
    ``_get_per_token_logps_and_entropies`` scores the anchor at each slot in the same pass). Without an
    anchor table, with ``gamma = 0`` or for a batch without slots it is exactly TRL's GRPO step.
    """

    _tag_names = ["trl", "grpo", "anchored-cot"]

    def __init__(self, *args, anchor_table: AnchorTable | None = None, added_tokens: Sequence[str] = (), **kwargs):
        # A LoRA ``peft_config`` from Python is applied here, not by TRL, so the anchoring format's new token rows
        # ([ANT], [EoR], ... and ``added_tokens``) train through ``trainable_token_indices`` as on the recipe path
        # (TRL's own wrapping would leave them at their initialisation: the base embedding is frozen).
        model = kwargs["model"] if "model" in kwargs else (args[0] if args else None)
        tokenizer = kwargs.get("processing_class")
        if kwargs.get("peft_config") is not None and isinstance(model, torch.nn.Module) and tokenizer is not None:
            from anchored_reasoning.train import peft_setup

            seed = int(getattr(kwargs.get("args"), "seed", 0) or 0)
            model = peft_setup.wrap(model, kwargs.pop("peft_config"), tokenizer, added_tokens, seed=seed)
            if "model" in kwargs:
                kwargs["model"] = model
            else:
                args = (model, *args[1:])
        super().__init__(*args, **kwargs)
        self.anchor_table = anchor_table
        self.compute_loss_calls = 0
        self.anchored_forward_calls = 0
        self._pending_anchor_labels: torch.Tensor | None = None
        self._anchor_terms: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def gamma(self) -> float:
        return float(getattr(self.args, "gamma", 0.0))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.compute_loss_calls += 1
        labels = None
        if self.anchor_table is not None and self.gamma > 0:
            width = inputs["prompt_ids"].size(1) + inputs["completion_ids"].size(1)
            labels = self.anchor_table.labels_for(inputs["prompt_ids"], inputs["prompt_mask"], width)
        self._pending_anchor_labels, self._anchor_terms = labels, None
        try:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        finally:
            self._pending_anchor_labels = None
        if self._anchor_terms is None:
            return loss
        anchor_sum, n_anchor = self._anchor_terms
        self._anchor_terms = None
        mode = "train" if self.model.training else "eval"
        anchor_loss = anchor_sum / n_anchor.clamp(min=1)
        normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0  # as TRL's grpo loss
        with torch.no_grad():
            stats = self.accelerator.gather(torch.stack([anchor_sum.detach(), n_anchor.to(anchor_sum.dtype)]).unsqueeze(0)).sum(0)
            self._metrics[mode]["anchor_loss"].append((stats[0] / stats[1].clamp(min=1)).item())
        return loss + self.gamma * anchor_loss / normalizer

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **multimodal):
        anchor_labels = self._pending_anchor_labels
        if anchor_labels is None or any(v is not None for v in multimodal.values()):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal)
        self.anchored_forward_calls += 1
        # Pre-shifted labels: position p scores token p+1 on the completion and, at an [ANT] slot (never the
        # last prompt token, so it carries no completion label), the slot's anchor -- one pass scores both.
        labels = input_ids.masked_fill(attention_mask == 0, IGNORE)
        labels[:, :-logits_to_keep] = IGNORE
        shifted = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=IGNORE)
        anchor_mask = anchor_labels != IGNORE
        merged = torch.where(anchor_mask, anchor_labels, shifted)
        model_inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if compute_aux_loss:
            model_inputs["output_router_logits"] = True
        with self.accelerator.autocast():
            outputs = model(**model_inputs, shift_labels=merged, fused_lm_head=True)
        window = slice(-logits_to_keep - 1, -1)
        logps = outputs.log_probs[:, window]
        entropies = outputs.entropy[:, window] if compute_entropy else None
        self._anchor_terms = (-(outputs.log_probs * anchor_mask).sum(), anchor_mask.sum())
        return logps, entropies, (outputs.aux_loss if compute_aux_loss else None)
