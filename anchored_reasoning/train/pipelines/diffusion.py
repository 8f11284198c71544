"""The ``diffusion`` trainer: MDLM / ADLM pretraining on raw text and SFT on reasoning tasks.

The recipe, data and run hooks of one trainer; the tokenizer and model building live in
train/pipelines/diffusion_model.py, the objective and collation in objectives.py and
train/data/diffusion_data.py, the run skeleton in train/pipelines/skeleton.py.

    anchored-reasoning train diffusion_pretrain_tiny_adlm training.max_steps=200
    anchored-reasoning train diffusion_sft_prosqa_adlm data.train.n=2000
    accelerate launch -m anchored_reasoning.cli train diffusion_pretrain_tiny_mdlm

A recipe (YAML, see ``train/diffusion_*.yaml``)::

    trainer: diffusion
    seed: 0
    output_dir: runs/adlm-wikitext
    task: prosqa                       # SFT only: the task whose rendering/anchors are used
    model:
      arch: adlm                       # mdlm | adlm (from scratch, with preset) ...
      preset: tiny                     # tiny | small | paper (anchored_reasoning.models.PRESETS)
      config: {num_hidden_layers: 4}   # overrides of the preset's fields
      name: null                       # ... or a checkpoint to fine-tune (path / Hub id)
      tokenizer: train                 # train a byte-level BPE on the training text, or a path
      tokenizer_vocab_size: 1024
    method: {name: cot, options: {}}   # SFT: trained-style rendering (nocot, cot, pause, stepwise)
    data:
      # pretraining: a text corpus (relative paths are looked up in $ANCHORED_REASONING_DATA)
      text_file: corpora/wikitext2_valid.txt
      valid_text_file: corpora/wikitext2_test.txt   # perplexity bound after training
      seq_len: 128
      split_lines: false               # true: every line is a document (EOS between lines)
      # SFT: examples from a generator or a task split (as in the ``ar`` trainer)
      train: {generator: prosqa, n: 2000, params: {num_nodes: 8}}
      valid: {generator: prosqa, n: 64, seed: 1}
      max_length: 256                  # <= the model's max_position_embeddings
      overlong: error                  # or drop (dropped rows are counted in the log)
      anchors: frequency               # anchored SFT: frequency (tau rule) or task (task's extractor)
    training:                          # DiffusionSFTConfig fields (TRL SFTConfig + diffusion ones)
      diffusion_mode: pretrain         # or sft
      anchored: true                   # ANELBO (ADLM only)
      anchor_gamma: 3.0e-3
      max_steps: 500
      bf16: auto                       # auto = bf16 on a CUDA GPU that supports it, fp32 elsewhere

``run`` validates every key before any work (unknown keys fail, naming the key), builds the
tokenizer and model, trains with :class:`~anchored_reasoning.train.trainers.diffusion_trainer.DiffusionSFTTrainer`,
and saves ``save_pretrained`` weights (loadable with ``AutoModelForMaskedLM`` after
``import anchored_reasoning.models``), the tokenizer, ``anchored_reasoning.json`` (SFT: method,
options, task, backend ``diffusion``) and ``train_summary.json`` (log history, timing, the final
perplexity bound when a validation text is given).

Checkpoints go to ``<output_dir>/checkpoint-<step>`` along the way (``training.save_steps``,
``save_every_minutes``, ``save_total_limit``; with ``eval_strategy: steps`` and
``metric_for_best_model: loss`` the Trainer also keeps the best by validation loss); rerunning the
same command resumes from the newest (:mod:`anchored_reasoning.train.checkpointing`).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from anchored_reasoning.checkpoints import CHECKPOINT_META  # noqa: F401 - re-exported
from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.train import recipes as recipes_mod
from anchored_reasoning.train.pipelines.diffusion_model import (  # noqa: F401 - part of this module's API
    ARCHS,
    build_model,
    build_tokenizer,
    resize_vocab,
)
from anchored_reasoning.train.pipelines.skeleton import Pipeline, Run, execute, parameters

logger = logging.getLogger(__name__)


def resolve_recipe(recipe: Mapping[str, Any] | str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Load (name / path / dict), apply dotted overrides, build the diffusion recipe's sections and check them."""
    return recipes_mod.resolve(recipe, overrides, trainer="diffusion")


