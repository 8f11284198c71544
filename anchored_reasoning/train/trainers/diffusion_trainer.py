"""Masked-diffusion training through TRL: ``DiffusionSFTTrainer`` overrides ``compute_loss`` only.

>>> config = DiffusionSFTConfig(output_dir="runs/x", diffusion_mode="sft", anchored=True)
>>> trainer = DiffusionSFTTrainer(model=adlm, args=config, train_dataset=rows,
...                               data_collator=DiffusionCollator.for_tokenizer(tok), processing_class=tok)

What the loss is (see :mod:`anchored_reasoning.objectives`):

* **SFT** (``diffusion_mode="sft"``, LLaDA's recipe): the prompt is never masked and never scored;
  each response token (its EOS included) is masked with probability ``p_mask = 1 - alpha_t`` for a
  time ``t`` per row (antithetic over the batch); the loss is ``sum(CE / p_mask)`` over the masked
  response tokens, divided by that row's response length, averaged over rows
  (``normalization="sequence"``).
* **Pretraining** (``diffusion_mode="pretrain"``): packed raw-text blocks, every token eligible,
  MDLM's NELBO in nats per token (``normalization="token"``); ``exp`` of it bounds the perplexity.
* **Anchored** (``anchored=True``, needs an ADLM): ANELBO = denoiser NELBO + gamma x anchor CE at
  anchor positions, gamma ramped linearly from 0 over ``gamma_warmup_ratio`` of the steps. Anchors
  come from the row's ``anchor_mask`` column (a task's anchor extractor, or the tau rule applied at
  encoding time) or, when the column is absent, from the tau frequency rule over eligible tokens.

**EOS and padding (a documented choice).** With ``eos_padding=True`` (default, LLaDA's choice) the
collator pads each row on the right with EOS tokens that are *supervised*: they belong to the
response, may be masked, and count in its length. The model thus learns to fill the tail of a
fixed-length generation window with EOS, which is what lets the samplers produce answers shorter
than ``gen_length``. ``response_length`` pads every response to a fixed window (LLaDA pads to a fixed
length), so training sees windows of the size the sampler fills; the checkpoint records it and the
diffusion backend uses it as its default ``gen_length``. With ``eos_padding=False`` rows are padded with the pad token, padding is
masked out of attention and of the loss, and only the single EOS after each response is learned.

Logged separately: ``nelbo`` (the denoiser's NELBO / LLaDA loss), ``anchor_loss`` (ADLM anchor CE,
also when gamma = 0), ``gamma`` (the ramped weight in use), ``masked_fraction``.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from trl import SFTConfig, SFTTrainer

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.objectives import LogLinearSchedule, diffusion_loss, gamma_schedule

log = logging.getLogger(__name__)

IGNORE_INDEX = -100
DIFFUSION_MODES = ("sft", "pretrain")


@dataclass
class DiffusionSFTConfig(SFTConfig):
    """``SFTConfig`` plus the masked-diffusion settings. Datasets are tokenized by
    :mod:`anchored_reasoning.train.data.diffusion_data` (so ``skip_prepare_dataset`` is on and TRL's own
    truncation never silently cuts a response); extra columns such as ``anchor_mask`` are kept."""

    diffusion_mode: str = field(default="sft", metadata={"help": "sft (prompt/response rows) or pretrain (packed text)"})
    anchored: bool = field(default=False, metadata={"help": "ANELBO: add gamma x anchor CE (needs an ADLM)"})
    anchor_gamma: float = field(default=3e-3, metadata={"help": "ANELBO anchor weight gamma (ADLM paper: 3e-3)"})
    anchor_tau: int = field(default=5, metadata={"help": "frequency rule: a token is an anchor if it occurs <= tau times"})
    gamma_warmup_ratio: float = field(default=0.003, metadata={"help": "gamma ramps 0 -> anchor_gamma over this share of steps"})
    eos_padding: bool = field(default=True, metadata={"help": "pad rows with supervised EOS (LLaDA) instead of ignored pad"})
    response_length: int | None = field(
        default=None, metadata={"help": "SFT: EOS-pad every response to this many tokens (LLaDA's fixed window; "
                                        "use the gen_length you will sample with). None: pad to the batch's longest row"})
    antithetic_time: bool = field(default=True, metadata={"help": "low-discrepancy diffusion times over the batch"})
    time_eps: float = field(default=1e-3, metadata={"help": "smallest diffusion time / schedule epsilon"})
    loss_normalization: str | None = field(
        default=None, metadata={"help": "sequence (LLaDA, per-row response length) or token (MDLM); default by mode"})
    max_train_seconds: float | None = field(default=None, metadata={"help": "stop training after this wall time"})
    extend_max_steps: bool = field(
        default=False, metadata={"help": "let a rerun raise max_steps and go on from the last checkpoint (train/checkpointing.py)"}
    )
    save_every_minutes: float | None = field(
        default=None, metadata={"help": "also save a checkpoint after this much wall time (train/checkpointing.py)"})
    # TRL defaults that do not fit pre-tokenized diffusion rows:
    remove_unused_columns: bool = False
    dataset_kwargs: dict[str, Any] | str | None = field(default_factory=lambda: {"skip_prepare_dataset": True})
    report_to: Any = "none"
    gradient_checkpointing: bool = False  # MDLM/ADLM do not implement it (TRL turns it on by default)
    ddp_find_unused_parameters: bool | None = False  # every MDLM/ADLM parameter takes part in the loss
    dataloader_pin_memory: bool = field(default_factory=lambda: torch.cuda.is_available())

    def __post_init__(self) -> None:
        if self.bf16 is None:  # TRL's default is bf16=True, which fails on CPU-only machines: use it where it works
            self.bf16 = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        accel = getattr(torch, "accelerator", None)
        has_accel = bool(accel.is_available()) if accel is not None and hasattr(accel, "is_available") else torch.cuda.is_available()
        if not self.use_cpu and not has_accel:
            # Only with use_cpu does a multi-process CPU launch (torchrun / accelerate --multi_gpu) form a
            # gloo group; otherwise each process would silently train alone.
            self.use_cpu = True
        super().__post_init__()
        if self.diffusion_mode not in DIFFUSION_MODES:
            raise ConfigError(f"diffusion_mode={self.diffusion_mode!r}; choose one of {DIFFUSION_MODES}")
        if self.loss_normalization is None:
            self.loss_normalization = "sequence" if self.diffusion_mode == "sft" else "token"
        if self.loss_normalization not in ("sequence", "token"):
            raise ConfigError(f"loss_normalization={self.loss_normalization!r}; choose sequence or token")
        if self.anchor_tau < 1:
            raise ConfigError(f"anchor_tau={self.anchor_tau} must be >= 1")
        if self.anchor_gamma < 0:
            raise ConfigError(f"anchor_gamma={self.anchor_gamma} must be >= 0")
        if not 0 < self.time_eps < 1:
            raise ConfigError(f"time_eps={self.time_eps} must be in (0, 1)")


@dataclass
class DiffusionCollator:
    """Right-pads pre-tokenized rows (``input_ids``, ``labels``, optional ``anchor_mask``).

    ``eos_padding=True``: each row that has loss tokens is extended with EOS tokens whose labels are
    set (supervised, attended, maskable) -- up to the longest row of the batch, or, with
    ``response_length``, until its response (the labelled part) is ``response_length`` tokens long
    (LLaDA's fixed window; a longer response is left as is). Whatever width remains is padded with
    the pad token: label -100, attention 0. ``eos_padding=False``: pad tokens only.
    """

    pad_token_id: int
    eos_token_id: int | None = None
    eos_padding: bool = True
    response_length: int | None = None
    pad_to_multiple_of: int | None = None
    max_length: int | None = None

    @classmethod
    def for_tokenizer(cls, tokenizer, **kwargs: Any) -> "DiffusionCollator":
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise ConfigError("the tokenizer has neither a pad nor an EOS token")
        return cls(pad_token_id=pad, eos_token_id=tokenizer.eos_token_id, **kwargs)

    def __post_init__(self) -> None:
        if self.eos_padding and self.eos_token_id is None:
            raise ConfigError("eos_padding=True needs an eos_token_id")
        if self.response_length is not None and (self.response_length < 1 or not self.eos_padding):
            raise ConfigError(f"response_length={self.response_length} needs eos_padding=True and a value >= 1")

    def _eos_target(self, ids: list[int], labels: list[int], width: int) -> int:
        """The length row ``ids`` is extended to with supervised EOS."""
        if not self.eos_padding or not any(x != IGNORE_INDEX for x in labels):
            return len(ids)
        if self.response_length is None:
            return width
        n_prompt = next(i for i, x in enumerate(labels) if x != IGNORE_INDEX)
        return max(len(ids), n_prompt + self.response_length)

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        longest = max(len(r["input_ids"]) for r in rows)
        if self.max_length is not None and longest > self.max_length:
            raise ConfigError(f"a row of {longest} tokens exceeds max_length={self.max_length}")
        width = longest
        if self.response_length is not None:
            width = max(self._eos_target(list(r["input_ids"]), list(r["labels"]), 0) for r in rows)
            if self.max_length is not None and width > self.max_length:
                raise ConfigError(
                    f"prompt + response_length={self.response_length} needs {width} positions > max_length="
                    f"{self.max_length}; lower response_length or raise the model's context")
        if self.pad_to_multiple_of:
            width = int(math.ceil(width / self.pad_to_multiple_of) * self.pad_to_multiple_of)
            if self.max_length is not None:
                width = min(width, max(self.max_length, longest))
        n = len(rows)
        input_ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((n, width), IGNORE_INDEX, dtype=torch.long)
        attention = torch.zeros((n, width), dtype=torch.long)
        has_anchor = "anchor_mask" in rows[0]
        anchor = torch.zeros((n, width), dtype=torch.bool) if has_anchor else None
        for i, r in enumerate(rows):
            ids, lab = list(r["input_ids"]), list(r["labels"])
            if len(ids) != len(lab):
                raise ConfigError(f"row {i}: input_ids ({len(ids)}) and labels ({len(lab)}) differ in length")
            k = len(ids)
            input_ids[i, :k] = torch.tensor(ids, dtype=torch.long)
            labels[i, :k] = torch.tensor(lab, dtype=torch.long)
            attention[i, :k] = 1
            end = min(self._eos_target(ids, lab, width), width)
            if end > k:
                input_ids[i, k:end] = self.eos_token_id
                labels[i, k:end] = self.eos_token_id
                attention[i, k:end] = 1
            if anchor is not None:
                am = list(r.get("anchor_mask") or [])
                if am:
                    anchor[i, : len(am)] = torch.tensor(am, dtype=torch.bool)
        batch = {"input_ids": input_ids, "labels": labels, "attention_mask": attention}
        if anchor is not None:
            batch["anchor_mask"] = anchor
        return batch


class DiffusionSFTTrainer(SFTTrainer):
    """TRL ``SFTTrainer`` with the masked-diffusion loss. Only ``compute_loss`` is overridden.

    Pass ``data_collator`` (a :class:`DiffusionCollator`) and a dataset of pre-tokenized rows
    from :mod:`anchored_reasoning.train.data.diffusion_data`. The model must follow the MDLM/ADLM
    interface: ``model(input_ids, attention_mask)`` returns ``.logits`` and (ADLM) ``.anchor_logits``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # We compute and normalise the loss ourselves; Trainer must divide by gradient accumulation.
        self.model_accepts_loss_kwargs = False
        cfg: DiffusionSFTConfig = self.args  # type: ignore[assignment]
        if not isinstance(cfg, DiffusionSFTConfig):
            raise ConfigError("DiffusionSFTTrainer needs a DiffusionSFTConfig as args")
        self.schedule = LogLinearSchedule(eps=cfg.time_eps)
        model = self.accelerator.unwrap_model(self.model)
        self._mask_id = getattr(model.config, "mask_token_id", None)
        if self._mask_id is None:
            raise ConfigError(f"{type(model).__name__}.config has no mask_token_id; diffusion training needs one")
        self.loss_calls = 0  # proves (in tests) that this override is what TRL runs
        if cfg.anchored and not hasattr(model, "anchor_forward"):
            raise ConfigError(
                f"anchored=True (ANELBO) needs an ADLM (a model with an anchor network); got {type(model).__name__}. "
                "Use model.arch: adlm, or set anchored: false for plain NELBO training")

    def current_gamma(self) -> float:
        """The anchor loss weight at this step: ``anchor_gamma`` after the warm-up (``gamma_warmup_ratio``), 0 unless ``anchored``."""
        cfg: DiffusionSFTConfig = self.args  # type: ignore[assignment]
        if not cfg.anchored:
            return 0.0
        total = self.state.max_steps or 1
        return gamma_schedule(self.state.global_step, total, cfg.anchor_gamma, cfg.gamma_warmup_ratio)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        cfg: DiffusionSFTConfig = self.args  # type: ignore[assignment]
        mode = "train" if self.model.training else "eval"
        self.loss_calls += 1
        input_ids = inputs["input_ids"]
        labels = inputs["labels"]
        attention_mask = inputs.get("attention_mask")
        loss_mask = labels != IGNORE_INDEX  # response (SFT) or every real token (pretraining)
        if cfg.diffusion_mode == "sft":
            # Prompt = real tokens before the first label; never masked, never scored.
            prompt_mask = ~loss_mask & (attention_mask.bool() if attention_mask is not None else True)
        else:
            prompt_mask = None
        anchor_mask = inputs.get("anchor_mask")
        gamma = self.current_gamma()
        ignore = [i for i in (self.processing_class.pad_token_id, getattr(self.processing_class, "bos_token_id", None))
                  if i is not None] if self.processing_class is not None else []
        result = diffusion_loss(
            model,
            input_ids,
            attention_mask=attention_mask,
            prompt_mask=prompt_mask,
            loss_mask=loss_mask,
            schedule=self.schedule,
            gamma=gamma,
            anchor_mask=anchor_mask,
            anchor_tau=cfg.anchor_tau,
            anchor_ignore_ids=ignore,
            normalization=cfg.loss_normalization,
            antithetic=cfg.antithetic_time,
            t_min=cfg.time_eps,
            mask_token_id=self._mask_id,
        )
        gather = self.accelerator.gather_for_metrics
        self._metrics[mode]["nelbo"].append(gather(result.nelbo.detach().reshape(1)).mean().item())
        if result.anchor_loss is not None:
            self._metrics[mode]["anchor_loss"].append(gather(result.anchor_loss.detach().reshape(1)).mean().item())
        self._metrics[mode]["gamma"].append(gamma)
        self._metrics[mode]["masked_fraction"].append(result.num_masked / max(result.num_tokens, 1))
        if mode == "train":
            self._total_train_tokens += int(gather(torch.tensor(result.num_tokens, device=input_ids.device)).sum().item())
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
        if return_outputs:  # no logits: the loss is all an evaluation of a diffusion objective needs
            from anchored_reasoning.models import DiffusionLMOutput

            return result.loss, DiffusionLMOutput(loss=result.loss.detach(), logits=None)
        return result.loss
