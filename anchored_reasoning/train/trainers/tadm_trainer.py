"""TADM's trainer config and trainer: :class:`TADMTrainingConfig` (DiffusionSFTConfig plus the T-ANELBO and
post-training settings) and :class:`TADMTrainer` (``compute_loss`` through ``anchored_reasoning.objectives_tadm``).
The ``tadm`` run (recipe, model building, stale perplexity) is :mod:`anchored_reasoning.train.pipelines.tadm`."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch  # noqa: F401 - the trainer's tensors

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.train.trainers.diffusion_trainer import IGNORE_INDEX, DiffusionSFTConfig, DiffusionSFTTrainer

OBJECTIVES = ("t_anelbo", "posttrain")


@dataclass
class TADMTrainingConfig(DiffusionSFTConfig):
    """:class:`DiffusionSFTConfig` plus the TADM objectives' settings (see the module doc)."""

    tadm_objective: str = field(default="t_anelbo", metadata={"help": "t_anelbo (pretraining) or posttrain"})
    stale_k_choices: list[int] = field(default_factory=lambda: [1, 2, 4, 8], metadata={"help": "T-ANELBO refresh periods"})
    stale_sampling_steps: int = field(default=64, metadata={"help": "sampler steps T; one step moves time by 1/T"})
    stale_budget_choices: list[int] | None = field(default=None, metadata={
        "help": "T-ANELBO: draw T per row from these budgets (the paper: 128..4096 for 1,024 tokens); None: stale_sampling_steps"})
    rollout_choices: list[int] = field(default_factory=lambda: [0, 1, 2], metadata={"help": "post-training rollouts"})
    kl_weight: float = field(default=1.0, metadata={"help": "post-training: weight of KL(frozen model || TADM)"})
    ce_weight: float = field(default=1.0, metadata={"help": "post-training: weight of the NELBO cross-entropy"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tadm_objective not in OBJECTIVES:
            raise ConfigError(f"tadm_objective={self.tadm_objective!r}; choose one of {OBJECTIVES}")
        if self.stale_sampling_steps < 1:
            raise ConfigError(f"stale_sampling_steps={self.stale_sampling_steps} must be >= 1")
        if not self.stale_k_choices or min(self.stale_k_choices) < 1:
            raise ConfigError(f"stale_k_choices={self.stale_k_choices} must be a non-empty list of integers >= 1")
        if self.stale_budget_choices is not None and (not self.stale_budget_choices or min(self.stale_budget_choices) < 1):
            raise ConfigError(f"stale_budget_choices={self.stale_budget_choices} must be a non-empty list of integers >= 1 "
                              "(or null for a fixed stale_sampling_steps)")
        if not self.rollout_choices or min(self.rollout_choices) < 0:
            raise ConfigError(f"rollout_choices={self.rollout_choices} must be a non-empty list of integers >= 0")
        if self.kl_weight < 0 or self.ce_weight < 0 or self.kl_weight + self.ce_weight == 0:
            raise ConfigError(f"kl_weight={self.kl_weight} and ce_weight={self.ce_weight} must be >= 0, not both 0")


class TADMTrainer(DiffusionSFTTrainer):
    """The diffusion trainer with T-ANELBO or the post-training loss in ``compute_loss``. In
    post-training only parameters with ``requires_grad`` (Phi) reach the optimizer."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        from anchored_reasoning.objectives_tadm import posttrain_loss, t_anelbo

        cfg: TADMTrainingConfig = self.args  # type: ignore[assignment]
        mode = "train" if self.model.training else "eval"
        self.loss_calls += 1
        input_ids, labels = inputs["input_ids"], inputs["labels"]
        attention_mask = inputs.get("attention_mask")
        loss_mask = labels != IGNORE_INDEX
        prompt_mask = None
        if cfg.diffusion_mode == "sft":
            prompt_mask = ~loss_mask & (attention_mask.bool() if attention_mask is not None else True)
        common = dict(attention_mask=attention_mask, prompt_mask=prompt_mask, loss_mask=loss_mask, schedule=self.schedule,
                      normalization=cfg.loss_normalization, antithetic=cfg.antithetic_time, t_min=cfg.time_eps)
        if cfg.tadm_objective == "posttrain":
            result = posttrain_loss(model, input_ids, rollout_choices=cfg.rollout_choices,
                                    sampling_steps=cfg.stale_sampling_steps, ce_weight=cfg.ce_weight,
                                    kl_weight=cfg.kl_weight, **common)
            self._metrics[mode]["kl"].append(float(result.kl.detach()))
            self._metrics[mode]["rollout"].append(result.rollout)
        else:
            gamma = self.current_gamma()
            ignore = [i for i in (self.processing_class.pad_token_id, getattr(self.processing_class, "bos_token_id", None))
                      if i is not None] if self.processing_class is not None else []
            result = t_anelbo(model, input_ids, gamma=gamma, anchor_mask=inputs.get("anchor_mask"), anchor_tau=cfg.anchor_tau,
                              anchor_ignore_ids=ignore, mask_token_id=self._mask_id, k_choices=cfg.stale_k_choices,
                              sampling_steps=cfg.stale_sampling_steps, budget_choices=cfg.stale_budget_choices, **common)
            if result.anchor_loss is not None:
                self._metrics[mode]["anchor_loss"].append(float(result.anchor_loss.detach()))
            self._metrics[mode]["gamma"].append(gamma)
            self._metrics[mode]["mean_cache_age"].append(float(result.age.float().mean()))
        self._metrics[mode]["nelbo"].append(float(result.nelbo.detach()))
        self._metrics[mode]["masked_fraction"].append(result.num_masked / max(result.num_tokens, 1))
        if mode == "train":
            self._total_train_tokens += result.num_tokens
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
        if return_outputs:
            return result.loss, {"nelbo": result.nelbo.detach()}
        return result.loss
