"""Checkpoints along the way, and resuming a run by rerunning its command. Shared by every trainer.

The file-level checks of a checkpoint live in train/checkpoint_files.py; the run's recorded recipe
(``run_config.json``: comparing a rerun with it, extending a run, the save defaults) in
train/run_config.py. This module re-exports the names of both that trainers use.

The checkpoints are the transformers Trainer's own ``<output_dir>/checkpoint-<step>`` folders (model,
optimizer, scheduler, RNG, ``trainer_state.json``), written by ``save_strategy: steps`` every
``save_steps`` steps, plus (this module) every ``save_every_minutes`` of wall time, when a time budget
or another callback stops the run, and at each new best validation of the curriculum. The Trainer's
``save_total_limit`` keeps the newest few; ``state.best_model_checkpoint`` is never rotated away.
What the Trainer does not hold (the curriculum's stage, history and best record; the wall time of
earlier sessions) rides in ``trainer_state.json`` through :class:`RunState` (an ``ExportableState``).

A trainer's ``run`` uses it in four calls (the ``ar``, ``diffusion`` and ``tadm`` trainers do; a new
trainer such as GRPO should too)::

    training = with_save_defaults(recipe["training"])          # in make_config
    plan = plan_resume(output_dir, recipe)                      # before any data or model work
    if plan.finished: return output_dir                         # a finished run: nothing to do
    ...build model, data, callbacks (TimeBudgetCallback, CurriculumCallback)...
    trainer = SomeTrainer(..., callbacks=[budget, curriculum])
    state = attach(trainer, plan, budget=budget, curriculum=curriculum)   # + progress bar, JSONL log
    train(trainer, plan)                                        # resumes from plan.checkpoint
    ...save the final model...
    mark_complete(plan, trainer)

:func:`plan_resume` writes the resolved recipe to ``<output_dir>/run_config.json``; a rerun whose
recipe differs (outside :data:`VOLATILE_KEYS`) is refused with a :class:`ResumeError` naming each key
(:func:`~anchored_reasoning.train.run_config.check_run_config`). The newest checkpoint is
checked before use (:func:`~anchored_reasoning.train.checkpoint_files.checkpoint_problem`): one cut short by a kill during its save is moved
aside to ``incomplete-checkpoint-<step>`` (never deleted) with a warning, and the previous one is
used. Checkpoints that an earlier session saved but that are all gone or broken are an error, never
a silent restart from step 0. See docs/checkpoints.md.
"""
from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from anchored_reasoning.errors import ResumeError
from anchored_reasoning.train.checkpoint_files import (  # noqa: F401 - part of this module's API
    TRAINER_STATE,
    checkpoint_problem,
    list_checkpoints,
    newest_good_checkpoint,
)
from anchored_reasoning.train.run_config import (  # noqa: F401 - part of this module's API
    RUN_CONFIG,
    SAVE_DEFAULTS,
    STEP_FREE_SCHEDULES,
    VOLATILE_KEYS,
    check_run_config,
    examples_fingerprint,
    extension_problem,
    identity,
    update_run_config,
    utc_now,
    with_save_defaults,
    write_run_config,
)

logger = logging.getLogger(__name__)


def _is_main() -> bool:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) or 0) == 0


# ---------------------------------------------------------------------------------------------
# the plan: same recipe? from where?

@dataclass
class ResumePlan:
    """What :func:`plan_resume` found in the output folder."""

    output_dir: Path
    recipe: dict[str, Any]
    checkpoint: Path | None = None  # resume from here; None: start at step 0
    step: int = 0
    saved: dict[str, Any] = field(default_factory=dict)  # RunState attributes stored in the checkpoint
    best_checkpoint: Path | None = None
    complete: bool = False  # the checkpoint is the end of training (max_steps or time budget reached)
    finished: bool = False  # ... and the final model was written: nothing left to do
    session: int = 1
    run_config: dict[str, Any] = field(default_factory=dict)  # written by train() when training starts

    @property
    def seconds_spent(self) -> float:
        return float(self.saved.get("seconds_spent", 0.0))

    @property
    def tokenizer_dir(self) -> Path | None:
        """The checkpoint, when it holds the run's tokenizer (reuse it rather than train a new one)."""
        if self.checkpoint is not None and (self.checkpoint / "tokenizer_config.json").is_file():
            return self.checkpoint
        return None


