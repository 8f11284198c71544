"""What a trained-style method needs around a causal LM and TRL's trainer, in one place for both ways in:
the recipe path (:func:`anchored_reasoning.train.pipelines.ar.run_with_examples`) and the Python API
(``AnchoredSFTTrainer(model, processing_class=tok, method="acot", ...)``).

* :func:`trained_method` -- the method object (a name is built in the ``trained`` style; ``acot`` and
  ``pause`` get ``k = num_anchor_slots`` unless their options set it);
* :func:`prepare_for_method` -- a pad token, the method's special tokens in the tokenizer, the model's
  embeddings resized to match (new rows initialised as the method asks), pad/eos ids in the configs;
* :func:`preflight` -- the warnings and the curriculum check that come before any training;
* :func:`anchored_collator` and :func:`anchored_callbacks` -- the collator that renders the method, the time
  budget and the curriculum/validation callback the config asks for;
* :func:`checkpoint_meta` -- what ``anchored_reasoning.json`` records, so a checkpoint is prompted in the
  format (method, options at the saved stage, task) it was trained in;
* :func:`assemble` -- all of it for ``AnchoredSFTTrainer(..., method=...)``: the keyword arguments its
  ``SFTTrainer.__init__`` gets.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from anchored_reasoning.errors import ConfigError

logger = logging.getLogger(__name__)

def steps_kept_warning(method, curriculum: bool) -> str | None:
    """A warning when a slot method (pause, acot) will keep every reasoning step in its target: without a
    curriculum and ``remove_steps_per_stage`` it trains at its last slot stage, i.e. CoT after the slots --
    not the paper's pause/ACoT, whose curriculum removes the steps (``train/prosqa_gpt2_pause.yaml``)."""
    if getattr(method, "slot_kind", None) is None or curriculum or getattr(method, "remove_steps_per_stage", 0):
        return None
    return (f"method {method.name!r} without training.curriculum and method.options.remove_steps_per_stage keeps "
            f"every reasoning step in its target: it learns CoT after its slots, not the paper's {method.name} "
            f"(set both, as train/prosqa_gpt2_{method.name}.yaml does, to remove the steps)")


#: Methods whose slot count ``k`` comes from ``AnchoredSFTConfig.num_anchor_slots`` unless their options set it.
SLOT_METHODS = ("acot", "pause")


def trained_method(method: Any, options: Mapping[str, Any] | None = None, num_anchor_slots: int | None = None):
    """``method`` as a trained-style Method object. A name is built with ``get_method(name, style="trained",
    **options)``; an object is returned as it is (``options`` must then be empty: they would be ignored)."""
    options = dict(options or {})
    if not isinstance(method, str):
        if options:
            raise ConfigError(f"method_options {sorted(options)} given with a method object ({type(method).__name__}): "
                              "build the object with those options, or pass the method by name")
        if getattr(method, "style", None) != "trained" or not hasattr(method, "render"):
            raise ConfigError(f"method must be a name (e.g. 'acot', 'cot') or a trained-style Method object; got "
                              f"{method!r}, which has no training format: pass the method by name")
        return method
    from anchored_reasoning.methods import get_method

    return get_method(method, style="trained", **slot_options(method, options, num_anchor_slots))


def slot_options(method: str, options: Mapping[str, Any] | None, num_anchor_slots: int | None,
                 explicit: bool = False) -> dict[str, Any]:
    """The one rule for a slot method's ``k``: ``method.options.k`` when given, else ``num_anchor_slots``
    (``training.num_anchor_slots``, whose default is the config's). ``explicit``: ``num_anchor_slots`` was
    set by the recipe, so a different ``k`` in the options is refused instead of silently winning."""
    options = dict(options or {})
    if method not in SLOT_METHODS or num_anchor_slots is None:
        return options
    if "k" not in options:
        options["k"] = int(num_anchor_slots)
    elif explicit and options["k"] != num_anchor_slots:
        raise ConfigError(f"recipe sets {method}'s slot count twice: method.options.k={options['k']!r} and "
                          f"training.num_anchor_slots={num_anchor_slots!r}; keep one (method.options.k)")
    return options


