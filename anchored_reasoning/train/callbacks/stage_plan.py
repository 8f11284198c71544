"""Curriculum stage plans: which method stage each part of a training run trains, and whether it fits.

A plan (:func:`plan_curriculum`) gives each stage a share of the run:

* ``epochs`` -- the paper's schedule, scaled to the run: every stage but the last lasts
  ``epochs_per_stage`` epochs of a ``schedule_epochs``-epoch schedule (Coconut on ProsQA /
  ProntoQA: 5 of 50; the ADLM paper on GSM8K: 3 of 25, from stage 1), the last stage the rest.
  A run of exactly ``schedule_epochs`` epochs switches at those epochs; a shorter (or longer) run
  gives each stage the same share of its optimizer steps;
* ``fraction`` -- each non-final stage gets ``stage_fraction`` of the run (default: the curriculum
  takes half of it).

When the run's step count is known (:func:`planned_steps` counts it as ``Trainer`` will), every stage
must get at least ``min_steps_per_stage`` optimizer steps, else the plan is refused
(:class:`ConfigError`) with the numbers, before training starts (:func:`curriculum_plan_for`).
Pure arithmetic: the callback that walks a plan during training is
:class:`~anchored_reasoning.train.callbacks.curriculum.CurriculumCallback`, which re-exports these names.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from anchored_reasoning.errors import ConfigError

__all__ = ["SCHEDULES", "StagePlan", "curriculum_plan_for", "plan_curriculum", "planned_steps"]

SCHEDULES = ("epochs", "fraction")


@dataclass(frozen=True)
class StagePlan:
    """The stages a run walks (``stages``, in order) and where each ends, as a share of the run
    (``ends``; the last is 1.0). ``steps`` are the optimizer steps of each stage when the run's
    step count is known."""

    stages: tuple[int, ...]
    ends: tuple[float, ...]
    total_steps: int | None = None

    def stage_at(self, progress: float) -> int:
        """The stage at ``progress`` (0..1) of the run."""
        for stage, end in zip(self.stages, self.ends[:-1]):
            if progress < end - 1e-9:  # the epsilon keeps 0.19999999 of a 0.2 boundary from lagging
                return stage
        return self.stages[-1]

    @property
    def steps(self) -> list[int] | None:
        if self.total_steps is None:
            return None
        return _stage_steps(self.ends, self.total_steps)


def _stage_steps(ends: Sequence[float], total: int) -> list[int]:
    bounds = [0] + [int(math.ceil(e * total - 1e-9)) for e in ends[:-1]] + [total]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def plan_curriculum(
    *,
    num_stages: int,
    schedule: str = "epochs",
    epochs_per_stage: float = 5.0,
    schedule_epochs: float | None = None,
    stage_fraction: float | None = None,
    first_stage: int = 0,
    total_steps: int | None = None,
    min_steps_per_stage: int = 0,
) -> StagePlan:
    """The stage plan of a run (see the module docstring). Raises :class:`ConfigError` when the
    stages do not fit the schedule, or when ``total_steps`` cannot give every stage
    ``min_steps_per_stage`` steps (the message names the steps, the stages and the floor)."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"curriculum_schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if not 0 <= first_stage < max(num_stages, 1):
        raise ConfigError(f"curriculum_first_stage={first_stage} is outside the method's stages 0..{num_stages - 1}")
    stages = tuple(range(first_stage, max(num_stages, 1)))
    n = len(stages)
    if n == 1:
        ends: tuple[float, ...] = (1.0,)
    elif schedule == "epochs":
        total = float(schedule_epochs or 0)
        if epochs_per_stage <= 0 or total <= 0:
            raise ConfigError(
                f"curriculum: epochs_per_stage={epochs_per_stage} and the schedule's length "
                f"({total} epochs: training.curriculum_epochs, else num_train_epochs) must be > 0"
            )
        if (n - 1) * epochs_per_stage >= total:
            raise ConfigError(
                f"curriculum: {n - 1} stages of {epochs_per_stage:g} epochs before the last leave no room for it "
                f"in a {total:g}-epoch schedule; set training.curriculum_epochs (the paper's length: 50 for "
                "ProsQA/ProntoQA, 25 for GSM8K) or fewer stages (training.num_stages)"
            )
        ends = tuple((i + 1) * epochs_per_stage / total for i in range(n - 1)) + (1.0,)
    else:
        frac = stage_fraction if stage_fraction else 0.5 / (n - 1)
        if not 0 < frac or (n - 1) * frac >= 1:
            raise ConfigError(f"curriculum: stage_fraction={frac:g} for {n - 1} stages before the last leaves it no room")
        ends = tuple((i + 1) * frac for i in range(n - 1)) + (1.0,)
    plan = StagePlan(stages, ends, total_steps)
    if total_steps is not None and min_steps_per_stage > 0:
        steps = plan.steps or []
        if min(steps) < min_steps_per_stage:
            need = total_steps
            while min(_stage_steps(ends, need)) < min_steps_per_stage:
                need = max(need + 1, int(need * 1.01))
            raise ConfigError(
                f"the curriculum does not fit the run: {total_steps} optimizer steps for {n} stages "
                f"(stages {stages[0]}..{stages[-1]}, {schedule} schedule) give the shortest stage {min(steps)} steps, "
                f"below the floor of {min_steps_per_stage} steps per stage (training.curriculum_min_steps_per_stage). "
                f"It needs about {need} steps: raise training.max_steps / num_train_epochs, lower the floor, "
                "or use fewer stages (training.num_stages)"
            )
    return plan


def planned_steps(args, num_examples: int) -> int:
    """The optimizer steps a ``Trainer`` with ``args`` will run on ``num_examples`` examples
    (``max_steps`` when set, else epochs x steps per epoch as ``Trainer`` counts them)."""
    if args.max_steps and args.max_steps > 0:
        return int(args.max_steps)
    world = max(int(getattr(args, "world_size", 1) or 1), 1)
    per_batch = args.per_device_train_batch_size * world
    batches = num_examples // per_batch if args.dataloader_drop_last else -(-num_examples // per_batch)
    accum = args.gradient_accumulation_steps
    per_epoch = max(batches // accum + int(batches % accum > 0), 1)
    return int(math.ceil(args.num_train_epochs * per_epoch))


def curriculum_plan_for(args, method, num_examples: int) -> StagePlan:
    """The stage plan of a run with ``args`` (an ``AnchoredSFTConfig``) on ``num_examples``
    examples, checked as :class:`CurriculumCallback` will check it at train begin: call it before
    building anything to refuse a curriculum that does not fit the budget."""
    method_stages = int(getattr(method, "num_stages", 1) or 1)
    stages = min(args.num_stages, method_stages) if args.num_stages else method_stages
    return plan_curriculum(
        num_stages=stages,
        schedule=args.curriculum_schedule,
        epochs_per_stage=args.epochs_per_stage,
        schedule_epochs=args.curriculum_epochs if args.curriculum_epochs is not None else float(args.num_train_epochs),
        stage_fraction=args.stage_fraction,
        first_stage=args.curriculum_first_stage,
        total_steps=planned_steps(args, num_examples),
        min_steps_per_stage=args.curriculum_min_steps_per_stage,
    )
