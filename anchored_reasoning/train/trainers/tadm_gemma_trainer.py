"""The ``tadm_gemma`` trainer's config and ``Trainer``: TADM:Post-train on a frozen DiffusionGemma (arXiv 2609.37924, section 6.1).

    anchored-reasoning train tadm_gemma_tiny                 # CPU, a random small DiffusionGemma, seconds
    anchored-reasoning train tadm_gemma_posttrain            # google/diffusiongemma-26B-A4B-it on a GPU

Only the fusion Phi (:mod:`~anchored_reasoning.models.tadm_fusion`, either kind) trains; the
DiffusionGemma stays frozen. One training step, per batch of (context, canvas) rows
(:mod:`anchored_reasoning.train.data.tadm_gemma_data`):

1. the encoder reads the contexts into a KV cache (as ``generate`` does for a canvas);
2. the clean canvas x is corrupted as DiffusionGemma is trained: each position independently replaced
   by a uniform random token with probability t ~ U(``noise_t_min``, 1); t sets the step
   n = ceil(t T) of a ``denoising_steps``-step (T) schedule and so the temperature of the model's
   linear schedule;
3. with probability ``self_conditioning_prob`` per row, the self-conditioning input is the frozen
   model's processed logits on z_t (as from a previous step), else zero;
4. the anchor h = A(S(z_t)) (and c0 = S(z_t), which the paired fusion reads) is computed once and held fixed while the canvas is rolled k reverse steps,
   k in ``rollout_choices`` drawn with ``rollout_probs`` (the paper: {0, 1, 2}, .34/.33/.33): each step
   is the model's own (a sample of D(Phi(c, h)) at the step's temperature, the entropy-bounded
   acceptance and uniform renoising of ``EntropyBoundSampler``, self-conditioning on that step's logits);
5. loss = ``ce_weight`` CE(student, x) + ``kl_weight`` KL(teacher || student) over the canvas, where
   the student is D(Phi(S(z_k), h, c0)) with the stale h and the teacher the frozen model on z_k with a
   fresh anchor; gradients reach Phi only.

Settings from the paper are the defaults: AdamW, lr 1.5e-4, betas (0.95, 0.99), weight decay 1e-4, cosine
schedule with 100 warm-up steps and a floor of 0.1 of the peak. Checkpoints hold Phi alone (a few MB);
resuming by rerunning the command, the progress bar and the log work as in the other trainers
(:mod:`anchored_reasoning.train.checkpointing`); the run itself is
:mod:`anchored_reasoning.train.pipelines.tadm_gemma`. The output folder is the fusion (``config.json`` names
the base model), the tokenizer, ``anchored_reasoning.json`` and ``train_summary.json`` (Phi's parameter
count among them); ``--backend diffusion_gemma --model <folder>`` evaluates it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments

from anchored_reasoning.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass
class TADMGemmaConfig(TrainingArguments):
    """``TrainingArguments`` with the paper's optimiser settings as defaults, plus the post-training loss's."""

    learning_rate: float = 1.5e-4
    adam_beta1: float = 0.95
    adam_beta2: float = 0.99
    weight_decay: float = 1e-4
    lr_scheduler_type: str = "cosine_with_min_lr"
    lr_scheduler_kwargs: dict | str | None = field(default_factory=lambda: {"min_lr_rate": 0.1})
    warmup_steps: float = 100
    remove_unused_columns: bool = False
    dataloader_pin_memory: bool = False
    report_to: str | list[str] | None = "none"
    rollout_choices: list[int] = field(default_factory=lambda: [0, 1, 2], metadata={"help": "reverse steps k with the anchor held"})
    rollout_probs: list[float] = field(default_factory=lambda: [0.34, 0.33, 0.33], metadata={"help": "P(k)"})
    self_conditioning_prob: float = field(default=0.5, metadata={"help": "P(a row gets self-conditioning logits)"})
    denoising_steps: int = field(default=48, metadata={"help": "T: steps per canvas of the schedule trained for"})
    noise_t_min: float = field(default=1e-3, metadata={"help": "corruption level t ~ U(noise_t_min, 1)"})
    ce_weight: float = field(default=1.0, metadata={"help": "weight of CE(student, clean canvas)"})
    kl_weight: float = field(default=1.0, metadata={"help": "weight of KL(frozen model || student)"})
    max_train_seconds: float | None = field(default=None, metadata={"help": "stop training after this wall time"})
    save_every_minutes: float | None = field(default=None, metadata={"help": "also save a checkpoint this often"})

    def __post_init__(self) -> None:
        checks = [
            (self.rollout_choices and all(isinstance(k, int) and k >= 0 for k in self.rollout_choices), "rollout_choices",
             self.rollout_choices, "a non-empty list of integers >= 0"),
            (len(self.rollout_probs) == len(self.rollout_choices) and all(p >= 0 for p in self.rollout_probs)
             and sum(self.rollout_probs) > 0, "rollout_probs", self.rollout_probs,
             "one weight >= 0 per rollout_choices entry, not all 0"),
            (0.0 <= self.self_conditioning_prob <= 1.0, "self_conditioning_prob", self.self_conditioning_prob, "in [0, 1]"),
            (self.denoising_steps > max(self.rollout_choices or [0]), "denoising_steps", self.denoising_steps,
             "an integer larger than the largest rollout"),
            (0.0 < self.noise_t_min < 1.0, "noise_t_min", self.noise_t_min, "in (0, 1)"),
            (self.ce_weight >= 0 and self.kl_weight >= 0 and self.ce_weight + self.kl_weight > 0, "ce_weight/kl_weight",
             (self.ce_weight, self.kl_weight), ">= 0 and not both 0"),
        ]
        for ok, key, value, want in checks:
            if not ok:
                raise ConfigError(f"recipe key training.{key}={value!r} must be {want}")
        super().__post_init__()


class TADMGemmaTrainer(Trainer):
    """``Trainer`` whose model is the fusion; ``compute_loss`` is the post-training loss above. ``tadm``
    holds the frozen DiffusionGemma split into S / A / D."""

    model_accepts_loss_kwargs = False

    def __init__(self, *args: Any, tadm: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.tadm = tadm
        self._sums: dict[str, float] = {}
        self._count = 0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        parts = posttrain_loss(self.tadm, model, inputs, self.args)
        for key in ("ce", "kl", "rollout"):
            self._sums[key] = self._sums.get(key, 0.0) + float(parts[key])
        self._count += 1
        return (parts["loss"], parts) if return_outputs else parts["loss"]

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if self._count and "loss" in logs:
            logs.update({k: round(v / self._count, 5) for k, v in self._sums.items()})
            self._sums, self._count = {}, 0
        super().log(logs, *args, **kwargs)


def _processed(logits: torch.Tensor, step: torch.Tensor, cfg: TADMGemmaConfig, temps: tuple[float, float]) -> torch.Tensor:
    """The model's linear temperature schedule at per-row step ``step`` (remaining steps, as generate counts)."""
    t_min, t_max = temps
    temperature = t_min + (t_max - t_min) * step.to(logits.dtype) / cfg.denoising_steps
    return logits / temperature[:, None, None]