def prepare_for_method(model: Any, tokenizer: Any, added_tokens: Sequence[str] = (),
                       token_inits: Mapping[str, str] | None = None) -> int:
    """Make ``model`` and ``tokenizer`` ready to train a trained-style method: the eos token as pad token
    where there is none, the format's special tokens plus ``added_tokens`` (``method.added_tokens``) in the
    tokenizer, the model's embeddings resized to the tokenizer (new rows from ``token_inits``,
    ``method.added_token_inits``), and the pad/eos ids in the model's config and generation config.
    Idempotent; returns how many tokens were added."""
    from anchored_reasoning.methods.anchored import add_special_tokens

    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ConfigError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has neither a pad nor an eos "
                              "token: set tokenizer.pad_token before training")
        tokenizer.pad_token = tokenizer.eos_token
    import torch

    with torch.random.fork_rng(devices=[]):  # the resize samples the new rows: the same ones in every process
        torch.manual_seed(0)
        added = add_special_tokens(tokenizer, model, extra=added_tokens, init=token_inits)
    model.config.pad_token_id = tokenizer.pad_token_id
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        generation.pad_token_id = tokenizer.pad_token_id
        generation.eos_token_id = tokenizer.eos_token_id
    return added


def preflight(config: Any, method: Any, examples: Sequence[Any], task: str | None,
              model_cfg: Mapping[str, Any], options: Mapping[str, Any]) -> None:
    """Before training: log the warnings about ``method``'s targets (steps a slot method keeps without a
    curriculum; steps joined otherwise than the backbone ``model_cfg["name"]`` read them) and refuse a
    curriculum that cannot fit the run's steps on ``examples``."""
    from anchored_reasoning.train.callbacks.curriculum import curriculum_plan_for
    from anchored_reasoning.train.data.separator import separator_warning

    for warning in (steps_kept_warning(method, bool(config.curriculum)),
                    separator_warning(method, model_cfg, options, examples, task)):
        if warning:
            logger.warning(warning)
    if config.curriculum:
        curriculum_plan_for(config, method, len(examples))
    if hasattr(method, "render_at"):  # coconut: stages that fit the traces
        from anchored_reasoning.train.data.coconut_data import check_coconut_fits

        check_coconut_fits(method, examples, task)


def anchored_collator(config: Any, tokenizer: Any, method: Any, task: str | None):
    """The :class:`~anchored_reasoning.train.data.collate.AnchoredCollator` that renders ``method`` for training;
    with a curriculum it keeps each batch's rows, to re-render one prefetched before a stage switch."""
    from anchored_reasoning.train.data.collate import AnchoredCollator

    if hasattr(method, "render_at"):  # coconut: stage draws per row, <eot> aligned
        from anchored_reasoning.train.data.coconut_data import CoconutCollator

        return CoconutCollator(tokenizer, method, task=task, max_length=config.max_length,
                               keep_rows=bool(config.curriculum), seed=int(config.seed))
    return AnchoredCollator(tokenizer, method, task=task, ant_token=config.ant_token, max_length=config.max_length,
                            keep_rows=bool(config.curriculum))


def anchored_callbacks(config: Any, collator: Any, method: Any, tokenizer: Any = None,
                       valid_examples: Sequence[Any] = (), task: Any = None) -> tuple[Any, Any]:
    """``(TimeBudgetCallback, CurriculumCallback)`` as ``config`` (an :class:`AnchoredSFTConfig`) sets them:
    the time budget (``max_train_seconds``), the curriculum over the method's stages (``curriculum``, ...),
    and with ``generation_eval`` and ``valid_examples`` validation by greedy generation graded by ``task``
    (written under ``<output_dir>/validation``) that keeps the best weights (``keep_best``)."""
    from anchored_reasoning.train.callbacks.curriculum import CurriculumCallback, GenerationEvaluator, TimeBudgetCallback

    evaluator = None
    if config.generation_eval and valid_examples:
        evaluator = GenerationEvaluator(
            tokenizer,
            list(valid_examples)[: config.generation_eval_samples],
            task=task,
            max_new_tokens=config.generation_max_new_tokens,
            batch_size=config.generation_batch_size,
            out_dir=Path(config.output_dir) / "validation",
        )
    curriculum = CurriculumCallback.from_config(collator, method, config, evaluator)
    return TimeBudgetCallback(config.max_train_seconds), curriculum


