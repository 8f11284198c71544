"""The one run skeleton every recipe trainer (``ar``, ``diffusion``, ``tadm``, ``grpo``, ``tadm_gemma``) goes through.

:func:`execute` runs the steps in this order; a :class:`Pipeline` subclass per trainer kind supplies the
kind-specific hooks (``configure``, ``prepare``, ``build``, ``finish``, ``meta``, ``summary``):

1. resolve the recipe once (:func:`~.recipes.resolve`: load, apply the overrides, build the recipe sections
   so an unknown key fails, check every value) and build the trainer config once (``configure``);
2. refuse a rerun whose settings changed before any data work (``checkpointing.check_run_config``), load
   and check the data (``prepare``, which may add a fingerprint of the examples to the resume key), and
   plan the resume (``checkpointing.plan_resume``); a finished run returns its folder here;
3. build model, data and trainer (``build``: sets ``run.trainer``, ``run.tokenizer``, and the callbacks
   the checkpoints carry: ``run.budget`` and any in ``run.attach``);
4. train (``checkpointing.attach`` + ``checkpointing.train``: checkpoints, resume, progress, time budget);
5. save: ``finish`` (checks and measurements after training), the weights (``checkpointing.save_model``),
   the tokenizer, ``anchored_reasoning.json`` (``meta``) and ``train_summary.json`` (the shared fields
   plus ``summary``); then mark the run complete.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from anchored_reasoning.checkpoints import CHECKPOINT_META

logger = logging.getLogger(__name__)


@dataclass
class Run:
    """One run's state as it moves through the skeleton. ``recipe`` and ``config`` are made once, in step 1,
    and every later step reads these objects (no step re-resolves the recipe or rebuilds the config)."""

    recipe: dict[str, Any]
    config: Any
    output_dir: Path
    resume: Any = None  # checkpointing.ResumePlan
    trainer: Any = None
    tokenizer: Any = None
    budget: Any = None  # the TimeBudgetCallback (built in step 1 from config.max_train_seconds)
    attach: dict[str, Any] = field(default_factory=dict)  # more callbacks whose state checkpoints keep
    state: dict[str, Any] = field(default_factory=dict)  # the kind's own (examples, method, model, ...)
    train_seconds: float = 0.0
    run_state: Any = None


class Pipeline:
    """The hooks of one trainer kind. ``kind`` is its ``trainer:`` name."""

    kind = ""

    def resolve(self, recipe: Mapping[str, Any] | str, overrides: Sequence[str]) -> dict[str, Any]:
        from anchored_reasoning.train import recipes

        return recipes.resolve(recipe, overrides, trainer=self.kind)

    def output_dir(self, recipe: Mapping[str, Any]) -> Path:
        return Path(recipe.get("output_dir") or f"runs/{Path(str(recipe.get('_source', self.kind))).stem}")

    def configure(self, recipe: dict[str, Any], output_dir: Path) -> Any:
        """The trainer config (its ``training`` section), built once; bad values fail here."""
        raise NotImplementedError

    def prepare(self, run: Run) -> Mapping[str, Any]:
        """Load and check the data before the resume plan; return what the resume key adds (``_examples``)."""
        return {}

    def build(self, run: Run) -> None:
        raise NotImplementedError

    def finish(self, run: Run) -> dict[str, Any]:
        """Checks and measurements after training, before saving; returns summary fields."""
        return {}

    def meta(self, run: Run) -> dict[str, Any] | None:
        """``anchored_reasoning.json`` (None: none is written)."""
        return None

    def summary(self, run: Run) -> dict[str, Any]:
        return {}


def start(pipeline: Pipeline, recipe: Mapping[str, Any] | str, overrides: Sequence[str] = ()) -> Run:
    """Steps 1-2: the resolved recipe, the config, the data and the resume plan of a run."""
    from anchored_reasoning.train import checkpointing
    from anchored_reasoning.train.callbacks.curriculum import TimeBudgetCallback

    resolved = pipeline.resolve(recipe, overrides)  # unknown keys and bad values fail here, before any work
    output_dir = pipeline.output_dir(resolved)
    config = pipeline.configure(resolved, output_dir)
    run = Run(resolved, config, output_dir, budget=TimeBudgetCallback(config.max_train_seconds))
    checkpointing.check_run_config(output_dir, resolved)  # a rerun with other settings fails before data work
    key = pipeline.prepare(run)
    run.resume = checkpointing.plan_resume(output_dir, {**resolved, **key}, trainer=pipeline.kind)
    return run


def execute(pipeline: Pipeline, recipe: Mapping[str, Any] | str, overrides: Sequence[str] = ()) -> Path:
    """Train from a recipe (dict, name or path) with dotted overrides. Returns the checkpoint folder."""
    run = start(pipeline, recipe, overrides)
    if run.resume.finished:
        return run.output_dir
    return complete(pipeline, run)


def complete(pipeline: Pipeline, run: Run) -> Path:
    """Steps 3-5: build, train, save, mark complete."""
    from anchored_reasoning.train import checkpointing

    run.output_dir.mkdir(parents=True, exist_ok=True)
    pipeline.build(run)
    trainer, output_dir = run.trainer, run.output_dir
    run.run_state = checkpointing.attach(trainer, run.resume, budget=run.budget, **run.attach)
    t0 = time.monotonic()
    checkpointing.train(trainer, run.resume)
    run.train_seconds = time.monotonic() - t0
    extra = pipeline.finish(run)

    checkpointing.save_model(trainer, output_dir)
    if trainer.is_world_process_zero():
        run.tokenizer.save_pretrained(str(output_dir))
        meta = pipeline.meta(run)
        if meta is not None:
            (output_dir / CHECKPOINT_META).write_text(json.dumps(meta, indent=2) + "\n")
        summary = {
            "recipe": {k: v for k, v in run.recipe.items() if not str(k).startswith("_")},
            "recipe_source": run.recipe.get("_source"),
            "world_size": trainer.accelerator.num_processes,
            "global_steps": trainer.state.global_step,
            "train_seconds": round(run.train_seconds, 2),
            "train_seconds_all_sessions": round(run.run_state.seconds_spent(), 2),
            "resumed_from_step": run.resume.step,
            "session": run.resume.session,
            "stopped_by_time_budget": run.budget.stopped_early or bool(run.resume.saved.get("stopped")),
            **pipeline.summary(run),
            **extra,
            "log_history": trainer.state.log_history,
        }
        (output_dir / "train_summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    checkpointing.mark_complete(run.resume, trainer)
    trainer.accelerator.wait_for_everyone()
    logger.info("saved %s (%d steps, %.0fs)", output_dir, trainer.state.global_step, run.train_seconds)
    return output_dir


def parameters(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())
