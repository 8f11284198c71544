"""The ``ar`` trainer: SFT / ACoT / pause / stepwise fine-tuning of causal LMs from a recipe.

    anchored-reasoning train prosqa_gpt2_acot training.max_steps=200
    accelerate launch --config_file train/accelerate/ddp_cpu.yaml -m anchored_reasoning.cli train prosqa_gpt2_acot

``run(recipe, overrides)`` validates the whole recipe first (an unknown key fails before any model is
built), then: builds the model (a GPT-2-class config preset trained from scratch, or
``from_pretrained`` on a path / Hub id / model-zoo alias), adds the method's special tokens once and
resizes the embeddings, loads or generates the data, trains with :class:`AnchoredSFTTrainer` (plus the
curriculum / validation callbacks), and saves ``save_pretrained`` weights, the tokenizer and
``anchored_reasoning.json`` (method, options, style, task) so that the eval runner prompts the
checkpoint exactly as it was trained. ``train_summary.json`` records the log history, curriculum
events, anchor counts and timing.

Checkpoints go to ``<output_dir>/checkpoint-<step>`` along the way (``training.save_steps``,
``save_every_minutes``, ``save_total_limit``); rerunning the same command resumes from the newest one
(:mod:`anchored_reasoning.train.checkpointing`, docs/checkpoints.md).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.train.data.data_sources import load_split
from anchored_reasoning.train.pipelines.model_presets import _PRESET_DEFAULTS, MODEL_PRESETS  # noqa: F401 - MODEL_PRESETS re-exported
from anchored_reasoning.train.pipelines.method_setup import steps_kept_warning  # noqa: F401 - re-exported (it moved there)
from anchored_reasoning.train.pipelines.skeleton import Pipeline, Run, execute, parameters
from anchored_reasoning.types import Example

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# data (sections and mixes are loaded by data_sources.load_split)

def training_texts(examples: Sequence[Example], method: Any, task: Any) -> list[str]:
    """Rendered text of every curriculum stage, for training a tokenizer that covers the format."""
    texts = []
    stages = getattr(method, "num_stages", 1)
    for ex in examples:
        for s in sorted({0, stages - 1}):
            staged = method.with_stage(s) if hasattr(method, "with_stage") else method
            r = staged.render(ex, task)
            texts.append(r.prompt + r.target)
    return texts


# ---------------------------------------------------------------------------------------------
# model + tokenizer

def build_tokenizer_from_texts(texts: Sequence[str], out_dir: Path, vocab_size: int):
    """A byte-level BPE trained on ``texts`` (the fast path for from-scratch models offline)."""
    from anchored_reasoning.tokenization import train_tiny_tokenizer

    tok = train_tiny_tokenizer(out_dir, texts=texts, vocab_size=vocab_size)
    tok.padding_side = "left"
    return tok


def build_model_and_tokenizer(model_cfg: Mapping[str, Any], texts: Sequence[str], work_dir: Path, seed: int,
                              tokenizer_dir: Path | None = None, extra_tokens: Sequence[str] = (),
                              token_inits: Mapping[str, str] | None = None, load_kwargs: Mapping[str, Any] | None = None):
    """The model and its tokenizer. ``tokenizer_dir``: a saved tokenizer to use instead of training
    one (a resumed run reuses its checkpoint's, so token ids cannot change under the weights).
    ``extra_tokens``: the method's own added tokens (``TrainedMethod.added_tokens``); ``token_inits``: the
    texts their embeddings start from (``TrainedMethod.added_token_inits``; a pretrained model only, a
    model from scratch has no embedding worth averaging)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from anchored_reasoning.methods.anchored import add_special_tokens
    from anchored_reasoning.train.pipelines.method_setup import prepare_for_method

    preset = model_cfg.get("preset")
    name = model_cfg.get("name")
    if bool(preset) == bool(name):
        raise ConfigError("recipe 'model' needs exactly one of 'preset' (from scratch) or 'name' (from_pretrained)")
    tok_spec = model_cfg.get("tokenizer")
    if preset:
        if preset not in MODEL_PRESETS:
            raise ConfigError(f"unknown model preset {preset!r}; known: {', '.join(MODEL_PRESETS)}")
        if tokenizer_dir is not None and tok_spec in (None, "train"):
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        elif tok_spec in (None, "train"):
            tokenizer = build_tokenizer_from_texts(texts, work_dir / "tokenizer", int(model_cfg.get("tokenizer_vocab_size", 1024)))
        else:
            from anchored_reasoning.models.zoo import resolve_model

            tokenizer = AutoTokenizer.from_pretrained(resolve_model(tok_spec))
        if tokenizer.eos_token is None:
            raise ConfigError(f"tokenizer {tok_spec!r} has no eos token")
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        add_special_tokens(tokenizer, extra=extra_tokens)
        cfg = {**_PRESET_DEFAULTS, **MODEL_PRESETS[preset], **dict(model_cfg.get("config") or {})}
        try:
            config = GPT2Config(
                vocab_size=len(tokenizer),
                bos_token_id=tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
                **cfg,
            )
        except TypeError as exc:
            raise ConfigError(f"model.config: {exc}") from None
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    else:
        from anchored_reasoning.models.zoo import resolve_model

        path = resolve_model(name)
        # a Hub revision pins a Hub id; a local directory (an offline copy) has none
        revision = {"revision": model_cfg["revision"]} if model_cfg.get("revision") and not Path(path).is_dir() else {}
        tok_path = resolve_model(tok_spec) if tok_spec and tok_spec != "train" else path
        tokenizer = AutoTokenizer.from_pretrained(tok_path, **(revision if tok_path == path else {}))
        kwargs = dict(revision)
        if model_cfg.get("dtype"):
            kwargs["dtype"] = getattr(torch, str(model_cfg["dtype"]))
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs, **dict(load_kwargs or {}))  # QLoRA: 4-bit
    # the one path that readies model + tokenizer for a method, shared with AnchoredSFTTrainer(method=...)
    # (a preset's tokens are in its vocabulary already: nothing is resized or initialised for it)
    prepare_for_method(model, tokenizer, extra_tokens, token_inits)
    return model, tokenizer


