"""The ``tadm_gemma`` trainer: TADM:Post-train on a frozen DiffusionGemma (arXiv 2609.37924, section 6.1).

    anchored-reasoning train tadm_gemma_tiny                 # CPU, a random small DiffusionGemma, seconds
    anchored-reasoning train tadm_gemma_posttrain            # google/diffusiongemma-26B-A4B-it on a GPU

Only the attention fusion Phi (:class:`~anchored_reasoning.models.tadm_gemma.AnchorFusion`) trains; the
DiffusionGemma stays frozen. One training step, per batch of (context, canvas) rows
(:mod:`anchored_reasoning.train.tadm_gemma_data`):

1. the encoder reads the contexts into a KV cache (as ``generate`` does for a canvas);
2. the clean canvas x is corrupted as DiffusionGemma is trained: each position independently replaced
   by a uniform random token with probability t ~ U(``noise_t_min``, 1); t sets the step
   n = ceil(t T) of a ``denoising_steps``-step (T) schedule and so the temperature of the model's
   linear schedule;
3. with probability ``self_conditioning_prob`` per row, the self-conditioning input is the frozen
   model's processed logits on z_t (as from a previous step), else zero;
4. the anchor h = A(S(z_t)) is computed once and held fixed while the canvas is rolled k reverse steps,
   k in ``rollout_choices`` drawn with ``rollout_probs`` (the paper: {0, 1, 2}, .34/.33/.33): each step
   is the model's own (a sample of D(Phi(c, h)) at the step's temperature, the entropy-bounded
   acceptance and uniform renoising of ``EntropyBoundSampler``, self-conditioning on that step's logits);
5. loss = ``ce_weight`` CE(student, x) + ``kl_weight`` KL(teacher || student) over the canvas, where
   the student is D(Phi(S(z_k), h)) with the stale h and the teacher the frozen model on z_k with a
   fresh anchor; gradients reach Phi only.

Settings from the paper are the defaults: AdamW, lr 1.5e-4, betas (0.95, 0.99), weight decay 1e-4, cosine
schedule with 100 warm-up steps and a floor of 0.1 of the peak. Checkpoints hold Phi alone (a few MB);
resuming by rerunning the command, the progress bar and the log work as in the other trainers
(:mod:`anchored_reasoning.train.checkpointing`). The output folder is the fusion (``config.json`` names
the base model), the tokenizer, ``anchored_reasoning.json`` and ``train_summary.json`` (Phi's parameter
count among them); ``--backend diffusion_gemma --model <folder>`` evaluates it.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.train.tadm_gemma_data import TRAINER, check_recipe

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
        anchor = tadm.anchor(current, st)  # held fixed through the rollout
        for j in range(k):
            logits = _processed(tadm.denoise(current, anchor, st), step - j, cfg, temps)
            proposal = torch.multinomial(torch.softmax(logits, -1, dtype=torch.float32).view(-1, vocab), 1).view(bsz, length)
            z = sampler.renoise_canvas(sampler.accept_canvas(z, proposal, logits, None), None)
            sc, sc_mask = logits.to(embed_dtype), None  # as generate feeds a step's logits to the next
            current, st = tadm.stages(z, cache, self_conditioning_logits=sc, self_conditioning_mask=sc_mask, **kw)
        teacher = tadm.denoise(current, tadm.anchor(current, st), st, fuse=False)
    hidden = decoder_layers(model, fusion(current, anchor), tadm.split.anchor_range[1], num_decoder_layers(model), st)
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


# ---------------------------------------------------------------------------------------------
# recipe

def resolve_recipe(recipe: Mapping[str, Any] | str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Load (name / path / dict), apply dotted overrides, check every key and value (before any model loads)."""
    from anchored_reasoning.train.recipes import apply_overrides, load_recipe

    loaded = load_recipe(recipe) if not isinstance(recipe, Mapping) else dict(recipe)
    resolved = apply_overrides(loaded, list(overrides))
    check_recipe(resolved, TADMGemmaConfig)
    make_config(resolved, Path("/nonexistent/dry-run"))  # the trainer config's own value checks
    return resolved