def plan_resume(output_dir: str | os.PathLike, recipe: Mapping[str, Any], *, trainer: str) -> ResumePlan:
    """Check ``output_dir`` against ``recipe`` and choose the checkpoint to resume from.

    Refuses (:class:`ResumeError`) a recipe that differs from the one in ``run_config.json``, a folder
    with checkpoints but no ``run_config.json``, and a run whose saved checkpoints are all gone or
    broken. The session is recorded in ``run_config.json`` by :func:`train`, once training starts."""
    out = Path(output_dir)
    recipe = json.loads(json.dumps({k: v for k, v in recipe.items() if not str(k).startswith("_") or k == "_examples"},
                                   default=str))
    old = check_run_config(out, recipe)

    asked = (recipe.get("training") or {}).get("resume_from_checkpoint")
    if asked is True or str(asked).lower() in ("true", "last"):
        asked = None  # the newest checkpoint, which is what a rerun takes anyway
    if asked:
        checkpoint, skipped = Path(str(asked)), []
        if not checkpoint.is_dir():
            raise ResumeError(f"training.resume_from_checkpoint={asked!r}: no such checkpoint folder")
        problem = checkpoint_problem(checkpoint)
        if problem:
            raise ResumeError(f"training.resume_from_checkpoint={asked!r} cannot be resumed from: {problem}")
    else:
        checkpoint, skipped = newest_good_checkpoint(out, move_aside=_is_main())
    for line in skipped:
        logger.warning("checkpoint %s; falling back to an earlier one", line)
    saved_step = int((old or {}).get("last_checkpoint_step") or 0)
    completed = (old or {}).get("completed_step")
    extending = bool(old and (old.get("recipe") or {}).get("training", {}).get("max_steps")
                     != (recipe.get("training") or {}).get("max_steps"))
    if checkpoint is None and extending:
        raise ResumeError(f"{out}: cannot extend this run (training.extend_max_steps): no checkpoint is left to "
                          "continue from (the final model alone has no optimizer state)")
    if checkpoint is None and completed is not None and (out / "config.json").is_file():
        logger.info("%s: training finished at step %s (its checkpoints are gone, the final model is there); "
                    "nothing to do", out, completed)
        return ResumePlan(out, recipe, step=int(completed), complete=True, finished=True)
    if checkpoint is None and saved_step > 0:
        raise ResumeError(
            f"{out}: an earlier session saved checkpoint-{saved_step}, but no usable checkpoint is left"
            + (f" ({'; '.join(skipped)})" if skipped else " (the folders are gone)")
            + ". Restore them, or give a new output_dir to start over.")

    sessions = list((old or {}).get("sessions", []))
    plan = ResumePlan(out, recipe, session=len(sessions) + 1)
    if checkpoint is not None:
        state = json.loads((checkpoint / TRAINER_STATE).read_text())
        plan.checkpoint, plan.step = checkpoint, int(state["global_step"])
        plan.saved = dict(((state.get("stateful_callbacks") or {}).get("RunState") or {}).get("attributes") or {})
        best = state.get("best_model_checkpoint")
        plan.best_checkpoint = Path(best) if best and Path(best).is_dir() else None
        budget = (recipe.get("training") or {}).get("max_train_seconds")
        asked_steps = (recipe.get("training") or {}).get("max_steps")  # larger than the state's when extended
        target = asked_steps if isinstance(asked_steps, int) and asked_steps > 0 else int(state.get("max_steps") or 0)
        plan.complete = bool(plan.step >= target > 0
                             or (budget and plan.seconds_spent >= float(budget)) or plan.saved.get("stopped"))
        plan.finished = plan.complete and bool((old or {}).get("completed_step") == plan.step)
    if plan.finished:
        logger.info("%s: training finished at step %d; nothing to do (use a new output_dir to train again)",
                    out, plan.step)
        return plan
    if old is not None and checkpoint is None:
        logger.warning("%s: the earlier session saved no checkpoint; training starts at step 0", out)
    sessions.append({"session": plan.session, "started": utc_now(), "resumed_from_step": plan.step,
                     **({"extended_from_max_steps": old["recipe"]["training"]["max_steps"]} if extending else {})})
    plan.run_config = {**(old or {}), "trainer": trainer, "recipe": recipe, "sessions": sessions,
                       "created": (old or {}).get("created", utc_now())}
    return plan


