"""The ``tadm`` trainer: TADM pretraining with T-ANELBO, and post-training of a trained MDLM/ADLM.

    anchored-reasoning train tadm_pretrain_tiny                       # T-ANELBO from scratch
    anchored-reasoning train diffusion_pretrain_tiny_adlm             # then, post-training:
    anchored-reasoning train tadm_posttrain_tiny model.base=runs/diffusion_pretrain_tiny_adlm

The recipe is the ``diffusion`` trainer's (same ``data`` section, same ``training`` fields, see
:mod:`anchored_reasoning.train.pipelines.diffusion`) with these differences::

    trainer: tadm
    model:
      preset: tiny                      # from scratch: a TADMConfig preset + config overrides
      config: {shared_layers: 1, num_hidden_layers: 4, denoiser_layers: 1}   # fusion_variant: published (default)
      name: null                        # ... or a TADM checkpoint to continue
      base: null                        # ... or an MDLM/ADLM checkpoint to post-train (backbone frozen)
      shared_layers: 0                  # post-training: blocks of the source model that run every step
      anchor_layers: null               # post-training from an MDLM: blocks of A (default half the rest)
      fusion_size: null                 # Phi's MLP width (default 4 x hidden_size; post-training: hidden_size)
    data:
      ppl_refresh_every: [1, 3]         # K values for the stale perplexity bound after training
      ppl_max_blocks: 200               # score the first N seq_len blocks of valid_text_file (null: all)
    training:
      tadm_objective: t_anelbo          # or posttrain (needs model.base, or a TADM with frozen backbone)
      stale_k_choices: [1, 2, 4, 8]     # T-ANELBO: refresh periods K; the cache age is uniform in 0..K-1
      stale_sampling_steps: 64          # T: one sampler step moves time by 1/T (stale anchors, rollouts)
      stale_budget_choices: null        # T-ANELBO: draw T per row from these (the paper: 128..4096 at 1,024 tokens)
      rollout_choices: [0, 1, 2]        # post-training: reverse steps taken with the anchor held fixed
      kl_weight: 1.0                    # post-training: weight of KL(frozen model || TADM)
      ce_weight: 1.0                    # post-training: weight of the NELBO cross-entropy
      anchored: true                    # T-ANELBO: gamma > 0 (ADLM anchor supervision); false: gamma = 0

The objectives are in :mod:`anchored_reasoning.objectives_tadm`. ``run`` saves the TADM
(``AutoModelForMaskedLM.from_pretrained`` loads it after ``import anchored_reasoning.models``), the
tokenizer, ``anchored_reasoning.json`` and ``train_summary.json`` (with the stale perplexity bound
per K when ``data.valid_text_file`` is set), and returns the folder. Checkpoints along the way and
resuming by rerunning the command work as in the other trainers (:mod:`anchored_reasoning.train.checkpointing`).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.train.pipelines import diffusion as dtrain
from anchored_reasoning.train import recipes as recipes_mod
from anchored_reasoning.train.pipelines.skeleton import Pipeline, Run, execute, parameters
from anchored_reasoning.train.trainers.tadm_trainer import OBJECTIVES, TADMTrainer, TADMTrainingConfig  # noqa: F401 - re-exported

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# recipe

def resolve_recipe(recipe: Mapping[str, Any] | str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Load (name / path / dict), apply dotted overrides, build the tadm recipe's sections and check them."""
    return recipes_mod.resolve(recipe, overrides, trainer="tadm")


def make_config(recipe: Mapping[str, Any], output_dir: Path) -> TADMTrainingConfig:
    from anchored_reasoning.train.checkpointing import with_save_defaults

    training = with_save_defaults(recipe.get("training") or {})
    training.setdefault("seed", int(recipe.get("seed", 0)))
    training["output_dir"] = str(output_dir)
    bf16 = training.get("bf16", "auto")
    if bf16 in (None, "auto"):
        training["bf16"] = None  # bf16 where a CUDA GPU supports it, fp32 elsewhere
    elif bf16 and not torch.cuda.is_available():
        raise ConfigError("training.bf16=true needs a CUDA GPU with bfloat16; use bf16: auto (fp32 on CPU) or false")
    try:
        return TADMTrainingConfig(**training)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"recipe 'training' section: {exc}") from None