def data_path(value: str) -> Path:
    """A corpus path: absolute / existing relative paths as given, else under the data folder."""
    from anchored_reasoning.resources import data_dir

    p = Path(str(value)).expanduser()
    if p.is_file():
        return p
    root = data_dir()
    if root is not None and (root / p).is_file():
        return root / p
    raise DataError(
        f"text file {value!r} not found (as a path, or under $ANCHORED_REASONING_DATA="
        f"{root if root is not None else 'unset'}); set ANCHORED_REASONING_DATA to the data folder or give a full path"
    )


# ---------------------------------------------------------------------------------------------
# config (the tokenizer and model: train/pipelines/diffusion_model.py)

def make_config(recipe: Mapping[str, Any], output_dir: Path):
    """The :class:`DiffusionSFTConfig` of the recipe's ``training`` section (``bf16: auto`` resolved)."""
    import torch

    from anchored_reasoning.train.checkpointing import with_save_defaults
    from anchored_reasoning.train.trainers.diffusion_trainer import DiffusionSFTConfig

    training = with_save_defaults(recipe.get("training") or {})
    training.setdefault("seed", int(recipe.get("seed", 0)))
    training["output_dir"] = str(output_dir)
    bf16 = training.get("bf16", "auto")
    if bf16 in (None, "auto"):
        training["bf16"] = None  # DiffusionSFTConfig: bf16 on a CUDA GPU that supports it, else fp32
    elif bf16 and not torch.cuda.is_available():
        raise ConfigError("training.bf16=true needs a CUDA GPU with bfloat16; use bf16: auto (fp32 on CPU) or false")
    try:
        return DiffusionSFTConfig(**training)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"recipe 'training' section: {exc}") from None


# ---------------------------------------------------------------------------------------------
# data

def pretrain_rows(recipe: Mapping[str, Any], tokenizer, max_positions: int):
    """Packed blocks of the recipe's ``data.text_file`` (training) and ``valid_text_file`` (eval)."""
    from anchored_reasoning.train.data.diffusion_data import pack_token_blocks, packed_rows, read_text_documents, tokenize_documents

    data = dict(recipe.get("data") or {})
    if not data.get("text_file"):
        raise ConfigError("pretraining needs data.text_file (a text corpus)")
    seq_len = int(data.get("seq_len", min(128, max_positions)))
    if seq_len > max_positions:
        raise ConfigError(f"data.seq_len={seq_len} exceeds the model's max_position_embeddings={max_positions}")
    docs = read_text_documents(data_path(data["text_file"]), split_lines=bool(data.get("split_lines", False)))
    ids = tokenize_documents(tokenizer, docs)
    if data.get("max_train_tokens"):
        ids = ids[: int(data["max_train_tokens"])]
    blocks = pack_token_blocks(ids, seq_len, keep_last=False)
    if not blocks:
        raise DataError(f"{data['text_file']}: {len(ids)} tokens is less than one block of seq_len={seq_len}")
    logger.info("pretraining data: %d tokens -> %d blocks of %d", len(ids), len(blocks), seq_len)
    return packed_rows(blocks), seq_len


def sft_rows(examples, method, task_name, tokenizer, max_length: int, overlong: str, anchors: str | None, where: str):
    from anchored_reasoning.anchors import extract_anchors
    from anchored_reasoning.train.data.diffusion_data import encode_sft_rows

    rows = []
    for ex in examples:
        r = method.render(ex, task_name)
        rows.append({"id": ex.id, "prompt": r.prompt, "completion": r.target,
                     "anchors": extract_anchors(ex, task_name) if anchors == "task" else None})
    return encode_sft_rows(tokenizer, rows, max_length, overlong=overlong,
                           anchor_source="task" if anchors == "task" else None, where=where)


# ---------------------------------------------------------------------------------------------
# entry point

def sft_method(recipe: Mapping[str, Any], reject_anchored: bool = False):
    """The trained-style method of an SFT recipe (``method.name`` required)."""
    from anchored_reasoning.methods import get_method

    method_cfg = dict(recipe.get("method") or {})
    if not method_cfg.get("name"):
        raise ConfigError("SFT recipes need method.name (nocot, cot, pause or stepwise)")
    method = get_method(method_cfg["name"], style="trained", **dict(method_cfg.get("options") or {}))
    if reject_anchored and getattr(method, "anchored", False):
        raise ConfigError(
            f"method {method.name!r} puts [ANT] slots in the prompt for an AR anchor loss; diffusion SFT anchors the "
            "response instead: use method cot (or nocot/pause/stepwise) with training.anchored: true")
    return method