# ---------------------------------------------------------------------------------------------
# the callback that carries our state in trainer_state.json

class RunState(TrainerCallback, ExportableState):
    """Saves by wall time and at new best validations, and stores the curriculum and the wall time
    spent in every checkpoint's ``trainer_state.json`` (``stateful_callbacks.RunState``).

    Put it after the budget and curriculum callbacks (:func:`attach` does)."""

    def __init__(self, plan: ResumePlan | None = None, *, budget=None, curriculum=None,
                 save_every_minutes: float | None = None) -> None:
        self.plan = plan
        self.budget = budget
        self.curriculum = curriculum
        self.save_every_minutes = save_every_minutes
        self.spent_before = plan.seconds_spent if plan is not None else 0.0
        self._start: float | None = None
        self._last_save = time.monotonic()
        self._best_step_marked: int | None = None
        self.stopped = False

    def seconds_spent(self) -> float:
        return self.spent_before + (time.monotonic() - self._start if self._start is not None else 0.0)

    def state(self) -> dict[str, Any]:
        attributes: dict[str, Any] = {"seconds_spent": round(self.seconds_spent(), 3), "stopped": self.stopped}
        if self.curriculum is not None:
            attributes["curriculum"] = self.curriculum.export_state()
        return {"args": {}, "attributes": attributes}

    def on_train_begin(self, args, state, control, **kwargs):
        self._start = self._last_save = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        saving = args.save_strategy != "no"
        best = getattr(self.curriculum, "best", None)
        if best is not None and best.get("step") == state.global_step and self._best_step_marked != state.global_step:
            # a new best validation: keep its checkpoint (Trainer never rotates best_model_checkpoint away)
            self._best_step_marked = state.global_step
            state.best_global_step, state.best_metric = state.global_step, float(best["accuracy"])
            control.should_save = control.should_save or saving
        if self.save_every_minutes and time.monotonic() - self._last_save >= 60.0 * float(self.save_every_minutes):
            control.should_save = control.should_save or saving
        if control.should_training_stop and state.global_step < state.max_steps:
            self.stopped = True  # a time budget (or another callback) ended the run: save where it ended
            control.should_save = control.should_save or saving
        return control

    def on_save(self, args, state, control, **kwargs):
        self._last_save = time.monotonic()
        if state.is_world_process_zero and self.plan is not None:
            update_run_config(self.plan.output_dir, last_checkpoint_step=state.global_step)
        return control


def _best_weights(model, folder: Path) -> dict[str, Any] | None:
    try:
        loaded = type(model).from_pretrained(str(folder), dtype=next(model.parameters()).dtype)
    except Exception as exc:  # noqa: BLE001 - a broken best checkpoint must not stop the resume
        logger.warning("could not read the best checkpoint %s (%s); the final weights will be kept", folder, exc)
        return None
    return {k: v.detach().to("cpu", copy=True) for k, v in loaded.state_dict().items()}


