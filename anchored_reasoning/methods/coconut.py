"""Coconut (Hao et al. 2024, "Training Large Language Models to Reason in a Continuous Latent Space"):
continuous thoughts between ``<bot>`` and ``<eot>``, a stage curriculum that trades reasoning steps for them.

The layout, in the library's trained format (``methods/anchored.py``)::

    prompt = question "\\n" "<bot>" "<thought>" x (n * c) "<eot>" "[BoR]"
    target = the steps left, joined, "[EoR]" "\\n" answer line          (+ EOS by the trainer)

At curriculum stage ``s`` (``0 .. max_latent_stage + 1``) the first ``s`` reasoning steps are replaced by
``n = s`` groups of ``c`` thoughts; the stage after ``max_latent_stage`` drops every step and keeps
``max_latent_stage`` groups -- or, without ``pad_latent_to_max`` (Coconut's ProsQA setting has it on), as
many as the trace has steps, up to ``max_latent_stage``.
Stage 0 is CoT with an empty ``<bot><eot>`` pair.

A ``<thought>`` token is a placeholder: the trainer (``train/trainers/coconut_trainer.py``) and the HF
backend (``sampling/latent.py``) replace its input embedding by the last hidden state of the position
before it, one forward pass per thought, so a thought is the model's own continuous state fed back.

Ablations (Coconut's table 1):

* ``thought="pause"`` -- "pause as thought": the same curriculum with ``[PAUSE]`` tokens in place of the
  thoughts; they are ordinary tokens (a learned embedding, no feedback), trained and generated in one pass;
* no curriculum -- ``training.curriculum: false``: the run trains at the last stage from the start.

``uniform_prob`` (Coconut's stage mixing) is a training-time draw: with that probability a training
example is rendered at a stage drawn uniformly from ``0 .. #steps`` instead of the scheduled one
(:meth:`Coconut.render_at`; the collator draws, evaluation never does).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.methods.anchored import BOR, EOR, PAUSE, TrainedMethod
from anchored_reasoning.methods.base import Rendered
from anchored_reasoning.types import Example

BOT, THOUGHT, EOT = "<bot>", "<thought>", "<eot>"
THOUGHT_KINDS = ("latent", "pause")


@dataclass
class Coconut(TrainedMethod):
    """Continuous thoughts with Coconut's curriculum (see the module docstring).

    Options: ``c`` thoughts per replaced step (Coconut's ``c_thought``; 1 on ProsQA/ProntoQA, 2 on GSM8K),
    ``max_latent_stage`` (6 on ProsQA/ProntoQA, 3 on GSM8K), ``pad_latent_to_max``, ``uniform_prob``,
    ``thought`` ("latent" or "pause"), and the shared ``stage`` / ``step_format`` / ``step_separator``."""

    name: ClassVar[str] = "coconut"
    slot_kind: ClassVar[str | None] = "thought"

    c: int = 1
    max_latent_stage: int = 6
    pad_latent_to_max: bool = True
    uniform_prob: float = 0.0
    thought: str = "latent"
    remove_steps_per_stage: int = 1

    def __post_init__(self) -> None:
        self._require_int("c", 1)
        self._require_int("max_latent_stage", 1)
        self._require_choice("thought", THOUGHT_KINDS)
        if self.remove_steps_per_stage != 1:
            raise ConfigError(f"method coconut: each stage replaces exactly one step (remove_steps_per_stage=1), "
                              f"got {self.remove_steps_per_stage!r}; use c for more thoughts per step")
        if not self.final_stage_removes_all:
            raise ConfigError("method coconut: its last stage removes every step (final_stage_removes_all: true)")
        for key in ("pad_latent_to_max",):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"method coconut: option {key} must be true or false, got {getattr(self, key)!r}")
        p = self.uniform_prob
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) <= 1.0:
            raise ConfigError(f"method coconut: option uniform_prob must be a probability in [0, 1], got {p!r}")
        super().__post_init__()

    # -- tokens ---------------------------------------------------------------------------------
    @property
    def latent(self) -> bool:
        """True when the thoughts are continuous (fed back hidden states): training and generation need
        the latent passes (``CoconutSFTTrainer``, the HF backend); False for pause-as-thought."""
        return self.thought == "latent"

    @property
    def thought_token(self) -> str:
        return THOUGHT if self.latent else PAUSE

    @property
    def added_tokens(self) -> tuple[str, ...]:
        return (BOT, THOUGHT, EOT)

    @property
    def added_token_inits(self) -> dict[str, str]:
        # Coconut starts its three tokens from an existing token's embedding ("<<" on GPT-2); a mean of a
        # short text is the library's way to do the same on any tokenizer
        return {BOT: " <<", THOUGHT: " <<", EOT: " <<"}

    # -- curriculum -----------------------------------------------------------------------------
    def _slot_stages(self) -> int:
        return self.max_latent_stage

    def thought_groups(self, n_steps: int, stage: int | None = None) -> int:
        """How many groups of ``c`` thoughts the prompt of ``stage`` holds for a trace of ``n_steps`` steps: ``s``
        at a stage ``s <= max_latent_stage`` (as Coconut trains, whatever the trace's length); at the last stage
        (the one evaluation prompts with) ``max_latent_stage``, or without ``pad_latent_to_max`` at most the
        trace's steps."""
        s = self.stage if stage is None else stage
        if s <= self.max_latent_stage:
            return s
        return self.max_latent_stage if self.pad_latent_to_max else min(self.max_latent_stage, n_steps)

    def num_removed(self, n_steps: int, stage: int | None = None) -> int:
        s = self.stage if stage is None else stage
        return n_steps if s > self.max_latent_stage else min(s, n_steps)

    def with_stage(self, stage: int) -> "Coconut":
        if stage < 0:
            raise ConfigError(f"method coconut: stage must be >= 0, got {stage}")
        return dataclasses.replace(self, stage=min(int(stage), self.num_stages - 1))

    def max_thoughts(self) -> int:
        """The most thought tokens any prompt of this method holds (the last stage's, padded)."""
        return self.max_latent_stage * self.c

    # -- rendering ------------------------------------------------------------------------------
    def render(self, example: Example, task: Any = None) -> Rendered:
        return self.render_at(example, task, self.stage)

    def render_at(self, example: Example, task: Any, stage: int) -> Rendered:
        """The training view of ``example`` at ``stage`` (the collator's ``uniform_prob`` draw lands here)."""
        from anchored_reasoning.methods.answers import answer_line, task_name_of

        name = task_name_of(task, example)
        steps = self.steps_of(example)
        n = self.thought_groups(len(steps), stage) * self.c
        prompt = (example.question or "").strip() + "\n" + BOT + self.thought_token * n + EOT + BOR
        kept = steps[self.num_removed(len(steps), stage):]
        target = self.step_separator.join(kept) + EOR + "\n" + answer_line(example, name)
        return Rendered(prompt=prompt, target=target)

    def draw_stage(self, example: Example, rng: Any) -> int:
        """The stage a training example is rendered at: the current one, or with probability
        ``uniform_prob`` one drawn uniformly from ``0 .. #steps`` (Coconut's mixing; ``rng`` a ``random.Random``)."""
        if self.uniform_prob > 0 and rng.random() < self.uniform_prob:
            return min(rng.randrange(len(self.steps_of(example)) + 1), self.num_stages - 1)
        return int(self.stage)
