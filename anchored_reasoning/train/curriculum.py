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

Stage schedules: ``epochs`` (Coconut: a stage every ``epochs_per_stage`` epochs, the last stage runs
to the end) or ``fraction`` (each non-final stage gets ``stage_fraction`` of the run, measured as the
larger of step progress and time progress, so it also works under ``max_train_seconds``).
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from transformers import TrainerCallback

from anchored_reasoning.types import Example

logger = logging.getLogger(__name__)


def stage_for(
    *,
    schedule: str,
    num_stages: int,
    epoch: float = 0.0,
    epochs_per_stage: float = 1.0,
    progress: float = 0.0,
    stage_fraction: float | None = None,
) -> int:
    """The curriculum stage at a point of training (see the module docstring)."""
    if num_stages <= 1:
        return 0
    if schedule == "epochs":
        raw = epoch / max(epochs_per_stage, 1e-9)
    else:
        frac = stage_fraction if stage_fraction else 0.5 / (num_stages - 1)
        raw = progress / frac
    # a small epsilon keeps float epochs like 0.9999999 from lagging a stage behind
    return int(min(max(math.floor(raw + 1e-9), 0), num_stages - 1))


@dataclass
class GenerationResult:
    accuracy: float
    mean_generated_tokens: float
    n: int
    samples: list[dict[str, Any]] = field(default_factory=list)


class GenerationEvaluator:
    """Greedy generation on a list of examples with the method's prompts, graded by ``grade``.

    ``grade(text, example) -> bool`` defaults to ``task.grade(text, example).correct``. Generation stops
    at the tokenizer's EOS (trained checkpoints end their answer with it). The prompt is tokenized
    the way the HF backend does (``tokenizer(text)``), left-padded.
    """

    def __init__(
        self,
        tokenizer,
        examples: Sequence[Example],
        *,
        task: Any = None,
        grade: Callable[[str, Example], bool] | None = None,
        max_new_tokens: int = 128,
        batch_size: int = 32,
        keep_samples: int = 5,
    ) -> None:
        if grade is None:
            if task is None or not hasattr(task, "grade"):
                raise ValueError("GenerationEvaluator needs a task with .grade or a grade function")
            grade = lambda text, ex: bool(task.grade(text, ex).correct)  # noqa: E731
        self.tokenizer = tokenizer
        self.examples = list(examples)
        self.task = task
        self.grade = grade
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.keep_samples = keep_samples

    @torch.no_grad()
    def evaluate(self, model, method) -> GenerationResult:
        tok = self.tokenizer
        was_training = model.training
        model.eval()
        eos = tok.eos_token_id
        pad = tok.pad_token_id if tok.pad_token_id is not None else eos
        device = next(model.parameters()).device
        correct = 0
        n_tokens = 0
        samples: list[dict[str, Any]] = []
        try:
            for start in range(0, len(self.examples), self.batch_size):
                batch = self.examples[start : start + self.batch_size]
                prompts = [method.prompt(ex, self.task).text for ex in batch]
                ids = [list(tok(p)["input_ids"]) for p in prompts]
                width = max(len(x) for x in ids)
                input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids], device=device)
                attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=device)
                out = model.generate(
                    input_ids=input_ids,
                    attention_mask=attention,
                    max_new_tokens=self.max_new_tokens,
                    do_sample=False,
                    eos_token_id=eos,
                    pad_token_id=pad,
                )
                for ex, prompt, row in zip(batch, prompts, out[:, width:].tolist()):
                    gen = []
                    for t in row:
                        if t == eos:
                            gen.append(t)  # EOS counts as a generated token, padding after it does not
                            break
                        gen.append(t)
                    text = tok.decode([t for t in gen if t != eos], skip_special_tokens=False)
                    ok = bool(self.grade(text, ex))
                    correct += ok
                    n_tokens += len(gen)
                    if len(samples) < self.keep_samples:
                        samples.append({"id": ex.id, "prompt": prompt, "completion": text, "correct": ok})
        finally:
            if was_training:
                model.train()
        n = len(self.examples)
        return GenerationResult(correct / max(n, 1), n_tokens / max(n, 1), n, samples)


class TimeBudgetCallback(TrainerCallback):
    """Stop training once ``seconds`` of wall time have passed since training began."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.start: float | None = None
        self.stopped_early = False

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return 0.0 if self.start is None else time.monotonic() - self.start

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
    """

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
        self.reset_optimizer = reset_optimizer
        self.max_train_seconds = max_train_seconds
        self.evaluator = evaluator
        self.eval_every_stage = eval_every_stage
        self.eval_steps = eval_steps
        self.keep_best = keep_best
        self.final_stage = self.num_stages - 1 if curriculum else self._own_stage()
        self.best_from_stage = self.final_stage if best_from_stage is None else best_from_stage
        self.stage = 0 if curriculum else self.final_stage
        self.history: list[dict[str, Any]] = []
        self.best: dict[str, Any] | None = None
        self._best_state: dict[str, torch.Tensor] | None = None
        self._start: float | None = None
        self.optimizer_resets = 0
        if curriculum:
            collator.set_stage(0)

    def _own_stage(self) -> int:
        stage = getattr(self.method, "stage", None)
        return int(stage) if stage is not None else 0

    def method_at(self, stage: int):
        if not self.curriculum or not hasattr(self.method, "with_stage"):
            return self.method
        return self.method.with_stage(stage)

    # -- schedule -----------------------------------------------------------------------------
    def _progress(self, state) -> float:
        steps = state.global_step / state.max_steps if state.max_steps and state.max_steps > 0 else 0.0
        elapsed = time.monotonic() - self._start if self._start is not None else 0.0
        timed = elapsed / self.max_train_seconds if self.max_train_seconds else 0.0
        return max(steps, timed)

    def target_stage(self, state) -> int:
        if not self.curriculum:
            return self.stage
        return stage_for(
            schedule=self.schedule,
            num_stages=self.num_stages,
            epoch=float(state.epoch or 0.0),
            epochs_per_stage=self.epochs_per_stage,
            progress=self._progress(state),
            stage_fraction=self.stage_fraction,
        )

    # -- evaluation ---------------------------------------------------------------------------
    def _evaluate(self, model, state, reason: str) -> dict[str, Any] | None:
        if self.evaluator is None or model is None:
            return None
        t0 = time.monotonic()
        result = self.evaluator.evaluate(model, self.method_at(self.stage))
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

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self._evaluate(model, state, "end of training")
        if self.keep_best and self._best_state is not None and model is not None:
            last = self.history[-1] if self.history and self.history[-1].get("event") == "eval" else None
            if last is None or self.best is None or last["step"] != self.best["step"]:
                model.load_state_dict(self._best_state)
                logger.info("restored the best validated weights (step %d, accuracy %.3f)", self.best["step"], self.best["accuracy"])
        return control
