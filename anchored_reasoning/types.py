"""The small data types every stage shares: Example -> Prompt -> Completion -> Grade."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Example:
    """One benchmark or training item, the same whether it came from the Hub, a file or a generator.

    ``steps`` is the reasoning trace (one string per step; empty when the task has none),
    ``answer`` the gold answer in the task's canonical form (a number, a letter, "True",
    a concept name, ...), ``choices`` the options of a multiple-choice task in display order,
    ``meta`` anything task-specific (HumanEval's prompt/test/entry_point, GPQA's record id, ...).
    """

    id: str
    question: str
    answer: str
    steps: list[str] = field(default_factory=list)
    choices: list[str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The example as a plain dict (JSON-ready when its ``meta`` is)."""
        return asdict(self)


@dataclass
class Grade:
    """The verdict on one completion. ``extracted`` is None when no answer could be found."""

    correct: bool
    extracted: str | None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Prompt:
    """A rendered prompt. ``text`` is the raw string for base / fine-tuned models; ``messages``
    the same request as chat turns, used when the backend applies a chat template."""

    text: str
    messages: list[dict[str, str]] | None = None


@dataclass
class SamplingSpec:
    """What to generate. temperature 0 means greedy; ``n`` samples per prompt."""

    max_new_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    n: int = 1
    stop: list[str] = field(default_factory=list)
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Completion:
    """One generated sample: its text (stop string removed), generated-token count and wall seconds;
    ``meta``: what the backend measured for it (the diffusion_gemma backend's NFE and layer calls), which
    the eval runner writes into the sample's record."""

    text: str
    n_tokens: int
    seconds: float
    finish_reason: str | None = None
    meta: dict[str, Any] | None = None
