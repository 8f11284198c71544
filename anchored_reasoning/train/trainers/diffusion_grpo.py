"""Diffusion GRPO (d1's diffu-GRPO, Zhao et al. 2025) for our MDLM / ADLM / TADM checkpoints.

    anchored-reasoning train grpo_diffusion_prosqa model.name=runs/diffusion_sft_prosqa_small_adlm

A ``grpo`` recipe whose start checkpoint says ``"backend": "diffusion"`` in its ``anchored_reasoning.json``
trains here; everything else (data, rewards, the gold check, checkpoints, resume) is the AR recipe's.

What changes against TRL's GRPO, and nothing more (:class:`DiffusionGRPOTrainer` overrides two methods):

* ``_generate_single_turn``: completions come from our samplers
  (:func:`anchored_reasoning.sampling.samplers.sample`, the recipe's ``sampler`` section; ``gen_length``
  is ``training.max_completion_length``, the temperature ``training.temperature``), cut after the first EOS.
* ``_get_per_token_logps_and_entropies``: a masked LM has no left-to-right factorisation, so, as d1 does,
  the per-token log-probability of a completion is read from ONE forward pass over the prompt with a
  random share ``prompt_mask_ratio`` of its tokens masked and the whole completion masked. The prompt
  mask is drawn from the row's own tokens and the generation round, so the old-policy, reference and
  current log-probabilities of a sample all see the same mask (the importance ratio compares like with
  like), and a new generation round draws a new one.

With ``beta > 0`` the reference model is a frozen copy of the start weights (TRL would try to load a
causal LM from the config). Pinned to trl 1.16: tests/test_diffusion_grpo.py proves TRL's loop calls
both overrides. vLLM does not apply.
"""
from __future__ import annotations

import copy
import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.train.trainers.grpo_trainer import AnchoredGRPOConfig
from trl import GRPOTrainer

logger = logging.getLogger(__name__)


@dataclass
class DiffusionGRPOConfig(AnchoredGRPOConfig):
    """AnchoredGRPOConfig plus d1's prompt masking (the anchor term does not apply to diffusion models)."""

    prompt_mask_ratio: float = field(default=0.15, metadata={"help": "share of prompt tokens masked in the log-prob pass (d1: 0.15)"})
    gamma: float = field(default=0.0, metadata={"help": "the AR anchor term; must stay 0 for diffusion models"})

    def __post_init__(self):
        super().__post_init__()
        if self.gamma:
            raise ConfigError("training.gamma (the [ANT]-slot anchor term) applies to AR models only; "
                              "a diffusion model's anchoring is trained by the diffusion trainer (ANELBO)")
        if not 0.0 <= self.prompt_mask_ratio < 1.0:
            raise ConfigError(f"training.prompt_mask_ratio must be in [0, 1), got {self.prompt_mask_ratio}")


