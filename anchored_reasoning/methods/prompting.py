"""Instruct-style methods: zero-shot prompting of an off-the-shelf model.

``nocot`` and ``cot`` fill the task's prompt template for the method (``prompts.nocot`` /
``prompts.cot`` in the task YAML, filled by ``task.format_prompt``: ``{question}`` is the rendered
question with any choices)
and offer it both as raw text and as one user chat turn; the backend decides which to use
(the HF backend applies the tokenizer's chat template when the model has one). ``completion``
(HumanEval's ``prompts.completion``) offers raw text only, to be continued by a base model.

The registry (:func:`anchored_reasoning.methods.get_method`) picks the class: the plain names
map here, to the instruct versions. The formats our fine-tuned checkpoints learn (the
``trained`` style of nocot/cot, and pause/acot/stepwise) live in ``methods/anchored.py``; the
eval runner builds those when a checkpoint's ``anchored_reasoning.json`` says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.types import Example, Prompt


@dataclass
class InstructMethod:
    """Fill ``task.prompts[template or name]`` with the rendered question.

    ``template`` overrides which prompt template of the task is used (default: the method's
    name); ``system`` adds a system chat turn; ``stop`` adds stop strings to the task's own.
    """

    name: ClassVar[str] = "instruct"
    style: ClassVar[str] = "instruct"
    template: str | None = None
    system: str | None = None
    extra_stop: list[str] = field(default_factory=list)

    @property
    def stop(self) -> list[str]:
        return list(self.extra_stop)

    @property
    def options(self) -> dict[str, Any]:
        return {"template": self.template, "system": self.system, "extra_stop": list(self.extra_stop)}

    def prompt(self, example: Example, task: Any) -> Prompt:
        key = self.template or self.name
        prompts = getattr(task, "prompts", None) or {}
        if key not in prompts:
            raise ConfigError(
                f"task {getattr(task, 'name', task)!r} has no prompt template {key!r} "
                f"(has: {', '.join(sorted(prompts)) or 'none'}); add prompts.{key} to its YAML file"
            )
        if hasattr(task, "format_prompt"):
            text = task.format_prompt(key, example)  # the task knows its template fields
        else:
            question = task.render_question(example) if hasattr(task, "render_question") else example.question
            try:
                text = prompts[key].format(question=question)
            except (KeyError, IndexError, ValueError) as exc:
                raise ConfigError(
                    f"task {getattr(task, 'name', task)!r}: prompt template {key!r} must use only the field "
                    f"{{question}} (escape other braces as {{{{ }}}}): {exc}"
                ) from exc
        messages = []
        if self.system:
            messages.append({"role": "system", "content": self.system})
        messages.append({"role": "user", "content": text})
        return Prompt(text=text, messages=messages)


@dataclass
class NoCoT(InstructMethod):
    """Ask for the answer directly (the task's ``prompts.nocot`` template)."""

    name: ClassVar[str] = "nocot"


@dataclass
class CoT(InstructMethod):
    """Ask the model to reason step by step, then answer (the task's ``prompts.cot`` template)."""

    name: ClassVar[str] = "cot"


@dataclass
class Completion(InstructMethod):
    """Give the task's ``prompts.completion`` template as raw text to be continued, never as a chat
    turn: HumanEval's original protocol for base models (the prompt is the function's signature and
    docstring; the completion is its body), the one lm-eval's and evalplus's base-model runs use.
    The task's ``generation.methods.completion`` stop strings end the body."""

    name: ClassVar[str] = "completion"

    def __post_init__(self) -> None:
        if self.system is not None:
            raise ConfigError("method completion sends raw text to be continued, so it takes no system turn; "
                              "drop the system option (or use nocot/cot for chat prompting)")

    def prompt(self, example: Example, task: Any) -> Prompt:
        return Prompt(text=super().prompt(example, task).text)