def checkpoint_meta(method: Any, curriculum: Any = None, task: str | None = None) -> dict[str, Any]:
    """The ``anchored_reasoning.json`` of a checkpoint trained with ``method``: the checkpoint is prompted
    in the format of the stage its weights were trained at -- the best validated one when ``curriculum``
    restored it, else the stage training ended in (a time budget can stop a curriculum before its end)."""
    saved = method
    if curriculum is not None:
        saved = curriculum.method_at(curriculum.best["stage"] if curriculum.best else curriculum.stage)
    return {"method": method.name, "method_options": saved.options, "style": "trained", "task": task}


def _examples(data: Any) -> list | None:
    """``data`` as a list when it is a sequence of Examples (not a ``datasets.Dataset``), else None."""
    from anchored_reasoning.types import Example

    if isinstance(data, (list, tuple)) and data and all(isinstance(x, Example) for x in data):
        return list(data)
    if isinstance(data, (list, tuple)):
        if not data:
            raise ConfigError("the dataset given is an empty list: pass at least one Example")
        bad = next(x for x in data if not isinstance(x, Example))
        raise ConfigError(f"a dataset given as a list must hold Examples (anchored_reasoning.Example); found a "
                          f"{type(bad).__name__}: build Examples (anchored_reasoning.generate, Task.load) or pass a "
                          "datasets.Dataset")
    return None