# ---------------------------------------------------------------------------------------------
# training

def make_config(recipe: Mapping[str, Any], output_dir: Path):
    from anchored_reasoning.train.trainers.acot_trainer import AnchoredSFTConfig
    from anchored_reasoning.train.checkpointing import with_save_defaults

    config_cls = AnchoredSFTConfig
    if (recipe.get("method") or {}).get("name") == "coconut":  # the same fields; its trainer runs the latent passes
        from anchored_reasoning.train.trainers.coconut_trainer import CoconutSFTConfig as config_cls

    training = with_save_defaults(recipe.get("training") or {})
    training.setdefault("seed", int(recipe.get("seed", 0)))
    training["output_dir"] = str(output_dir)
    try:
        return config_cls(**training)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"recipe 'training' section: {exc}") from None


def grader_for(task_name: str | None):
    """The task object (for ``task.grade``), or None when the task registry does not know it."""
    if not task_name:
        return None
    from anchored_reasoning.tasks import get_task

    return get_task(task_name)


class ARPipeline(Pipeline):
    """The ``ar`` kind's hooks on the run skeleton (:mod:`.skeleton`). ``train_examples``: examples given
    (:func:`run_with_examples`) instead of the recipe's ``data`` section."""

    kind = "ar"

    def __init__(self, train_examples: Sequence[Example] | None = None, valid_examples: Sequence[Example] = ()):
        self.train_examples, self.valid_examples = train_examples, list(valid_examples)

    def output_dir(self, recipe: Mapping[str, Any]) -> Path:
        return Path(recipe.get("output_dir") or f"runs/{Path(str(recipe.get('_source', 'recipe'))).stem}")

    def resolve(self, recipe, overrides):
        recipe = super().resolve(recipe, overrides)
        if not (recipe.get("method") or {}).get("name"):
            raise ConfigError("recipe needs method.name (nocot, cot, pause, acot or stepwise)")
        if not recipe.get("model"):
            raise ConfigError("recipe needs a 'model' section (preset or name)")
        return recipe

    def configure(self, recipe, output_dir):
        from anchored_reasoning.train.peft_setup import check_runtime

        check_runtime(recipe.get("peft"))  # LoRA without peft, QLoRA without a GPU: refused before any data work
        return make_config(recipe, output_dir)

    def prepare(self, run: Run) -> Mapping[str, Any]:
        from anchored_reasoning.train.checkpointing import examples_fingerprint

        train, valid = self.train_examples, self.valid_examples
        if train is None:
            seed, task_name, data = int(run.recipe.get("seed", 0)), run.recipe.get("task"), dict(run.recipe.get("data") or {})
            t0 = time.monotonic()
            train = load_split(data.get("train"), task_name, seed)
            if not train:
                raise DataError("recipe data.train produced no examples")
            valid = load_split(data.get("valid"), task_name, seed + 1, part="valid")
            logger.info("data: %d train, %d valid examples (%.1fs)", len(train), len(valid), time.monotonic() - t0)
        elif not train:
            raise DataError("no training examples")
        run.state.update(train=list(train), valid=list(valid))
        return {"_examples": examples_fingerprint(train, valid)}

    def build(self, run: Run) -> None:
        from anchored_reasoning.train.trainers.acot_trainer import AnchoredSFTTrainer
        from anchored_reasoning.train.data.collate import check_anchor_labels, examples_dataset
        from anchored_reasoning.train.pipelines.method_setup import anchored_callbacks, anchored_collator, preflight, trained_method
        from anchored_reasoning.train import peft_setup

        recipe, config, train = run.recipe, run.config, run.state["train"]
        task_name, method_cfg = recipe.get("task"), dict(recipe["method"])
        options = dict(method_cfg.get("options") or {})
        method = trained_method(method_cfg["name"], options, config.num_anchor_slots)
        # warnings; a curriculum that cannot fit the run's steps is refused before any model is built
        preflight(config, method, train, task_name, recipe["model"], options)
        task = grader_for(task_name) if config.generation_eval else None
        needs_tokenizer = recipe["model"].get("preset") and recipe["model"].get("tokenizer") in (None, "train")
        texts = training_texts(train[:5000], method, task_name) if needs_tokenizer else []
        model, tokenizer = build_model_and_tokenizer(recipe["model"], texts, run.output_dir, int(recipe.get("seed", 0)),
                                                     run.resume.tokenizer_dir, method.added_tokens,
                                                     method.added_token_inits, peft_setup.load_kwargs(recipe.get("peft")))
        peft_config = peft_setup.lora_config(recipe.get("peft"), model, tokenizer, method.added_tokens)  # or None
        logger.info("model: %.2fM parameters", parameters(model) / 1e6)
        anchor_check = check_anchor_labels(tokenizer, method, train, task_name)  # an empty anchor fails here
        collator = anchored_collator(config, tokenizer, method, task_name)
        run.budget, curriculum = anchored_callbacks(config, collator, method, tokenizer, run.state["valid"], task)
        trainer_cls = AnchoredSFTTrainer
        if getattr(config, "latent_passes", False):  # coconut (CoconutSFTConfig): the trainer with the latent passes
            from anchored_reasoning.train.trainers.coconut_trainer import CoconutSFTTrainer as trainer_cls
        run.trainer = trainer_cls(model=model, args=config, train_dataset=examples_dataset(train),
                                         data_collator=collator, processing_class=tokenizer,
                                         callbacks=[run.budget, curriculum], peft_config=peft_config)
        run.tokenizer, run.attach = tokenizer, {"curriculum": curriculum}
        run.state.update(method=method, model=model, collator=collator, curriculum=curriculum, anchor_check=anchor_check)

    def meta(self, run: Run) -> dict[str, Any]:
        from anchored_reasoning.train import peft_setup
        from anchored_reasoning.train.pipelines.method_setup import checkpoint_meta

        # the format of the stage the weights were saved at
        meta = checkpoint_meta(run.state["method"], run.state["curriculum"], run.recipe.get("task"))
        adapter = peft_setup.adapter_meta(run.trainer.model, run.recipe["model"].get("name"))
        return {**meta, "peft": adapter} if adapter else meta

    def summary(self, run: Run) -> dict[str, Any]:
        trainer, curriculum, config = run.trainer, run.state["curriculum"], run.config
        return {
            "distributed": trainer.distributed_summary(),
            "epochs": trainer.state.epoch,
            "final_stage": curriculum.stage,
            "stages_planned": curriculum.num_stages if config.curriculum else 1,
            "optimizer_resets": curriculum.optimizer_resets,
            "best": curriculum.best,
            "collator_stats": run.state["collator"].stats,
            "anchor_labels": run.state["anchor_check"],
            "examples_fewer_anchors": trainer.examples_fewer_anchors,
            "examples_no_anchors": trainer.examples_no_anchors,
            "curriculum_history": curriculum.history,
            "parameters": parameters(run.state["model"]),
        }


def run(recipe: Mapping[str, Any] | str, overrides: Sequence[str] = ()) -> Path:
    """Train from a recipe (dict, name or path) with dotted overrides. Returns the checkpoint folder."""
    return execute(ARPipeline(), recipe, overrides)


def run_with_examples(
    recipe: Mapping[str, Any] | str,
    train_examples: Sequence[Example],
    valid_examples: Sequence[Example] = (),
    overrides: Sequence[str] = (),
) -> Path:
    """Like :func:`run`, with the examples given (the recipe's ``data`` section is ignored)."""
    return execute(ARPipeline(train_examples, valid_examples), recipe, overrides)