def make_config(recipe: Mapping[str, Any], output_dir: Path) -> TADMGemmaConfig:
    from anchored_reasoning.train.checkpointing import with_save_defaults

    training = with_save_defaults(recipe.get("training") or {})
    training.setdefault("seed", int(recipe.get("seed", 0)))
    training["output_dir"] = str(output_dir)
    try:
        return TADMGemmaConfig(**training)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"recipe 'training' section: {exc}") from None


def check_model(recipe: Mapping[str, Any]):
    """The base's config (read, not its weights): a checkpoint that is no DiffusionGemma, or a split that does
    not fit it, fails here before any data or weights load. Returns the split."""
    from anchored_reasoning.models.diffusion_gemma import LayerSplit, check_diffusion_gemma, tiny_diffusion_gemma_config
    from anchored_reasoning.models.zoo import resolve_model

    model_cfg = dict(recipe.get("model") or {})
    if model_cfg.get("tiny") is not None:
        tiny = {k: v for k, v in dict(model_cfg["tiny"]).items() if k != "tokenizer_vocab"}
        config = tiny_diffusion_gemma_config(**tiny)
    else:
        from transformers import AutoConfig

        ref = resolve_model(str(model_cfg["name"]))
        check_diffusion_gemma(ref, "model.name")
        config = AutoConfig.from_pretrained(ref)
    return LayerSplit.for_model(config, model_cfg.get("split"))


def build_base(recipe: Mapping[str, Any], output_dir: Path, texts: Sequence[str], device: Any):
    """``(model, tokenizer, base reference)``: the named checkpoint, or a tiny random one saved under
    ``<output_dir>/base`` (reused when a rerun resumes)."""
    from anchored_reasoning.models.diffusion_gemma import load_diffusion_gemma, make_tiny_diffusion_gemma
    from anchored_reasoning.models.zoo import resolve_model

    model_cfg = dict(recipe.get("model") or {})
    if model_cfg.get("tiny") is not None:
        base = output_dir / "base"
        if not (base / "config.json").is_file():
            make_tiny_diffusion_gemma(base, texts=texts, seed=int(recipe.get("seed", 0)), **dict(model_cfg["tiny"]))
        ref = str(base.resolve())
    else:
        ref = resolve_model(str(model_cfg["name"]))
    model, tokenizer = load_diffusion_gemma(ref, dtype=model_cfg.get("dtype"), device=str(device))
    model.requires_grad_(False)
    return model, tokenizer, ref


def _texts_and_examples(recipe: Mapping[str, Any]) -> tuple[list[str], list[Any]]:
    data, seed = dict(recipe.get("data") or {}), int(recipe.get("seed", 0))
    if data.get("text_file"):
        from anchored_reasoning.train.pipelines.diffusion import data_path
        from anchored_reasoning.train.data.diffusion_data import read_text_documents

        return read_text_documents(data_path(data["text_file"]), split_lines=True), []
    from anchored_reasoning.train.data.data_sources import load_split

    examples = load_split(data["train"], recipe.get("task"), seed)
    return [e.question + " " + " ".join(e.steps or []) + " " + str(e.answer) for e in examples], examples