def build_model(model_cfg: Mapping[str, Any], tokenizer, seed: int, objective: str):
    """A TADM: from a preset, a TADM checkpoint (``name``), or an MDLM/ADLM checkpoint (``base``)."""
    from transformers import AutoModelForMaskedLM

    import anchored_reasoning.models as models
    from anchored_reasoning.models.zoo import resolve_model

    if model_cfg.get("arch") not in (None, "tadm"):
        raise ConfigError(f"model.arch={model_cfg['arch']!r}: the tadm trainer builds TADMs (arch: tadm or unset); "
                          "an MDLM/ADLM to post-train goes in model.base")
    sources = [k for k in ("preset", "name", "base") if model_cfg.get(k)]
    if len(sources) != 1:
        raise ConfigError(f"recipe 'model' needs exactly one of preset (from scratch), name (a TADM checkpoint) or base "
                          f"(an MDLM/ADLM to post-train); got {sources or 'none'}")
    if model_cfg.get("base"):
        base = dtrain.build_model({"name": model_cfg["base"], "dtype": model_cfg.get("dtype")}, tokenizer, seed)
        if isinstance(base, models.TADM):
            raise ConfigError(f"model.base={model_cfg['base']!r} is already a TADM; continue it with model.name")
        torch.manual_seed(seed)
        return models.TADM.from_diffusion_model(
            base, shared_layers=int(model_cfg.get("shared_layers") or 0), anchor_layers=model_cfg.get("anchor_layers"),
            fusion_size=model_cfg.get("fusion_size"), freeze=objective == "posttrain")
    if objective == "posttrain" and model_cfg.get("preset"):
        raise ConfigError("tadm_objective: posttrain needs a trained model (model.base: an MDLM/ADLM checkpoint, or "
                          "model.name: a TADM); a preset is random weights")
    if model_cfg.get("preset"):
        preset = model_cfg["preset"]
        if preset not in models.PRESETS:
            raise ConfigError(f"unknown model preset {preset!r}; known: {', '.join(models.PRESETS)}")
        ids = dict(vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id, pad_token_id=tokenizer.pad_token_id,
                   bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
        extra = {k: model_cfg[k] for k in ("shared_layers", "fusion_size") if model_cfg.get(k) is not None}
        try:
            config = models.TADMConfig.from_preset(preset, **{**ids, **extra, **dict(model_cfg.get("config") or {})})
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"model.config: {exc}") from None
        torch.manual_seed(seed)
        return models.TADM(config)
    kwargs = {"dtype": getattr(torch, str(model_cfg["dtype"]))} if model_cfg.get("dtype") else {}
    model = AutoModelForMaskedLM.from_pretrained(resolve_model(str(model_cfg["name"])), **kwargs)
    if not isinstance(model, models.TADM):
        raise ConfigError(f"model.name={model_cfg['name']!r} is a {type(model).__name__}, not a TADM; to post-train an "
                          "MDLM/ADLM pass it as model.base")
    if objective == "posttrain":
        model.freeze_backbone()
    return model


