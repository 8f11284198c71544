"""The ``tadm_gemma`` trainer's run: TADM:Post-train of a frozen DiffusionGemma on the run skeleton.

    anchored-reasoning train tadm_gemma_tiny                 # CPU, a random small DiffusionGemma, seconds
    anchored-reasoning train tadm_gemma_posttrain            # google/diffusiongemma-26B-A4B-it on a GPU

The loss and its settings are :mod:`anchored_reasoning.train.trainers.tadm_gemma_trainer`'s, the rows and the
recipe's value checks :mod:`anchored_reasoning.train.data.tadm_gemma_data`'s; the recipe's keys are
``recipes.sections.TADMGemmaRecipe``'s. :class:`TADMGemmaPipeline` supplies the skeleton's hooks
(:mod:`.skeleton`): the config; the base's config read and the split checked before any data or weights
load; the frozen base, the fusion (the only module that trains), the rows and the trainer; a check after
training that nothing beyond the fusion was optimised. The output folder is the fusion (``config.json``
names the base model; checkpoints hold the fusion alone), the tokenizer, ``anchored_reasoning.json`` and
``train_summary.json`` (the split and Phi's parameter count among them).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.models.tadm_fusion import check_fusion_kind
from anchored_reasoning.train.data.tadm_gemma_data import TRAINER, check_recipe
from anchored_reasoning.train.pipelines.skeleton import Pipeline, Run, execute
from anchored_reasoning.train.trainers.tadm_gemma_trainer import TADMGemmaConfig, TADMGemmaTrainer

logger = logging.getLogger(__name__)


def resolve_recipe(recipe: Mapping[str, Any] | str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Load (name / path / dict), apply dotted overrides, build the recipe's sections (an unknown key fails)
    and check every value (before any model loads)."""
    from anchored_reasoning.train.recipes import apply_overrides, load_recipe, validate

    loaded = load_recipe(recipe) if not isinstance(recipe, Mapping) else dict(recipe)
    resolved = apply_overrides(loaded, list(overrides))
    validate(resolved, TRAINER)
    check_recipe(resolved, TADMGemmaConfig)
    check_fusion_kind((resolved.get("model") or {}).get("fusion_kind") or "attention", "recipe key model.fusion_kind")
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


class TADMGemmaPipeline(Pipeline):
    """The ``tadm_gemma`` kind's hooks on the run skeleton (:mod:`.skeleton`)."""

    kind = TRAINER

    def resolve(self, recipe: Mapping[str, Any] | str, overrides: Sequence[str]) -> dict[str, Any]:
        return resolve_recipe(recipe, overrides)

    def configure(self, recipe: dict[str, Any], output_dir: Path) -> TADMGemmaConfig:
        return make_config(recipe, output_dir)

    def prepare(self, run: Run) -> Mapping[str, Any]:
        """The split checked against the base's config, then the texts and examples (no weights yet)."""
        run.state["split"] = check_model(run.recipe)
        run.state["texts"], run.state["examples"] = _texts_and_examples(run.recipe)
        return {}

    def build(self, run: Run) -> None:
        from datasets import Dataset

        from anchored_reasoning.models.tadm_gemma import TADMDiffusionGemma, fusion_parameters, make_fusion
        from anchored_reasoning.train.data.tadm_gemma_data import ContextCanvasCollator, example_rows, text_rows

        recipe, config, state = run.recipe, run.config, run.state
        seed = int(recipe.get("seed", 0))
        model_cfg, data = dict(recipe.get("model") or {}), dict(recipe.get("data") or {})
        t0 = time.monotonic()
        texts, examples = state["texts"], state["examples"]
        base, tokenizer, base_ref = build_base(recipe, run.output_dir, texts, config.device)
        tadm = TADMDiffusionGemma(base, split=state["split"])
        canvas, max_context = int(base.config.canvas_length), int(data.get("max_context", 1024))
        rows = (example_rows(examples, recipe["task"], data["method"], tokenizer, canvas, max_context, seed) if examples
                else text_rows(texts, tokenizer, canvas, max_context, seed))
        fusion = make_fusion(base, tadm.split, fusion_kind=model_cfg.get("fusion_kind") or "attention",
                             fusion_dim=int(model_cfg.get("fusion_dim") or 192),
                             num_heads=int(model_cfg.get("fusion_heads") or 3), base_model=base_ref, seed=seed)
        n_fusion = fusion_parameters(fusion)
        logger.info("TADM post-training of %s: split %s, %s fusion %d parameters (the only ones that train); %d rows, "
                    "ready in %.1fs", base_ref, tadm.split, fusion.config.fusion_kind, n_fusion, len(rows),
                    time.monotonic() - t0)
        run.trainer = TADMGemmaTrainer(model=fusion, args=config, train_dataset=Dataset.from_list(rows),
                                       data_collator=ContextCanvasCollator(tokenizer.pad_token_id),
                                       callbacks=[run.budget], tadm=tadm)
        run.tokenizer = tokenizer
        state.update(base=base, base_ref=base_ref, tadm=tadm, n_fusion=n_fusion, fusion_kind=fusion.config.fusion_kind,
                     rows=len(rows), canvas=canvas)

    def finish(self, run: Run) -> dict[str, Any]:
        base, n_fusion, optimizer = run.state["base"], run.state["n_fusion"], run.trainer.optimizer
        in_optimizer = sum(p.numel() for g in optimizer.param_groups for p in g["params"]) if optimizer else 0
        if any(p.requires_grad for p in base.parameters()) or in_optimizer not in (0, n_fusion):
            raise RuntimeError(f"post-training reached beyond the fusion ({in_optimizer} optimised parameters, fusion "
                               f"{n_fusion}); the DiffusionGemma must stay frozen")
        return {}

    def meta(self, run: Run) -> dict[str, Any]:
        data = dict(run.recipe.get("data") or {})
        return {"backend": "diffusion_gemma", "arch": "tadm_gemma", "base_model": run.state["base_ref"],
                "task": run.recipe.get("task"), "method": str(data.get("method") or "text"), "style": "pretrained"}

    def summary(self, run: Run) -> dict[str, Any]:
        state, split = run.state, run.state["tadm"].split
        return {"base_model": state["base_ref"], "split": dataclasses.asdict(split),
                "fusion_kind": state["fusion_kind"], "fusion_parameters": state["n_fusion"],
                "base_parameters": sum(p.numel() for p in state["base"].parameters()),
                "rows": state["rows"], "canvas_length": state["canvas"],
                "layer_calls_per_step": {"shared": split.shared, "anchor": split.anchor, "denoiser": split.denoiser}}


def run(recipe: Mapping[str, Any] | str, overrides: Sequence[str] = ()) -> Path:
    """Post-train a fusion from a recipe (dict, name or path) with dotted overrides. Returns the output folder."""
    return execute(TADMGemmaPipeline(), recipe, overrides)


__all__ = ["TADMGemmaPipeline", "make_config", "resolve_recipe", "run"]