def run(recipe: Mapping[str, Any] | str, overrides: Sequence[str] = ()) -> Path:
    """Post-train a fusion from a recipe (dict, name or path) with dotted overrides. Returns the output folder."""
    from datasets import Dataset

    from anchored_reasoning.models.tadm_gemma import AnchorFusion, TADMDiffusionGemma, fusion_parameters
    from anchored_reasoning.train import checkpointing
    from anchored_reasoning.train.callbacks.curriculum import TimeBudgetCallback
    from anchored_reasoning.train.tadm_gemma_data import ContextCanvasCollator, example_rows, text_rows

    recipe = resolve_recipe(recipe, overrides)  # every key and value checked here, before any work
    seed = int(recipe.get("seed", 0))
    output_dir = Path(recipe.get("output_dir") or f"runs/{Path(str(recipe.get('_source', TRAINER))).stem}")
    config = make_config(recipe, output_dir)
    plan = checkpointing.plan_resume(output_dir, recipe, trainer=TRAINER)  # a changed recipe fails here
    if plan.finished:
        return output_dir
    model_cfg, data = dict(recipe.get("model") or {}), dict(recipe.get("data") or {})
    split = check_model(recipe)
    output_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    texts, examples = _texts_and_examples(recipe)
    base, tokenizer, base_ref = build_base(recipe, output_dir, texts, config.device)
    tadm = TADMDiffusionGemma(base, split=split)
    canvas, max_context = int(base.config.canvas_length), int(data.get("max_context", 1024))
    rows = (example_rows(examples, recipe["task"], data["method"], tokenizer, canvas, max_context, seed) if examples
            else text_rows(texts, tokenizer, canvas, max_context, seed))
    fusion = AnchorFusion.for_model(base, tadm.split, fusion_dim=int(model_cfg.get("fusion_dim") or 192),
                                    num_heads=int(model_cfg.get("fusion_heads") or 3), base_model=base_ref, seed=seed)
    n_fusion = fusion_parameters(fusion)
    logger.info("TADM post-training of %s: split %s, fusion %d parameters (the only ones that train); %d rows, "
                "ready in %.1fs", base_ref, tadm.split, n_fusion, len(rows), time.monotonic() - t0)

    budget = TimeBudgetCallback(config.max_train_seconds)
    trainer = TADMGemmaTrainer(model=fusion, args=config, train_dataset=Dataset.from_list(rows),
                               data_collator=ContextCanvasCollator(tokenizer.pad_token_id), callbacks=[budget], tadm=tadm)
    run_state = checkpointing.attach(trainer, plan, budget=budget)
    t_train = time.monotonic()
    checkpointing.train(trainer, plan)
    train_seconds = time.monotonic() - t_train
    in_optimizer = sum(p.numel() for g in trainer.optimizer.param_groups for p in g["params"]) if trainer.optimizer else 0
    if any(p.requires_grad for p in base.parameters()) or in_optimizer not in (0, n_fusion):
        raise RuntimeError(f"post-training reached beyond the fusion ({in_optimizer} optimised parameters, fusion "
                           f"{n_fusion}); the DiffusionGemma must stay frozen")

    checkpointing.save_model(trainer, output_dir)
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(str(output_dir))
        meta = {"backend": "diffusion_gemma", "arch": "tadm_gemma", "base_model": base_ref, "task": recipe.get("task"),
                "method": str(data.get("method") or "text"), "style": "pretrained"}
        (output_dir / "anchored_reasoning.json").write_text(json.dumps(meta, indent=2) + "\n")
        summary = {
            "recipe": {k: v for k, v in recipe.items() if not str(k).startswith("_")},
            "recipe_source": recipe.get("_source"), "base_model": base_ref,
            "split": dataclasses.asdict(tadm.split), "fusion_parameters": n_fusion,
            "base_parameters": sum(p.numel() for p in base.parameters()),
            "rows": len(rows), "canvas_length": canvas, "global_steps": trainer.state.global_step,
            "train_seconds": round(train_seconds, 2), "train_seconds_all_sessions": round(run_state.seconds_spent(), 2),
            "resumed_from_step": plan.step, "session": plan.session,
            "stopped_by_time_budget": budget.stopped_early or bool(plan.saved.get("stopped")),
            "layer_calls_per_step": {"shared": tadm.split.shared, "anchor": tadm.split.anchor, "denoiser": tadm.split.denoiser},
            "log_history": trainer.state.log_history,
        }
        (output_dir / "train_summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    checkpointing.mark_complete(plan, trainer)
    logger.info("saved %s (%d steps, %.0fs; fusion %d parameters)", output_dir, trainer.state.global_step,
                train_seconds, n_fusion)
    return output_dir


__all__ = ["TADMGemmaConfig", "TADMGemmaTrainer", "posttrain_loss", "resolve_recipe", "run"]