def attach(trainer, plan: ResumePlan, *, budget=None, curriculum=None, quiet: bool | None = None) -> RunState:
    """Add :class:`RunState` and the progress bar / JSONL log (:mod:`anchored_reasoning.train.callbacks.progress`)
    to ``trainer`` and restore what ``plan`` carried over: the time spent (``budget.spent_before``) and
    the curriculum's stage, history and best weights."""
    from anchored_reasoning.train.callbacks.progress import install_progress

    if trainer.args.restore_callback_states_from_checkpoint:
        from anchored_reasoning.errors import ConfigError

        # Trainer would rebuild each stateful callback from its saved args, cutting RunState loose from
        # the curriculum and the budget; this module restores them itself.
        raise ConfigError("training.restore_callback_states_from_checkpoint is not supported: resuming restores "
                          "the callbacks' state already (train/checkpointing.py); leave it false")
    run_state = RunState(plan, budget=budget, curriculum=curriculum,
                         save_every_minutes=getattr(trainer.args, "save_every_minutes", None))
    if trainer.args.save_strategy == "no":
        logger.warning("training.save_strategy is 'no': this run saves no checkpoints, so a rerun starts over")
    if budget is not None:
        budget.spent_before = plan.seconds_spent
    saved_curriculum = plan.saved.get("curriculum")
    if curriculum is not None and saved_curriculum:
        best_weights = None
        if saved_curriculum.get("best") and plan.best_checkpoint is not None:
            best_weights = _best_weights(trainer.accelerator.unwrap_model(trainer.model), plan.best_checkpoint)
        if saved_curriculum.get("best") and best_weights is None:
            logger.warning("the best validated checkpoint (step %s) is gone; the best record starts over",
                           saved_curriculum["best"].get("step"))
            saved_curriculum = {**saved_curriculum, "best": None}
        curriculum.restore_state(saved_curriculum, seconds_spent=plan.seconds_spent, best_weights=best_weights)
    trainer.add_callback(run_state)
    install_progress(trainer, plan.output_dir, budget_seconds=getattr(budget, "seconds", None),
                     clock=run_state.seconds_spent, quiet=quiet, session=plan.session)
    return run_state


def train(trainer, plan: ResumePlan) -> None:
    """``trainer.train()``, resuming from ``plan.checkpoint``. A checkpoint that already is the end of
    training (the final model was not written yet) is loaded and finished without another step."""
    from anchored_reasoning.train.callbacks.progress import console_logging

    if trainer.is_world_process_zero() and plan.run_config:
        plan.output_dir.mkdir(parents=True, exist_ok=True)
        write_run_config(plan.output_dir, plan.run_config)
    with console_logging(plan.output_dir):
        if plan.checkpoint is None:
            trainer.train()
            return
        spent = plan.seconds_spent
        logger.info("resuming from %s (step %d, %s of training already spent)", plan.checkpoint.name, plan.step,
                    f"{spent / 60:.1f} min" if spent >= 60 else f"{spent:.0f} s")
        model = trainer.accelerator.unwrap_model(trainer.model)
        tied = set(getattr(model, "all_tied_weights_keys", None) or getattr(model, "_tied_weights_keys", None) or ())
        quiet_tied = _TiedKeysNotice(tied)
        trainer_logger = logging.getLogger("transformers.trainer")
        trainer_logger.addFilter(quiet_tied)
        try:
            if not plan.complete:
                trainer.train(resume_from_checkpoint=str(plan.checkpoint))
                return
            from transformers.trainer_callback import TrainerState

            trainer._load_from_checkpoint(str(plan.checkpoint))  # transformers' own loader (pinned in pyproject)
            trainer.state = TrainerState.load_from_json(str(plan.checkpoint / TRAINER_STATE))
            trainer.callback_handler.on_train_end(trainer.args, trainer.state, trainer.control)
        finally:
            trainer_logger.removeFilter(quiet_tied)


class _TiedKeysNotice(logging.Filter):
    """transformers 5 warns that a resumed checkpoint misses ``lm_head.weight`` when it is tied to the
    embeddings (saved once, as the embeddings): drop that warning when every key named is tied."""

    def __init__(self, tied: set[str]) -> None:
        super().__init__()
        self.tied = tied

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        if not msg.startswith("There were missing keys in the checkpoint model loaded"):
            return True
        named = set(re.findall(r"'([^']+)'", msg))
        return not (named and named <= self.tied)


def save_model(trainer, output_dir: str | os.PathLike) -> None:
    """``trainer.save_model(output_dir)`` (the final model) without transformers' one-line shard bar."""
    from anchored_reasoning.train.callbacks.progress import no_transformers_bars

    with no_transformers_bars():
        trainer.save_model(str(output_dir))


def mark_complete(plan: ResumePlan, trainer) -> None:
    """Record in ``run_config.json`` that the final model of this run is written."""
    if trainer.is_world_process_zero():
        update_run_config(plan.output_dir, completed_step=trainer.state.global_step, completed=utc_now())