class TADMPipeline(Pipeline):
    """The ``tadm`` kind's hooks on the run skeleton (:mod:`.skeleton`)."""

    kind = "tadm"

    def configure(self, recipe, output_dir):
        config = make_config(recipe, output_dir)
        refresh = [int(k) for k in ((recipe.get("data") or {}).get("ppl_refresh_every") or [1])]
        if min(refresh) < 1:
            raise ConfigError(f"data.ppl_refresh_every={refresh} must hold integers >= 1")
        return config

    def build(self, run: Run) -> None:
        from datasets import Dataset

        from anchored_reasoning.train.trainers.diffusion_trainer import DiffusionCollator

        recipe, config = run.recipe, run.config
        model_cfg, data, task_name = dict(recipe.get("model") or {}), dict(recipe.get("data") or {}), recipe.get("task")
        t0 = time.monotonic()
        method, train_examples, valid_examples, texts = None, [], [], []
        if config.diffusion_mode == "sft":
            method = dtrain.sft_method(recipe)
            train_examples, valid_examples = dtrain.sft_examples(recipe)
            texts = dtrain.rendered_texts(train_examples, method, task_name)
        elif model_cfg.get("preset"):
            from anchored_reasoning.train.data.diffusion_data import read_text_documents

            if not data.get("text_file"):
                raise ConfigError("pretraining (training.diffusion_mode: pretrain) needs data.text_file")
            texts = read_text_documents(dtrain.data_path(data["text_file"]), split_lines=True)

        if model_cfg.get("preset"):
            tokenizer = dtrain.build_tokenizer(model_cfg, texts, run.output_dir, run.resume.tokenizer_dir)
        else:
            tok_spec = model_cfg.get("tokenizer") or model_cfg.get("base") or model_cfg.get("name")
            if tok_spec == "train":
                raise ConfigError("model.tokenizer: train only applies to from-scratch models (model.preset)")
            tokenizer = dtrain.build_tokenizer({**model_cfg, "tokenizer": tok_spec}, [], run.output_dir)
        model = build_model(model_cfg, tokenizer, int(recipe.get("seed", 0)), config.tadm_objective)
        max_positions = int(model.config.max_position_embeddings)
        n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        logger.info("TADM: %.2fM parameters, %d trainable (%s)", parameters(model) / 1e6, n_trainable,
                    config.tadm_objective)
        train_rows, valid_rows, encode_stats = dtrain.rows_for(run, model, tokenizer, method, train_examples,
                                                               valid_examples)
        logger.info("data ready in %.1fs: %d train rows", time.monotonic() - t0, len(train_rows))
        run.trainer = TADMTrainer(
            model=model, args=config, train_dataset=Dataset.from_list(train_rows),
            eval_dataset=Dataset.from_list(valid_rows) if valid_rows else None,
            # SFT: the fixed response window (training.response_length) the base model was fine-tuned on
            data_collator=DiffusionCollator.for_tokenizer(
                tokenizer, eos_padding=config.eos_padding, max_length=max_positions,
                response_length=config.response_length if config.diffusion_mode == "sft" else None),
            processing_class=tokenizer, callbacks=[run.budget],
        )
        run.tokenizer = tokenizer
        run.state.update(method=method, encode_stats=encode_stats, n_trainable=n_trainable,
                         frozen_before=model.backbone_state_dict() if config.tadm_objective == "posttrain" else None)

    def finish(self, run: Run) -> dict[str, Any]:
        config, data = run.config, dict(run.recipe.get("data") or {})
        model = run.state["model"] = run.trainer.accelerator.unwrap_model(run.trainer.model)
        frozen_before = run.state["frozen_before"]
        if frozen_before is not None:
            after = model.backbone_state_dict()
            changed = [k for k, v in frozen_before.items() if not torch.equal(v.to(after[k].device), after[k])]
            if changed:
                raise RuntimeError(f"post-training changed frozen backbone weights {changed[:5]}; only fusion.* may train")
        if config.diffusion_mode != "pretrain" or not data.get("valid_text_file"):
            return {}
        bounds = {
            f"K={k}": valid_stale_ppl(model, run.tokenizer, dtrain.data_path(data["valid_text_file"]),
                                      int(run.state["encode_stats"]["seq_len"]), k, config.stale_sampling_steps,
                                      int(data.get("ppl_t_samples", 4)), int(run.recipe.get("seed", 0)),
                                      data.get("ppl_max_blocks"))
            for k in [int(k) for k in (data.get("ppl_refresh_every") or [1])]}
        logger.info("valid perplexity bound per K: %s", {k: round(v["perplexity"], 2) for k, v in bounds.items()})
        return {"valid_perplexity_bound": bounds}

    def meta(self, run: Run) -> dict[str, Any]:
        return {**dtrain.saved_meta(run, "tadm"), "objective": run.config.tadm_objective}

    def summary(self, run: Run) -> dict[str, Any]:
        model = run.state["model"]
        return {"mode": run.config.diffusion_mode, "objective": run.config.tadm_objective, "arch": "TADM",
                "layers": {"shared": model.config.shared_layers, "anchor": model.config.num_hidden_layers,
                           "denoiser": model.config.num_denoiser_layers},
                "parameters": parameters(model), "trainable_parameters": run.state["n_trainable"],
                "train_tokens": int(run.trainer._total_train_tokens), "encode_stats": run.state["encode_stats"]}


def run(recipe: Mapping[str, Any] | str, overrides: Sequence[str] = ()) -> Path:
    """Train from a recipe (dict, name or path) with dotted overrides. Returns the checkpoint folder."""
    return execute(TADMPipeline(), recipe, overrides)


def text_blocks(tokenizer, path: Path, seq_len: int, limit: int | None = None) -> torch.Tensor:
    """Full ``seq_len`` blocks of a text file's token stream (N, seq_len), at most ``limit``."""
    from anchored_reasoning.train.data.diffusion_data import pack_token_blocks, read_text_documents, tokenize_documents

    ids = tokenize_documents(tokenizer, read_text_documents(path))
    blocks = pack_token_blocks(ids, seq_len, keep_last=False)
    if not blocks:
        raise DataError(f"{path}: fewer than {seq_len} tokens")
    return torch.tensor(blocks[:limit] if limit else blocks, dtype=torch.long)


def valid_stale_ppl(model, tokenizer, path: Path, seq_len: int, refresh_every: int, steps: int, t_samples: int,
                    seed: int, limit: int | None = None) -> dict[str, Any]:
    """The stale-anchor perplexity bound (:func:`~anchored_reasoning.objectives_tadm.stale_perplexity_bound`)
    on a text file."""
    from anchored_reasoning.objectives_tadm import stale_perplexity_bound

    x = text_blocks(tokenizer, path, seq_len, limit)
    return stale_perplexity_bound(model, x, refresh_every=refresh_every, sampling_steps=steps, num_t_samples=t_samples,
                                  seed=seed).to_dict()