def sft_examples(recipe: Mapping[str, Any]):
    """(train, valid) examples of the recipe's ``data.train`` / ``data.valid``."""
    from anchored_reasoning.train.data.data_sources import load_split

    data, seed, task_name = dict(recipe.get("data") or {}), int(recipe.get("seed", 0)), recipe.get("task")
    train = load_split(data.get("train"), task_name, seed)
    if not train:
        raise DataError("recipe data.train produced no examples")
    return train, load_split(data.get("valid"), task_name, seed + 1, part="valid")


def rendered_texts(examples, method, task_name) -> list[str]:
    return [(lambda r: r.prompt + r.target)(method.render(ex, task_name)) for ex in examples[:5000]]


def rows_for(run: Run, model, tokenizer, method, train_examples, valid_examples):
    """(train rows, valid rows, encode stats) of an SFT or pretraining run, checked against the model's positions."""
    config, recipe, task_name = run.config, run.recipe, run.recipe.get("task")
    data = dict(recipe.get("data") or {})
    max_positions = int(model.config.max_position_embeddings)
    if config.diffusion_mode != "sft":
        train_rows, seq_len = pretrain_rows(recipe, tokenizer, max_positions)
        return train_rows, [], {"rows": len(train_rows), "seq_len": seq_len}
    max_length = int(data.get("max_length", max_positions))
    if max_length > max_positions:
        raise ConfigError(f"data.max_length={max_length} exceeds the model's max_position_embeddings={max_positions}")
    anchors = data.get("anchors", "frequency")
    if anchors not in ("frequency", "task"):
        raise ConfigError(f"data.anchors={anchors!r}; choose frequency (tau rule) or task (the task's anchor extractor)")
    anchors = anchors if config.anchored else None
    overlong = str(data.get("overlong", "error"))
    train_rows, stats = sft_rows(train_examples, method, task_name, tokenizer, max_length, overlong, anchors, "train")
    valid_rows = sft_rows(valid_examples, method, task_name, tokenizer, max_length, overlong, anchors, "valid")[0] \
        if valid_examples else []
    return train_rows, valid_rows, dataclasses.asdict(stats)


def saved_meta(run: Run, arch: str) -> dict[str, Any]:
    """``anchored_reasoning.json`` of a diffusion checkpoint: its method (SFT) or plain text (pretraining)."""
    method = run.state.get("method")
    meta = {"backend": "diffusion", "mode": run.config.diffusion_mode, "arch": arch, "task": run.recipe.get("task")}
    if method is None:
        return {**meta, "method": "text", "style": "pretrained"}
    return {**meta, "method": method.name, "method_options": method.options, "style": "trained"}