def _row_seed(ids: list[int], salt: int) -> int:
    digest = hashlib.blake2b(repr((salt, ids)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class DiffusionGRPOTrainer(GRPOTrainer):
    """GRPOTrainer for masked diffusion LMs: sampler generation, d1's one-pass masked log-probabilities."""

    _tag_names = ["trl", "grpo", "diffu-grpo"]

    def __init__(self, model, *args, sampler_config=None, **kwargs):
        from anchored_reasoning.sampling.samplers import SamplerConfig, model_info

        if getattr(model, "generation_config", None) is None:  # TRL reads eos / pad ids from it
            from transformers import GenerationConfig

            model.generation_config = GenerationConfig(eos_token_id=model.config.eos_token_id,
                                                       pad_token_id=model.config.pad_token_id)
        cfg = kwargs.get("args")
        beta = float(cfg.beta) if cfg is not None else 0.0
        if cfg is not None:
            cfg.beta = 0.0  # TRL would build the reference from the config as a causal LM; we copy ours below
        try:
            super().__init__(model, *args, **kwargs)
        finally:
            if cfg is not None:
                cfg.beta = beta
        self.mask_token_id, _ = model_info(self.accelerator.unwrap_model(self.model))
        self.sampler_config = sampler_config or SamplerConfig()
        self.beta = beta
        if beta != 0.0:
            self.ref_model = copy.deepcopy(self.accelerator.unwrap_model(self.model)).eval().requires_grad_(False)
        self.generation_rounds = 0  # salts the prompt mask: one mask per sample and generation round

    # -- generation from our samplers --------------------------------------------------------
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        from anchored_reasoning.sampling.samplers import sample
        from trl.trainer.utils import pad

        self.generation_rounds += 1
        device = self.accelerator.device
        tensors = [torch.tensor(ids) for ids in prompt_ids]
        padded = pad(tensors, padding_value=self._tokenizer.pad_token_id, padding_side="left").to(device)
        mask = pad([torch.ones_like(t) for t in tensors], padding_value=0, padding_side="left").to(device)
        eos = self._tokenizer.eos_token_id
        cfg = self.sampler_config.replace(
            gen_length=int(self.args.max_completion_length), temperature=float(self.args.temperature),
            seed=int(self.args.seed) * 1_000_003 + self.generation_rounds + 7919 * self.accelerator.process_index,
            eos_token_id=eos if self.sampler_config.eos_token_id is None else self.sampler_config.eos_token_id)
        model = self.accelerator.unwrap_model(self.model)
        was_training = model.training
        model.eval()
        try:
            ids, _ = sample(model, padded, cfg, attention_mask=mask)
        finally:
            model.train(was_training)
        completions = []
        for row in ids[:, padded.size(1):].tolist():
            if eos is not None and eos in row:
                row = row[: row.index(eos) + 1]
            completions.append(row)
        return completions, None

    # -- d1's one-pass log-probabilities -----------------------------------------------------
    def _prompt_mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, plen: int) -> torch.Tensor:
        ratio = float(getattr(self.args, "prompt_mask_ratio", 0.15))
        out = torch.zeros(input_ids.shape, dtype=torch.bool, device=input_ids.device)
        if ratio <= 0:
            return out
        for row, ids in enumerate(input_ids.tolist()):
            gen = torch.Generator().manual_seed(_row_seed(ids, self.generation_rounds))
            out[row, :plen] = torch.rand(plen, generator=gen).to(input_ids.device) < ratio
        return out & attention_mask.bool()  # never a padding position

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **multimodal):
        if any(v is not None for v in multimodal.values()):
            raise ConfigError("diffusion GRPO takes text prompts only")
        plen = input_ids.size(1) - logits_to_keep
        noisy = input_ids.clone()
        noisy[self._prompt_mask(input_ids, attention_mask, plen)] = self.mask_token_id
        noisy[:, plen:] = self.mask_token_id  # the whole completion is masked
        step = batch_size or input_ids.size(0)
        all_logps, all_entropies = [], []
        for start in range(0, input_ids.size(0), step):
            rows = slice(start, start + step)
            with self.accelerator.autocast():
                out = model(input_ids=noisy[rows], attention_mask=attention_mask[rows])
            log_probs = out.logits[:, plen:].float()
            if self.temperature != 1.0:
                log_probs = torch.log_softmax(log_probs / self.temperature, dim=-1)
            all_logps.append(log_probs.gather(-1, input_ids[rows, plen:, None]).squeeze(-1))
            if compute_entropy:
                all_entropies.append(-(log_probs.exp() * log_probs).nan_to_num(0.0).sum(-1).detach())
        entropies = torch.cat(all_entropies) if compute_entropy else None
        return torch.cat(all_logps), entropies, None


def build_trainer(plan, callbacks=()) -> tuple[DiffusionGRPOTrainer, Any]:
    """Load the diffusion checkpoint of a prepared ``grpo.Plan`` and build the trainer on rows
    rendered as the AR path renders them."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from anchored_reasoning.models.zoo import resolve_model
    from anchored_reasoning.sampling.adapters import MaskedDiffusionAdapter, load_masked_diffusion_model
    from anchored_reasoning.sampling.samplers import SamplerConfig, model_info
    from anchored_reasoning.train.pipelines.grpo_prompts import build_rows

    config, recipe = plan.config, plan.recipe
    path = resolve_model(str(recipe["model"]["name"]))
    model = load_masked_diffusion_model(path)
    if isinstance(model, MaskedDiffusionAdapter):
        raise ConfigError(f"{path}: diffusion GRPO trains our MDLM/ADLM/TADM checkpoints; LLaDA/Dream adapters are not supported yet")
    model.train()
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if "max_completion_length" not in (recipe.get("training") or {}) and plan.meta.get("gen_length"):
        config.max_completion_length = int(plan.meta["gen_length"])  # the window the SFT filled
    _, max_len = model_info(model)
    rows = build_rows(plan.examples, plan.prompting, plan.task, tokenizer)
    for i, row in enumerate(rows):
        n = len(tokenizer(row["prompt"])["input_ids"])
        if max_len is not None and n + config.max_completion_length > max_len:
            raise ConfigError(f"row {i} (id {plan.examples[i].id!r}): prompt of {n} tokens + max_completion_length "
                              f"{config.max_completion_length} exceeds the model's {max_len} positions")
    sampler = SamplerConfig(**dict(recipe.get("sampler") or {}))
    trainer = DiffusionGRPOTrainer(model, reward_funcs=plan.rewards.funcs, args=config, processing_class=tokenizer,
                                   train_dataset=Dataset.from_list(rows), callbacks=list(callbacks),
                                   sampler_config=sampler)
    return trainer, tokenizer