def posttrain_loss(tadm: Any, fusion: Any, inputs: Mapping[str, torch.Tensor], cfg: TADMGemmaConfig) -> dict[str, Any]:
    """One batch's loss (see the module doc): ``{"loss", "ce", "kl", "rollout"}``."""
    from transformers import DynamicCache

    from anchored_reasoning.models.diffusion_gemma import decoder_head, decoder_layers, num_decoder_layers

    model = tadm.model
    device = next(model.parameters()).device
    context, mask, x = (inputs[k].to(device) for k in ("input_ids", "attention_mask", "canvas"))
    bsz, width = context.shape
    length = x.shape[1]
    vocab = model.config.get_text_config().vocab_size
    sampler, temps = tadm_sampler(model, cfg)
    embed_dtype = model.model.decoder.embed_tokens.weight.dtype
    choice = torch.multinomial(torch.tensor(cfg.rollout_probs, dtype=torch.float), 1).item()
    k = int(cfg.rollout_choices[choice])
    with torch.no_grad():
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
        model.model.encoder(input_ids=context, attention_mask=mask, past_key_values=cache,
                            position_ids=torch.arange(width, device=device).unsqueeze(0))
        kw = {"decoder_attention_mask": F.pad(mask.bool(), (0, length), value=True),
              "decoder_position_ids": torch.arange(width, width + length, device=device).unsqueeze(0)}
        t = cfg.noise_t_min + (1 - cfg.noise_t_min) * torch.rand(bsz, device=device)
        z = torch.where(torch.rand(bsz, length, device=device) < t[:, None], torch.randint(0, vocab, x.shape, device=device), x)
        step = torch.clamp(torch.ceil(t * cfg.denoising_steps), k + 1, cfg.denoising_steps).long()
        sc, sc_mask = None, None
        on = torch.rand(bsz, device=device) < cfg.self_conditioning_prob
        if bool(on.any()):  # the frozen model's previous-step estimate on z_t
            c0, st0 = tadm.stages(z, cache, **kw)
            sc = _processed(tadm.denoise(c0, tadm.anchor(c0, st0), st0, fuse=False),
                            torch.clamp(step + 1, max=cfg.denoising_steps), cfg, temps).to(embed_dtype)
            sc_mask = on
        current, st = tadm.stages(z, cache, self_conditioning_logits=sc, self_conditioning_mask=sc_mask, **kw)
        anchor, anchor_current = tadm.anchor(current, st), current  # held fixed through the rollout (H0, C0)
        for j in range(k):
            logits = _processed(tadm.denoise(current, anchor, st, anchor_current=anchor_current), step - j, cfg, temps)
            proposal = torch.multinomial(torch.softmax(logits, -1, dtype=torch.float32).view(-1, vocab), 1).view(bsz, length)
            z = sampler.renoise_canvas(sampler.accept_canvas(z, proposal, logits, None), None)
            sc, sc_mask = logits.to(embed_dtype), None  # as generate feeds a step's logits to the next
            current, st = tadm.stages(z, cache, self_conditioning_logits=sc, self_conditioning_mask=sc_mask, **kw)
        teacher = tadm.denoise(current, tadm.anchor(current, st), st, fuse=False)
    hidden = decoder_layers(model, fusion(current, anchor, anchor_current), tadm.split.anchor_range[1], num_decoder_layers(model), st)
    student = decoder_head(model, hidden)
    log_s = F.log_softmax(student, -1)
    ce = F.nll_loss(log_s.reshape(-1, vocab), x.reshape(-1))
    log_t = F.log_softmax(teacher, -1)
    kl = (log_t.exp() * (log_t - log_s)).sum(-1).mean()
    loss = cfg.ce_weight * ce + cfg.kl_weight * kl
    return {"loss": loss, "ce": ce.detach(), "kl": kl.detach(), "rollout": k}


def tadm_sampler(model: Any, cfg: TADMGemmaConfig):
    """The model's ``EntropyBoundSampler`` and (t_min, t_max), from its generation config (or the library defaults)."""
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
        DiffusionGemmaGenerationConfig,
        EntropyBoundSampler,
    )

    defaults = DiffusionGemmaGenerationConfig._get_default_generation_params()
    gen = model.generation_config
    value = lambda key: getattr(gen, key, None) if getattr(gen, key, None) is not None else defaults[key]
    sampler = EntropyBoundSampler(value("sampler_config"), model.config.canvas_length,
                                  model.config.get_text_config().vocab_size, cfg.denoising_steps)
    return sampler, (float(value("t_min")), float(value("t_max")))


__all__ = ["TADMGemmaConfig", "TADMGemmaTrainer", "posttrain_loss", "tadm_sampler"]
