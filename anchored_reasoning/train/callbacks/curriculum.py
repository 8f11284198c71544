"""Curriculum, time budget and validation-by-generation for the anchored trainers.

:class:`CurriculumCallback` walks the method's stages (``method.with_stage(s)``: ACoT adds one
``[ANT]`` slot per stage, stepwise / ProsQA-ACoT also drop one more reasoning step). At a switch it

1. evaluates the stage that ends (greedy generation on the validation split, graded by the task),
2. tells the collator to render later batches at the new stage (the dataset is never rebuilt;
   the one batch the data loader has already prefetched is re-rendered by the trainer when the
   collator keeps its rows, ``keep_rows=True``, as the ``ar`` trainer sets for curricula),
3. optionally clears the optimizer state (Coconut resets its optimizer at every stage).

The best validated weights (among evaluations from ``best_from_stage`` on, by default the final
stage only: earlier stages train a different format) are kept in memory and restored at the end.

The stage plan (:func:`~anchored_reasoning.train.callbacks.stage_plan.plan_curriculum`: ``epochs`` or
``fraction`` schedules, as shares of the run, with a floor of steps per stage checked before training)
is fixed when training begins. Progress is the larger of step progress and time progress
(``max_train_seconds``), so both work under a time budget.

Validation (:class:`~anchored_reasoning.train.callbacks.validation.GenerationEvaluator`) generates through
the evaluation path: the same prompts, stop strings, decoding and grading as ``anchored-reasoning eval``.
"""
from __future__ import annotations

import logging
import time
from typing import Any

import torch
from transformers import TrainerCallback

from anchored_reasoning.train.callbacks.stage_plan import (
    SCHEDULES,
    StagePlan,
    curriculum_plan_for,
    plan_curriculum,
    planned_steps,
)
from anchored_reasoning.train.callbacks.validation import GenerationEvaluator, GenerationResult

__all__ = [
    "CurriculumCallback", "GenerationEvaluator", "GenerationResult", "StagePlan", "TimeBudgetCallback",
    "SCHEDULES", "curriculum_plan_for", "plan_curriculum", "planned_steps",
]

logger = logging.getLogger(__name__)