class DiffusionPipeline(Pipeline):
    """The ``diffusion`` kind's hooks on the run skeleton (:mod:`.skeleton`)."""

    kind = "diffusion"

    def configure(self, recipe, output_dir):
        return make_config(recipe, output_dir)

    def build(self, run: Run) -> None:
        from datasets import Dataset

        from anchored_reasoning.train.trainers.diffusion_trainer import DiffusionCollator, DiffusionSFTTrainer

        recipe, config = run.recipe, run.config
        model_cfg = dict(recipe.get("model") or {})
        if not model_cfg:
            raise ConfigError("recipe needs a 'model' section (arch + preset, or name)")
        data, task_name = dict(recipe.get("data") or {}), recipe.get("task")
        t0 = time.monotonic()
        method, train_examples, valid_examples = None, [], []
        if config.diffusion_mode == "sft":
            from anchored_reasoning.train.data.separator import separator_warning

            method = sft_method(recipe, reject_anchored=True)
            train_examples, valid_examples = sft_examples(recipe)
            warning = separator_warning(method, model_cfg, dict(recipe["method"].get("options") or {}), train_examples,
                                        task_name)
            if warning:
                logger.warning(warning)
            texts = rendered_texts(train_examples, method, task_name)
        else:
            from anchored_reasoning.train.data.diffusion_data import read_text_documents

            if not data.get("text_file"):
                raise ConfigError("pretraining (training.diffusion_mode: pretrain) needs data.text_file")
            texts = read_text_documents(data_path(data["text_file"]), split_lines=True)

        if model_cfg.get("preset"):
            tokenizer = build_tokenizer(model_cfg, texts, run.output_dir, run.resume.tokenizer_dir)
        else:  # fine-tuning a checkpoint: its own tokenizer unless one is named
            tok_spec = model_cfg.get("tokenizer") or model_cfg.get("name")
            if tok_spec == "train":
                raise ConfigError("model.tokenizer: train only applies to from-scratch models (model.preset)")
            tokenizer = build_tokenizer({**model_cfg, "tokenizer": tok_spec}, [], run.output_dir)
        model = build_model(model_cfg, tokenizer, int(recipe.get("seed", 0)))
        max_positions = int(model.config.max_position_embeddings)
        logger.info("model: %s, %.2fM parameters", type(model).__name__, parameters(model) / 1e6)

        train_rows, valid_rows, encode_stats = rows_for(run, model, tokenizer, method, train_examples, valid_examples)
        if config.diffusion_mode == "sft" and config.response_length:
            longest_prompt = max(sum(1 for x in r["labels"] if x == -100) for r in train_rows + valid_rows)
            if longest_prompt + config.response_length > max_positions:
                raise ConfigError(
                    f"training.response_length={config.response_length} + the longest prompt ({longest_prompt} tokens) "
                    f"exceeds the model's max_position_embeddings={max_positions}; lower response_length")
        logger.info("data ready in %.1fs: %d train rows, %d valid rows", time.monotonic() - t0, len(train_rows),
                    len(valid_rows))
        if config.response_length is not None and config.diffusion_mode != "sft":
            raise ConfigError("training.response_length applies to SFT (prompt/response rows) only")
        collator = DiffusionCollator.for_tokenizer(tokenizer, eos_padding=config.eos_padding,
                                                   response_length=config.response_length, max_length=max_positions)
        run.trainer = DiffusionSFTTrainer(
            model=model, args=config, train_dataset=Dataset.from_list(train_rows),
            eval_dataset=Dataset.from_list(valid_rows) if valid_rows else None,
            data_collator=collator, processing_class=tokenizer, callbacks=[run.budget])
        run.tokenizer = tokenizer
        run.state.update(method=method, model=model, encode_stats=encode_stats)

    def finish(self, run: Run) -> dict[str, Any]:
        data = dict(run.recipe.get("data") or {})
        if run.config.diffusion_mode != "pretrain" or not data.get("valid_text_file"):
            return {}
        from anchored_reasoning.train.perplexity import evaluate_text_file

        trainer = run.trainer
        bound = evaluate_text_file(trainer.accelerator.unwrap_model(trainer.model), run.tokenizer,
                                   data_path(data["valid_text_file"]), seq_len=int(run.state["encode_stats"]["seq_len"]),
                                   t_samples=int(data.get("ppl_t_samples", 4)), seed=int(run.recipe.get("seed", 0)))
        logger.info("valid perplexity bound %.2f (NELBO %.4f nats/token)", bound["perplexity"], bound["nelbo"])
        return {"valid_perplexity_bound": bound}

    def meta(self, run: Run) -> dict[str, Any]:
        meta = saved_meta(run, type(run.state["model"]).__name__.lower())
        if run.state["method"] is not None and run.config.response_length:
            meta["gen_length"] = int(run.config.response_length)  # the window it was trained to fill
        return meta

    def summary(self, run: Run) -> dict[str, Any]:
        return {"mode": run.config.diffusion_mode, "arch": type(run.state["model"]).__name__,
                "parameters": parameters(run.state["model"]), "train_tokens": int(run.trainer._total_train_tokens),
                "encode_stats": run.state["encode_stats"]}


def run(recipe: Mapping[str, Any] | str, overrides: Sequence[str] = ()) -> Path:
    """Train from a recipe (dict, name or path) with dotted overrides. Returns the checkpoint folder."""
    return execute(DiffusionPipeline(), recipe, overrides)