def load_model(name: str | os.PathLike, tokenizer: Any = None, init_kwargs: Mapping[str, Any] | None = None):
    """``(model, tokenizer)`` from a model-zoo alias, a local folder or a Hub id (``tokenizer`` kept when given)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anchored_reasoning import model_path

    path = model_path(name)
    model = AutoModelForCausalLM.from_pretrained(path, **dict(init_kwargs or {}))
    return model, tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(path)


def assemble(*, model: Any, args: Any, data_collator: Any, train_dataset: Any, eval_dataset: Any,
             processing_class: Any, method: Any, task: Any, method_options: Mapping[str, Any] | None,
             callbacks: Sequence[Any] | None, config_cls: type, peft_config: Any = None) -> dict[str, Any]:
    """The keyword arguments ``AnchoredSFTTrainer`` hands to ``SFTTrainer.__init__``, plus ``method`` (the
    trained-style Method, or None), ``task_name`` and ``curriculum`` (the CurriculumCallback, or None).
    ``config_cls`` is the trainer's config class (``AnchoredSFTConfig``; the default ``args``).

    With ``method`` the model and tokenizer are readied as the recipe path readies them
    (:func:`prepare_for_method`), the :func:`preflight` checks run, a list of Examples becomes a dataset,
    the collator and callbacks are built where not given. Bad input fails here, before any training."""
    from anchored_reasoning.methods.answers import task_name_of
    from anchored_reasoning.train.callbacks.curriculum import CurriculumCallback

    task_name = task_name_of(task)
    if isinstance(model, (str, os.PathLike)):
        model, processing_class = load_model(model, processing_class, getattr(args, "model_init_kwargs", None))
    if args is None:
        name = str(getattr(model.config, "_name_or_path", "") or "model").rstrip("/").split("/")[-1]
        args = config_cls(output_dir=f"{name}-AnchoredSFT")
    callbacks = list(callbacks or [])
    curriculum = next((c for c in callbacks if isinstance(c, CurriculumCallback)), None)
    train_examples, valid_examples = _examples(train_dataset), _examples(eval_dataset)
    out = dict(model=model, args=args, data_collator=data_collator, train_dataset=train_dataset,
               eval_dataset=eval_dataset, processing_class=processing_class, callbacks=callbacks or None,
               method=None, task_name=task_name, curriculum=curriculum)
    if method is None:
        if peft_config is not None:  # LoRA as the config says (the recipe path's names the new tokens itself)
            from anchored_reasoning.train.peft_setup import wrap

            out["model"] = wrap(model, peft_config, seed=getattr(args, "seed", 0))
        if method_options:
            raise ConfigError("method_options given without a method: pass method='acot' (or another) as well")
        if train_examples is not None or valid_examples is not None:
            raise ConfigError("a dataset of Examples is rendered by a method: pass method= (e.g. 'acot', 'cot', "
                              "'anchor_chain'), or a datasets.Dataset with your own data_collator")
        return out
    if not isinstance(args, config_cls):
        raise ConfigError(f"method={method!r} trains with an {config_cls.__name__}, got {type(args).__name__}: "
                          f"pass args={config_cls.__name__}(output_dir=..., ...)")
    if processing_class is None:
        raise ConfigError("method= needs the tokenizer to add its tokens to: pass processing_class=tokenizer")
    built = trained_method(method, method_options, args.num_anchor_slots)
    if getattr(built, "latent", False) and not getattr(args, "latent_passes", False):
        raise ConfigError(f"method {built.name!r} feeds hidden states back as thoughts: train it with CoconutSFTTrainer "
                          "and CoconutSFTConfig (anchored_reasoning.train.trainers.coconut_trainer), not "
                          f"{config_cls.__name__}'s trainer")
    if getattr(built, "style", None) != "trained":  # a name with only a prompting format (e.g. 'completion')
        from anchored_reasoning.methods import list_methods

        trained = sorted(m.split(":", 1)[1] for m in list_methods() if m.startswith("trained:"))
        raise ConfigError(f"method {method!r} has no training format (only the {getattr(built, 'style', 'prompting')} "
                          f"style); methods that train: {', '.join(trained)}")
    if train_examples is not None:
        folder = getattr(model, "name_or_path", "") or ""
        model_cfg = {"name": folder} if folder and Path(folder).is_dir() else {}
        preflight(args, built, train_examples, task_name, model_cfg,
                  dict(method_options or {}) if isinstance(method, str) else built.options)
    elif args.curriculum and train_dataset is not None:  # a curriculum that cannot fit fails before training
        from anchored_reasoning.train.callbacks.curriculum import curriculum_plan_for

        curriculum_plan_for(args, built, len(train_dataset))
    prepare_for_method(model, processing_class, built.added_tokens, built.added_token_inits)
    if peft_config is not None:  # LoRA: the method's new token rows train as well (train/peft_setup.py)
        from anchored_reasoning.train.peft_setup import wrap

        model = wrap(model, peft_config, processing_class, built.added_tokens, seed=args.seed)
    if train_examples is not None:
        from anchored_reasoning.train.data.collate import check_anchor_labels, examples_dataset

        check_anchor_labels(processing_class, built, train_examples, task_name)  # an empty anchor fails here
        out["train_dataset"] = examples_dataset(train_examples)
    if valid_examples is not None:
        from anchored_reasoning.train.data.collate import examples_dataset

        out["eval_dataset"] = examples_dataset(valid_examples)
    if data_collator is None:
        out["data_collator"] = anchored_collator(args, processing_class, built, task_name)
    elif args.curriculum and not hasattr(data_collator, "set_stage"):
        raise ConfigError("curriculum=True moves the collator through the method's stages: the data_collator "
                          "given has no set_stage; leave data_collator out (the trainer builds an AnchoredCollator)")
    if curriculum is None:
        if args.generation_eval and not valid_examples:
            raise ConfigError("generation_eval=True grades greedy generations of eval_dataset: pass eval_dataset as "
                              "a list of Examples")
        grader = None
        if args.generation_eval:
            from anchored_reasoning.tasks import get_task

            grader = get_task(task) if isinstance(task, str) else task
        budget, curriculum = anchored_callbacks(args, out["data_collator"], built, processing_class,
                                                valid_examples or (), grader)
        out["callbacks"] = [*callbacks, budget, curriculum]
    out.update(model=model, args=args, processing_class=processing_class, method=built, curriculum=curriculum)
    return out
