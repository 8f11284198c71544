"""CoconutSFTTrainer: TRL's SFTTrainer (through :class:`AnchoredSFTTrainer`) with Coconut's continuous thoughts.

    loss = LM loss on the target tokens of the final pass, after n passes that fill the n thoughts

``compute_loss`` runs :func:`anchored_reasoning.backends.latent.latent_forward`: one forward pass up to the
first ``<thought>``, one per thought (its embedding := the last hidden state of the position before it,
gradients flowing through every thought, as in Coconut), and a final pass whose logits score the target.
The KV cache carries earlier columns between passes (``CoconutSFTTrainer(latent_cache=False)``: n + 1
full passes instead, the same loss). Pause-as-thought (``thought="pause"``) and stage 0 have no thoughts: one pass.

:class:`CoconutCollator` renders each row at its stage (Coconut's ``uniform_prob`` draw per row, from a
``random.Random`` seeded by the run's seed) and left-pads the rows so their ``<eot>`` markers share a column
(Coconut's collator aligns the first thoughts: the same when every row has the same number of thoughts,
``pad_latent_to_max``), so a batch costs n + 1 passes, not one per distinct column.

Stages, their epochs, the optimizer reset per stage and the budget check come from the library's
curriculum (``train/callbacks/curriculum.py``; ``training.curriculum: false`` is Coconut's "w/o curriculum").
Before training, :func:`check_coconut_fits` refuses stages or ``c`` that do not fit the traces or the model's
positions, naming the numbers.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import torch

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.train.data.coconut_data import CoconutCollator, check_coconut_fits  # noqa: F401 (re-exported)
from anchored_reasoning.train.data.collate import IGNORE, row_to_example, tokenize_rendered
from anchored_reasoning.train.trainers.acot_trainer import AnchoredSFTConfig, AnchoredSFTTrainer

logger = logging.getLogger(__name__)


@dataclass
class CoconutSFTConfig(AnchoredSFTConfig):
    """The config of a Coconut run: :class:`AnchoredSFTConfig`'s fields (a recipe's ``training`` keys are the
    same), and the type that tells the set-up the trainer runs the latent passes (a plain
    ``AnchoredSFTTrainer`` with a latent method is refused). Coconut's own defaults are the inherited ones:
    the optimizer reset at every stage (``reset_optimizer_on_stage``) and 5 of 50 epochs per stage."""

    latent_passes: ClassVar[bool] = True


class CoconutSFTTrainer(AnchoredSFTTrainer):
    """AnchoredSFTTrainer whose ``compute_loss`` runs Coconut's latent passes (see the module docstring).
    Built like it (``method="coconut"``, ``task=...``, a list of Examples); the args must be a
    :class:`CoconutSFTConfig`. One process: the passes call the model several times per step.
    ``latent_cache=False`` recomputes every pass from the first column (n + 1 full passes, the same loss)."""

    _name = "CoconutSFT"
    _tag_names = ["trl", "sft", "coconut"]

    def __init__(self, model=None, args=None, *rest, latent_cache: bool = True, **kwargs):
        if args is None and model is not None:
            name = str(getattr(getattr(model, "config", None), "_name_or_path", "") or model).rstrip("/").split("/")[-1]
            args = CoconutSFTConfig(output_dir=f"{name}-CoconutSFT")
        if not isinstance(args, CoconutSFTConfig):
            raise ConfigError(f"CoconutSFTTrainer trains with a CoconutSFTConfig (the same fields as "
                              f"AnchoredSFTConfig), got {type(args).__name__}")
        #: carry earlier columns in the KV cache between thought passes (False: n + 1 full passes, same loss)
        self.latent_cache = bool(latent_cache)
        super().__init__(model, args, *rest, **kwargs)
        if self.accelerator.num_processes > 1:
            raise ConfigError("coconut trains in one process here (several forward passes per step through one "
                              f"model); got {self.accelerator.num_processes} processes: launch it without accelerate")
        self.latent_passes = 0
        method = self.method if self.method is not None else getattr(self.data_collator, "method", None)
        if hasattr(method, "render_at") and self.train_dataset is not None:
            # every row: a mixture is stored in its sources' order (2-hop problems first), so a prefix would
            # judge max_latent_stage by the shortest traces only
            names = getattr(self.train_dataset, "column_names", None) or []
            examples = [row_to_example({"example": e}) for e in self.train_dataset["example"]] \
                if "example" in names else []
            if examples:  # stages and c against the traces and the model's positions, before training
                positions = getattr(self.model.config, "n_positions", None) or getattr(
                    self.model.config, "max_position_embeddings", None)
                self.coconut_check = check_coconut_fits(method, examples, self.task_name,
                                                        self.processing_class, positions)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        from anchored_reasoning.backends.latent import latent_forward, thought_id

        self.compute_loss_calls += 1
        mode = "train" if self.model.training else "eval"
        labels = inputs.pop("labels")
        for key in ("anchor_labels", "anchor_slots", "anchor_targets", "position_ids"):
            inputs.pop(key, None)
        tid = thought_id(self.processing_class)
        tid = -1 if tid is None else tid  # no placeholder in the vocabulary: one plain pass
        passes = latent_forward(model, inputs["input_ids"], inputs["attention_mask"], tid,
                                cache=self.latent_cache)
        self.latent_passes += passes.passes
        loss, correct, n_tokens = target_loss(passes.logits, labels, passes.start)
        with torch.no_grad():
            metrics = self._metrics[mode]
            metrics["lm_loss"].append(float(loss.detach()))
            metrics["mean_token_accuracy"].append(float(correct) / max(float(n_tokens), 1.0))
            metrics["latent_passes"].append(float(passes.passes))
            if mode == "train":
                self._total_train_tokens += int(inputs["attention_mask"].sum())
            metrics["num_tokens"] = [float(self._total_train_tokens)]
        return (loss, passes) if return_outputs else loss


def target_loss(logits: Any, labels: Any, start: int):
    """Mean cross-entropy of the target tokens, from the final pass's ``logits`` (columns ``start`` ..):
    the logits at column j predict ``labels[j + 1]``. Returns (loss, correct top-1 count, target tokens)."""
    targets = labels[:, start + 1:]
    if bool((labels[:, : start + 1] != IGNORE).any()):
        raise ConfigError("a target token comes before the last thought: the thoughts must sit in the prompt")
    scores = logits[:, :-1].float()
    mask = targets != IGNORE
    loss = torch.nn.functional.cross_entropy(scores.reshape(-1, scores.shape[-1]), targets.reshape(-1),
                                             ignore_index=IGNORE, reduction="sum") / mask.sum().clamp(min=1)
    correct = ((scores.argmax(-1) == targets) & mask).sum()
    return loss, correct, mask.sum()


def tokenized_lengths(method: Any, tokenizer: Any, examples: Sequence[Any], task: Any, stage: int) -> list[int]:
    """Token counts of ``examples`` rendered at ``stage`` (prompt + target + EOS), for sizing runs."""
    return [len(tokenize_rendered(method.render_at(ex, task, stage), tokenizer, ant_id=None).input_ids)
            for ex in examples]