class TimeBudgetCallback(TrainerCallback):
    """Stop training once ``seconds`` of wall time have passed since training began."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.start: float | None = None
        self.stopped_early = False
        self.spent_before = 0.0  # wall time of earlier sessions of a resumed run (train/checkpointing.py)

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return self.spent_before + (0.0 if self.start is None else time.monotonic() - self.start)

    def on_step_end(self, args, state, control, **kwargs):
        if self.seconds is not None and self.elapsed() >= self.seconds:
            if not control.should_training_stop:
                logger.info("time budget of %.0f s reached at step %d", self.seconds, state.global_step)
            self.stopped_early = True
            control.should_training_stop = True
        return control


class CurriculumCallback(TrainerCallback):
    """Moves the collator through the method's stages, evaluates, keeps the best weights.

    ``collator`` needs ``set_stage(int)``; ``method`` is the method at its final stage (its
    ``num_stages`` and ``with_stage``). ``evaluator`` may be None (no validation, no best checkpoint).
    ``history`` records every evaluation and stage switch (written to the run's output folder).
    The stage plan (:func:`plan_curriculum`) is fixed at the start of training from the run's step
    count (``state.max_steps``); ``schedule_epochs`` defaults to ``args.num_train_epochs``.
    """

    @classmethod
    def from_config(cls, collator, method, config, evaluator: GenerationEvaluator | None = None) -> "CurriculumCallback":
        """The callback as an :class:`~anchored_reasoning.train.trainers.acot_trainer.AnchoredSFTConfig` sets it (its
        ``curriculum*``, ``*_stage``, ``generation_eval_*``, ``keep_best`` and ``max_train_seconds`` fields)."""
        return cls(
            collator, method, curriculum=config.curriculum, schedule=config.curriculum_schedule,
            epochs_per_stage=config.epochs_per_stage, stage_fraction=config.stage_fraction,
            num_stages=config.num_stages, schedule_epochs=config.curriculum_epochs,
            first_stage=config.curriculum_first_stage, min_steps_per_stage=config.curriculum_min_steps_per_stage,
            reset_optimizer=config.reset_optimizer_on_stage, max_train_seconds=config.max_train_seconds,
            evaluator=evaluator, eval_every_stage=config.generation_eval_every_stage,
            eval_steps=config.generation_eval_steps, keep_best=config.keep_best, best_from_stage=config.best_from_stage)

    def __init__(
        self,
        collator,
        method,
        *,
        curriculum: bool = True,
        schedule: str = "epochs",
        epochs_per_stage: float = 5.0,
        stage_fraction: float | None = None,
        num_stages: int | None = None,
        schedule_epochs: float | None = None,
        first_stage: int = 0,
        min_steps_per_stage: int = 0,
        reset_optimizer: bool = True,
        max_train_seconds: float | None = None,
        evaluator: GenerationEvaluator | None = None,
        eval_every_stage: bool = True,
        eval_steps: int | None = None,
        keep_best: bool = True,
        best_from_stage: int | None = None,
    ) -> None:
        self.collator = collator
        self.method = method
        self.curriculum = curriculum
        self.schedule = schedule
        self.epochs_per_stage = epochs_per_stage
        self.stage_fraction = stage_fraction
        method_stages = int(getattr(method, "num_stages", 1) or 1)
        self.num_stages = min(num_stages, method_stages) if num_stages else method_stages
        self.schedule_epochs = schedule_epochs
        self.first_stage = int(first_stage) if curriculum else 0
        self.min_steps_per_stage = int(min_steps_per_stage or 0)
        self.plan: StagePlan | None = None
        if curriculum:  # bad settings fail now, before any training; the step floor is checked at train begin
            self.make_plan(None, schedule_epochs if schedule_epochs is not None else 1e9 if schedule == "epochs" else None)
        self.reset_optimizer = reset_optimizer
        self.max_train_seconds = max_train_seconds
        self.evaluator = evaluator
        self.eval_every_stage = eval_every_stage
        self.eval_steps = eval_steps
        self.keep_best = keep_best
        self.final_stage = self.num_stages - 1 if curriculum else self._own_stage()
        self.best_from_stage = self.final_stage if best_from_stage is None else best_from_stage
        self.stage = self.first_stage if curriculum else self.final_stage
        self.history: list[dict[str, Any]] = []
        self.best: dict[str, Any] | None = None
        self._best_state: dict[str, torch.Tensor] | None = None
        self._start: float | None = None
        self._spent_before = 0.0  # wall time of earlier sessions of a resumed run
        self.optimizer_resets = 0
        if curriculum:
            collator.set_stage(self.stage)

    def _own_stage(self) -> int:
        stage = getattr(self.method, "stage", None)
        return int(stage) if stage is not None else 0

    def method_at(self, stage: int):
        if not self.curriculum or not hasattr(self.method, "with_stage"):
            return self.method
        return self.method.with_stage(stage)

    # -- resume (train/checkpointing.py stores export_state() in every checkpoint) --------------
    def export_state(self) -> dict[str, Any]:
        return {"stage": self.stage, "history": self.history, "best": self.best, "optimizer_resets": self.optimizer_resets}

    def restore_state(self, saved: dict[str, Any], *, seconds_spent: float = 0.0, best_weights=None) -> None:
        """Continue a resumed run where its checkpoint was saved: stage (the collator renders it from
        the first resumed step), history, best record and weights, and the time already spent."""
        self.stage = int(saved.get("stage", self.stage))
        self.history = list(saved.get("history") or [])
        self.best = saved.get("best")
        self._best_state = best_weights
        self.optimizer_resets = int(saved.get("optimizer_resets", 0))
        self._spent_before = float(seconds_spent)
        if self.curriculum:
            self.collator.set_stage(self.stage)

    # -- schedule -----------------------------------------------------------------------------
    def _progress(self, state) -> float:
        steps = state.global_step / state.max_steps if state.max_steps and state.max_steps > 0 else 0.0
        elapsed = self._spent_before + (time.monotonic() - self._start if self._start is not None else 0.0)
        timed = elapsed / self.max_train_seconds if self.max_train_seconds else 0.0
        return max(steps, timed)

    def make_plan(self, total_steps: int | None, schedule_epochs: float | None) -> StagePlan:
        """The stage plan for a run of ``total_steps`` optimizer steps (see :func:`plan_curriculum`)."""
        return plan_curriculum(
            num_stages=self.num_stages,
            schedule=self.schedule,
            epochs_per_stage=self.epochs_per_stage,
            schedule_epochs=schedule_epochs,
            stage_fraction=self.stage_fraction,
            first_stage=self.first_stage,
            total_steps=total_steps,
            min_steps_per_stage=self.min_steps_per_stage,
        )

    def target_stage(self, state) -> int:
        if not self.curriculum or self.plan is None:
            return self.stage
        return self.plan.stage_at(self._progress(state))

    # -- evaluation ---------------------------------------------------------------------------
    def _evaluate(self, model, state, reason: str) -> dict[str, Any] | None:
        if self.evaluator is None or model is None:
            return None
        t0 = time.monotonic()
        result = self.evaluator.evaluate(model, self.method_at(self.stage), name=f"step-{state.global_step:07d}")
        record = {
            "event": "eval",
            "reason": reason,
            "step": state.global_step,
            "epoch": state.epoch,
            "stage": self.stage,
            "accuracy": result.accuracy,
            "mean_generated_tokens": result.mean_generated_tokens,
            "n": result.n,
            "seconds": round(time.monotonic() - t0, 3),
            "samples": result.samples,
        }
        self.history.append(record)
        logger.info(
            "validation at step %d (stage %d, %s): accuracy %.3f, %.1f generated tokens",
            state.global_step, self.stage, reason, result.accuracy, result.mean_generated_tokens,
        )
        if self.keep_best and self.stage >= self.best_from_stage:
            if self.best is None or result.accuracy > self.best["accuracy"]:
                self.best = {k: v for k, v in record.items() if k != "samples"}
                self._best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        return record

    # -- hooks --------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        self._start = time.monotonic()
        if self.curriculum:
            epochs = self.schedule_epochs if self.schedule_epochs is not None else float(args.num_train_epochs)
            # a time budget may end the run sooner; the step count is still an upper bound to check
            total = int(state.max_steps) if state.max_steps and state.max_steps > 0 else None
            self.plan = self.make_plan(total, epochs)
            steps = self.plan.steps
            logger.info(
                "curriculum: stages %s, ending at %s of the run%s", list(self.plan.stages),
                ", ".join(f"{e:.3f}" for e in self.plan.ends),
                f" (steps per stage {steps})" if steps else "",
            )
        if not any(h.get("event") == "stage" for h in self.history):
            self.history.append({"event": "stage", "step": state.global_step, "stage": self.stage})

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        new_stage = self.target_stage(state)
        if new_stage != self.stage:
            if self.eval_every_stage:
                self._evaluate(model, state, f"end of stage {self.stage}")
            logger.info("curriculum: stage %d -> %d at step %d (epoch %.2f)", self.stage, new_stage, state.global_step, state.epoch or 0)
            self.stage = new_stage
            self.collator.set_stage(new_stage)
            self.history.append({"event": "stage", "step": state.global_step, "stage": new_stage})
            if self.reset_optimizer and optimizer is not None:
                inner = getattr(optimizer, "optimizer", optimizer)
                inner.state.clear()
                self.optimizer_resets += 1
        elif self.eval_steps and state.global_step % self.eval_steps == 0:
            self._evaluate(model, state, f"every {self.eval_steps} steps")
        return control

    def stage_steps(self, final_step: int) -> dict[int, int]:
        """Optimizer steps trained at each stage, from the history's stage switches."""
        switches = [(h["step"], h["stage"]) for h in self.history if h.get("event") == "stage"]
        out: dict[int, int] = {}
        for (step, stage), nxt in zip(switches, [s for s, _ in switches[1:]] + [final_step]):
            out[stage] = out.get(stage, 0) + max(nxt - step, 0)
        return out

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self.curriculum and self.min_steps_per_stage:
            short = {s: n for s, n in self.stage_steps(state.global_step).items() if n < self.min_steps_per_stage}
            if short:  # only a time budget gets here (a known step count was checked at the start)
                logger.warning(
                    "curriculum: stage(s) %s trained fewer steps than the floor of %d (%s); the time budget was too short",
                    sorted(short), self.min_steps_per_stage, short,
                )
        latest = next((h for h in reversed(self.history) if h.get("event") in ("eval", "stage")), None)
        if not (latest and latest["event"] == "eval" and latest["step"] == state.global_step):  # else just graded
            self._evaluate(model, state, "end of training")
        if self.keep_best and self._best_state is not None and model is not None:
            last = self.history[-1] if self.history and self.history[-1].get("event") == "eval" else None
            if last is None or self.best is None or last["step"] != self.best["step"]:
                model.load_state_dict(self._best_state)
                logger.info("restored the best validated weights (step %d, accuracy %.3f)", self.best["step"], self.best["accuracy"])
        return control
