"""AnchoredSFTTrainer: TRL's SFTTrainer with the Anchored-CoT loss (PAPERS.md section 2).

    loss = LM loss on the target tokens  +  gamma * cross-entropy of the hidden state at each [ANT]
           slot (through the LM head) against the slot's anchor token

Only ``compute_loss`` is overridden. Both terms come out of ONE forward through TRL's fused LM head
(``fused_lm_head=True`` with pre-shifted ``shift_labels``): the LM targets are the labels shifted by one,
and at an [ANT] position (always followed by another prompt token, so it carries no LM target) the
anchor token is written in instead. One pass scores both, so ACoT costs what plain SFT costs.

With ``gamma = 0`` or a batch without anchors it reduces exactly to completion-only SFT, which is how
the baselines (nocot, cot, pause, stepwise) train with the same class.

Pinned to trl 1.16 (pyproject): the fused-head keyword and ``self._metrics`` are TRL internals;
``tests/test_acot_trainer.py`` fails if TRL stops routing the loss through this override.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from trl import SFTConfig, SFTTrainer

from anchored_reasoning.train.data.collate import IGNORE

logger = logging.getLogger(__name__)


def _accelerator_available() -> bool:
    accel = getattr(torch, "accelerator", None)
    if accel is not None and hasattr(accel, "is_available"):
        return bool(accel.is_available())
    return torch.cuda.is_available()


def _fsdp_plugin_for_cpu(trainer):
    """The FSDP plugin a CPU (gloo) process group asked for and accelerate dropped, or None.

    accelerate 1.x switches to FSDP only for accelerator device types: on CPU its state stays
    MULTI_CPU, forgets the plugin and wraps the model in DDP, silently (docs/distributed.md). Asked
    for through ``training.fsdp`` or an ``accelerate launch`` FSDP config, the plugin comes back here."""
    import os

    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    if trainer.accelerator.distributed_type != DistributedType.MULTI_CPU:
        return None
    if trainer.args.fsdp_plugin_args is not None:
        plugin = FullyShardedDataParallelPlugin(**trainer.args.fsdp_plugin_args)
    elif os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        plugin = FullyShardedDataParallelPlugin()  # from the FSDP_* variables accelerate launch sets
    else:
        return None
    if plugin.fsdp_version != 2:
        from anchored_reasoning.errors import ConfigError

        raise ConfigError(f"FSDP on CPU runs FSDP2 only (fsdp_version 2), got fsdp_version {plugin.fsdp_version}")
    return plugin


@dataclass
class AnchoredSFTConfig(SFTConfig):
    """SFTConfig plus the anchored-training fields. Defaults fit small models on CPU: fp32, no gradient
    checkpointing, the dataset is rendered on the fly by our collator (no TRL preparation)."""

    gamma: float = field(default=1.0, metadata={"help": "weight of the anchor cross-entropy at [ANT] slots"})
    num_anchor_slots: int = field(
        default=6, metadata={"help": "k, the number of [ANT] (or [PAUSE]) slots, unless method.options.k sets it"}
    )
    ant_token: str = field(default="[ANT]", metadata={"help": "the anchor slot token"})

    # curriculum (anchored_reasoning/train/callbacks/curriculum.py)
    curriculum: bool = field(default=False, metadata={"help": "move through the method's stages during training"})
    curriculum_schedule: str = field(
        default="epochs",
        metadata={"help": "'epochs': the paper's schedule (epochs_per_stage of curriculum_epochs) scaled to the run; "
                  "'fraction': stage_fraction of the run per stage"},
    )
    epochs_per_stage: float = field(default=5.0, metadata={"help": "epochs per curriculum stage (schedule 'epochs')"})
    curriculum_epochs: float | None = field(
        default=None,
        metadata={"help": "length of the paper's schedule in epochs (50 logic, 25 GSM8K; default num_train_epochs): "
                  "a run of another length gives each stage the same share of its steps"},
    )
    curriculum_first_stage: int = field(default=0, metadata={"help": "the stage training starts at (GSM8K: 1, no CoT stage)"})
    curriculum_min_steps_per_stage: int = field(
        default=50, metadata={"help": "floor of optimizer steps per stage; a run that cannot give it is refused"}
    )
    effective_batch_size: int | None = field(
        default=None,
        metadata={"help": "examples per optimizer step (Coconut: 128); sets gradient_accumulation_steps = "
                  "effective_batch_size / (per_device_train_batch_size x processes)"},
    )
    stage_fraction: float | None = field(
        default=None,
        metadata={"help": "share of training per non-final stage (schedule 'fraction'); default: half the run for the curriculum"},
    )
    num_stages: int | None = field(default=None, metadata={"help": "stages to use (default: the method's num_stages)"})
    reset_optimizer_on_stage: bool = field(default=True, metadata={"help": "clear optimizer state at each stage switch (Coconut)"})
    max_train_seconds: float | None = field(default=None, metadata={"help": "stop training after this many seconds"})
    extend_max_steps: bool = field(
        default=False, metadata={"help": "let a rerun raise max_steps and go on from the last checkpoint (train/checkpointing.py)"}
    )
    save_every_minutes: float | None = field(
        default=None, metadata={"help": "also save a checkpoint after this much wall time (train/checkpointing.py)"}
    )

    # validation by generation (greedy), best checkpoint
    generation_eval: bool = field(default=False, metadata={"help": "greedy-generate and grade the validation split"})
    generation_eval_every_stage: bool = field(default=True, metadata={"help": "evaluate at the end of every stage"})
    generation_eval_steps: int | None = field(default=None, metadata={"help": "also evaluate every N steps"})
    generation_eval_samples: int = field(default=100, metadata={"help": "validation examples per evaluation"})
    generation_max_new_tokens: int = field(default=128, metadata={"help": "max new tokens when evaluating"})
    generation_batch_size: int = field(default=32, metadata={"help": "batch size of the evaluation generate"})
    keep_best: bool = field(default=True, metadata={"help": "restore the best validated weights at the end"})
    best_from_stage: int | None = field(
        default=None, metadata={"help": "earliest stage whose evaluations may be 'best' (default: the final stage)"}
    )

    # defaults that differ from SFTConfig
    gradient_checkpointing: bool = False
    bf16: bool | None = False
    remove_unused_columns: bool = False
    ddp_find_unused_parameters: bool | None = False
    dataset_kwargs: dict | str | None = field(default_factory=lambda: {"skip_prepare_dataset": True})
    report_to: str | list[str] | None = "none"
    save_strategy: str = "no"  # recipes default to "steps" (checkpointing.SAVE_DEFAULTS); direct users choose
    logging_steps: float = 10
    learning_rate: float = 1e-4

    def __post_init__(self):
        # Without an accelerator, tell TrainingArguments so: only then does a multi-process launch
        # (torchrun, or `accelerate launch --multi_gpu`) on CPU form a real gloo process group;
        # otherwise every process silently trains alone (world size 1).
        if not self.use_cpu and not _accelerator_available():
            self.use_cpu = True
        super().__post_init__()
        from anchored_reasoning.errors import ConfigError

        if self.curriculum_schedule not in ("epochs", "fraction"):
            raise ConfigError(f"curriculum_schedule must be 'epochs' or 'fraction', got {self.curriculum_schedule!r}")
        if self.effective_batch_size is not None:
            per_step = self.per_device_train_batch_size * max(int(self.world_size or 1), 1)
            accum, rest = divmod(int(self.effective_batch_size), per_step)
            if accum < 1 or rest:
                raise ConfigError(
                    f"effective_batch_size={self.effective_batch_size} is not a multiple of per_device_train_batch_size "
                    f"({self.per_device_train_batch_size}) x processes ({self.world_size}) = {per_step}"
                )
            self.gradient_accumulation_steps = accum


class AnchoredSFTTrainer(SFTTrainer):
    """SFTTrainer whose ``compute_loss`` adds gamma x anchor cross-entropy at the [ANT] slots.

    Given a ``method`` (a name -- ``"acot"``, ``"cot"``, ``"anchor_chain"``, ... built in the trained
    style with ``method_options`` -- or a Method object) and a ``task`` (a name or a Task), the trainer
    assembles what the recipe path does (:mod:`anchored_reasoning.train.pipelines.method_setup`): the method's
    special tokens in ``processing_class`` and the model's embeddings resized to match, a pad token, a
    ``train_dataset`` / ``eval_dataset`` given as a list of :class:`~anchored_reasoning.types.Example`
    wrapped for the collator, the :class:`~anchored_reasoning.train.data.collate.AnchoredCollator` when
    ``data_collator`` is None, and the time-budget / curriculum callbacks ``args`` asks for; then
    :meth:`save_model` writes ``anchored_reasoning.json`` beside the weights and tokenizer, so
    ``run_eval`` and ``anchored-reasoning eval`` prompt the checkpoint in its trained format::

        trainer = AnchoredSFTTrainer(model=model, processing_class=tokenizer, method="acot", task="prosqa",
                                     train_dataset=examples, args=AnchoredSFTConfig(output_dir="runs/acot"))
        trainer.train(); trainer.save_model()

    ``model`` may also be a model-zoo alias, a local folder or a Hub id (loaded with its tokenizer).
    Batches come from :class:`~anchored_reasoning.train.data.collate.AnchoredCollator` (``labels`` for the LM
    loss, ``anchor_labels`` for the anchor loss, ``anchor_slots`` / ``anchor_targets`` counts per row).
    Logged separately: ``lm_loss``, ``anchor_loss``, ``anchor_accuracy`` and the running counts
    ``examples_fewer_anchors`` / ``examples_no_anchors`` (examples that trained with fewer / no anchor
    labels than [ANT] slots).
    """

    _name = "AnchoredSFT"
    _tag_names = ["trl", "sft", "anchored-cot"]
    # The loss is a per-batch mean; Trainer divides it by the accumulation steps itself.
    loss_is_scaled_for_ga = False

    def __init__(self, model=None, args=None, data_collator=None, train_dataset=None, eval_dataset=None,
                 processing_class=None, *, method=None, task=None, method_options=None, **kwargs):
        from anchored_reasoning.train.pipelines.method_setup import assemble

        if model is None:
            from anchored_reasoning.errors import ConfigError

            raise ConfigError("AnchoredSFTTrainer needs a model: a causal LM, or its alias, folder or Hub id")
        parts = assemble(model=model, args=args, data_collator=data_collator, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=processing_class, method=method, task=task,
                         method_options=method_options, callbacks=kwargs.pop("callbacks", None),
                         config_cls=AnchoredSFTConfig, peft_config=kwargs.pop("peft_config", None))
        #: the trained-style method this trainer renders (None when the caller brings its own collator only)
        self.method = parts.pop("method")
        self.task_name = parts.pop("task_name")
        self.curriculum_callback = parts.pop("curriculum")
        super().__init__(**parts, **kwargs)
        self.model_accepts_loss_kwargs = False
        self.compute_loss_calls = 0
        self.examples_fewer_anchors = 0
        self.examples_no_anchors = 0
        self.restaged_batches = 0

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the weights and the tokenizer (``Trainer.save_model``) to ``output_dir`` (default
        ``args.output_dir``), and, when the trainer was given a ``method``, ``anchored_reasoning.json``
        (:func:`~anchored_reasoning.train.pipelines.method_setup.checkpoint_meta`) so evaluation prompts the saved
        model in the format of the stage it was trained at."""
        super().save_model(output_dir, _internal_call)
        if self.method is not None and self.args.should_save:
            import json
            from pathlib import Path

            from anchored_reasoning.checkpoints import CHECKPOINT_META
            from anchored_reasoning.train.pipelines.method_setup import checkpoint_meta

            meta = checkpoint_meta(self.method, self.curriculum_callback, self.task_name)
            folder = Path(output_dir if output_dir is not None else self.args.output_dir)
            (folder / CHECKPOINT_META).write_text(json.dumps(meta, indent=2) + "\n")

    def create_accelerator_and_postprocess(self):
        """As the Trainer's, plus FSDP2 on a CPU process group (see :func:`_fsdp_plugin_for_cpu`): the
        state gets what accelerate sets on GPUs, so ``prepare`` shards with torch's ``fully_shard``."""
        super().create_accelerator_and_postprocess()
        plugin = _fsdp_plugin_for_cpu(self)
        if plugin is not None:
            from accelerate.state import PartialState
            from accelerate.utils import DistributedType

            self.accelerator.state.fsdp_plugin = plugin
            self.accelerator.state.distributed_type = DistributedType.FSDP
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # as AcceleratorState does
            self.is_fsdp_enabled = True
        if self.is_fsdp_enabled and "FULL_STATE_DICT" not in str(self.accelerator.state.fsdp_plugin.state_dict_type):
            from anchored_reasoning.errors import ConfigError

            # Trainer.save_model writes no weights for a sharded state dict; the run folder must load.
            raise ConfigError(
                f"FSDP state_dict_type {self.accelerator.state.fsdp_plugin.state_dict_type} saves no "
                "save_pretrained weights at the end; use FULL_STATE_DICT (fsdp_state_dict_type in the accelerate "
                "config, or training.fsdp_config.state_dict_type)"
            )

    def distributed_summary(self) -> dict:
        """How this process trained: accelerate's distributed type, the process count, and for FSDP the
        sharded modules and the share of the parameters this process holds (about 1 / processes)."""
        from torch.distributed.tensor import DTensor

        model = self.model_wrapped if self.model_wrapped is not None else self.model
        out = {"type": str(self.accelerator.distributed_type).split(".")[-1], "processes": self.accelerator.num_processes}
        if self.is_fsdp_enabled:
            from torch.distributed.fsdp import FSDPModule

            params = list(model.parameters())
            local = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params)
            out.update(
                fsdp_version=self.accelerator.state.fsdp_plugin.fsdp_version,
                fsdp_modules=sorted({type(m).__name__ for m in model.modules() if isinstance(m, FSDPModule)}),
                parameter_types=sorted({type(p).__name__ for p in params}),
                local_parameter_share=round(local / max(sum(p.numel() for p in params), 1), 4),
            )
        return out

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """Fetch the next batches; re-render any that the data loader collated before a curriculum
        stage switch (accelerate prefetches one batch), so every step trains on the current stage."""
        from anchored_reasoning.train.data.collate import ROWS_KEY, STAGE_KEY

        batches, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
        collator = self.data_collator
        for i, batch in enumerate(batches):
            if not isinstance(batch, dict) or ROWS_KEY not in batch:
                continue
            rows, stage = batch.pop(ROWS_KEY), batch.pop(STAGE_KEY)
            if stage != getattr(collator, "stage", stage):
                fresh = collator(rows)
                fresh.pop(ROWS_KEY, None)
                fresh.pop(STAGE_KEY, None)
                batches[i] = fresh
                self.restaged_batches += 1
        return batches, num_items

    @property
    def gamma(self) -> float:
        return float(getattr(self.args, "gamma", 1.0))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.compute_loss_calls += 1
        mode = "train" if self.model.training else "eval"
        labels = inputs.pop("labels")
        anchor_labels = inputs.pop("anchor_labels", None)
        slots = inputs.pop("anchor_slots", None)
        targets = inputs.pop("anchor_targets", None)

        # Pre-shifted targets: position p predicts token p+1 (LM) or, at an [ANT] slot, its anchor.
        lm_targets = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=IGNORE)
        lm_mask = lm_targets != IGNORE
        if anchor_labels is None:
            anchor_mask = torch.zeros_like(lm_mask)
            merged = lm_targets
        else:
            anchor_mask = anchor_labels != IGNORE
            if bool((anchor_mask & lm_mask).any()):
                raise ValueError("an [ANT] position also carries an LM target; the collator should have rejected it")
            merged = torch.where(anchor_mask, anchor_labels, lm_targets)

        inputs["use_cache"] = False
        outputs = model(**inputs, shift_labels=merged, fused_lm_head=True)
        log_probs = outputs.log_probs
        lm_sum = -(log_probs * lm_mask).sum()
        anchor_sum = -(log_probs * anchor_mask).sum()
        n_lm = lm_mask.sum()
        n_anchor = anchor_mask.sum()
        world = self.accelerator.num_processes
        if world > 1 and self.args.average_tokens_across_devices:
            # Normalise by the token counts of ALL processes (x world, since DDP averages gradients):
            # a DDP step then follows exactly the gradient of one process on the whole global batch.
            counts = self.accelerator.gather(torch.stack([n_lm, n_anchor]).unsqueeze(0)).sum(0)
            lm_loss = lm_sum * world / counts[0].clamp(min=1)
            anchor_loss = anchor_sum * world / counts[1].clamp(min=1)
        else:
            lm_loss = lm_sum / n_lm.clamp(min=1)
            anchor_loss = anchor_sum / n_anchor.clamp(min=1)
        loss = lm_loss + self.gamma * anchor_loss

        # Metrics, summed over processes so that a DDP run logs the same numbers as one process.
        with torch.no_grad():
            gather = self.accelerator.gather  # not gather_for_metrics: rows are per-process sums
            top1 = outputs.is_top1
            stats = torch.stack(
                [
                    lm_sum.detach(),
                    n_lm.to(lm_sum.dtype),
                    anchor_sum.detach(),
                    n_anchor.to(lm_sum.dtype),
                    (top1 * anchor_mask).sum().to(lm_sum.dtype),
                    (top1 * lm_mask).sum().to(lm_sum.dtype),
                    (outputs.entropy * lm_mask).sum().detach() if outputs.entropy is not None else lm_sum.new_zeros(()),
                    inputs["attention_mask"].sum().to(lm_sum.dtype) if "attention_mask" in inputs else lm_sum.new_zeros(()),
                ]
            )
            stats = gather(stats.unsqueeze(0)).sum(0).tolist()
            g_lm, g_nlm, g_anchor, g_nanchor, g_acorrect, g_lcorrect, g_entropy, g_tokens = stats
            metrics = self._metrics[mode]
            metrics["lm_loss"].append(g_lm / max(g_nlm, 1.0))
            metrics["mean_token_accuracy"].append(g_lcorrect / max(g_nlm, 1.0))
            metrics["entropy"].append(g_entropy / max(g_nlm, 1.0))
            if g_nanchor > 0:
                metrics["anchor_loss"].append(g_anchor / g_nanchor)
                metrics["anchor_accuracy"].append(g_acorrect / g_nanchor)
            if slots is not None and targets is not None:
                counts = torch.stack([((slots > 0) & (targets < slots)).sum(), ((slots > 0) & (targets == 0)).sum()])
                fewer, none = gather(counts.unsqueeze(0)).sum(0).tolist()
                if mode == "train":
                    self.examples_fewer_anchors += int(fewer)
                    self.examples_no_anchors += int(none)
                metrics["examples_fewer_anchors"] = [float(self.examples_fewer_anchors)]
                metrics["examples_no_anchors"] = [float(self.examples_no_anchors)]
            if mode == "train":
                self._total_train_tokens += int(g_tokens)
            metrics["num_tokens"] = [float(self._total_train_tokens)]

        if return_outputs:
            return loss, outputs
        return loss
