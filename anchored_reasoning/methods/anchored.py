"""The ``trained`` methods: the plain-text formats our fine-tuned checkpoints learn.

One render path serves training and evaluation: :meth:`TrainedMethod.render` gives
``Rendered(prompt, target, anchors)`` and :meth:`TrainedMethod.prompt` returns exactly
``Prompt(render(...).prompt)``. The layout (``shared/PAPERS.md`` section 2)::

    prompt = question "\\n" [slots] ["[BoR]"]
    target = [remaining steps joined by "\\n" (or " ", step_separator)  "[EoR]" "\\n"] answer line   (+ EOS by the trainer)

    nocot     slots = none, no [BoR]; target = answer line
    cot       slots = none;           target = all steps [EoR] answer line
    pause     slots = "[PAUSE]" x (n * tokens_per_anchor)   (no anchor loss)
    acot      slots = "[BoA]" "[ANT]" x (n * tokens_per_anchor) "[EoA]"; Rendered.anchors = first n anchors
    stepwise  slots = none; stage s removes s leading steps (iCoT / Coconut)
    anchor_chain  prompt ends with "[BoA]"; target = the anchors joined by " " "[EoA]" "\n" answer line
              (the anchors decoded: a terse CoT, not the paper's latent ACoT; methods/anchor_chain.py)

Curriculum (``stage`` / :meth:`with_stage`): at stage ``s`` pause/acot have ``n = min(s, k)``
slots (stage 0 is plain CoT, no anchor block) and ``min(s * remove_steps_per_stage, #steps)``
leading steps are removed. When steps are removed (``remove_steps_per_stage > 0``) and
``final_stage_removes_all`` is on, one more stage after the last slot stage removes every
step, so the model ends up emitting ``[EoR]`` and the answer only (Coconut's last stage).
A method built without ``stage`` sits at its final stage, the one evaluation uses.

Answer lines are what the task graders read: GSM8K ``#### 18``, ProsQA ``### Tom is a
lempus.``, ProntoQA ``### True``, any other task ``### <answer>`` (``methods/answers.py``).

>>> from anchored_reasoning.methods import get_method
>>> acot = get_method("acot", style="trained", k=2)
>>> [acot.with_stage(s).render(ex, "gsm8k") for s in range(acot.num_stages)]  # doctest: +SKIP
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

from anchored_reasoning.anchors import extract_anchors
from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.methods.base import Rendered
from anchored_reasoning.methods.answers import (  # noqa: F401  (re-exported: the trained formats' answer lines)
    ANSWER_PREFIX, GSM8K_ANSWER_PREFIX, answer_line, prosqa_answer_sentence, require_prosqa_without_answer_line,
    task_name_of,
)
from anchored_reasoning.tasks.extract import prosqa_concept
from anchored_reasoning.types import Example, Prompt

log = logging.getLogger(__name__)

BOA, ANT, EOA, BOR, EOR, PAUSE = "[BoA]", "[ANT]", "[EoA]", "[BoR]", "[EoR]", "[PAUSE]"
#: Tokens every trained-style checkpoint has in its vocabulary (added once, embeddings resized).
SPECIAL_TOKENS = [BOA, ANT, EOA, BOR, EOR, PAUSE]

#: How steps are written: the example's text, or GSM8K's calculator annotations only.
STEP_FORMATS = ("text", "calculations")
STEP_SEPARATORS = ("\n", " ")


def add_special_tokens(tokenizer: Any, model: Any = None, extra: Sequence[str] = (),
                       init: Mapping[str, str] | None = None) -> int:
    """Add :data:`SPECIAL_TOKENS` and ``extra`` (a method's own, :attr:`TrainedMethod.added_tokens`) to
    ``tokenizer`` (as special tokens, never split) unless they are there already, and resize ``model``'s
    input/output embeddings to the tokenizer's length when they are too small. ``init`` (a method's
    :attr:`TrainedMethod.added_token_inits`) maps an added token to a text: the token's new embedding row
    starts as the mean of that text's token embeddings (``[Back]`` from `` Back``) instead of the resize's
    mean of the whole vocabulary. Idempotent: a token the model already has a row for is left alone.
    Returns how many tokens were added (0 the second time)."""
    vocab = tokenizer.get_vocab()
    missing = [t for t in dict.fromkeys([*SPECIAL_TOKENS, *extra]) if t not in vocab]
    added = int(tokenizer.add_tokens(missing, special_tokens=True)) if missing else 0
    if model is not None:
        size = model.get_input_embeddings().weight.shape[0]
        if size < len(tokenizer):
            model.resize_token_embeddings(len(tokenizer))
            log.info("resized embeddings %d -> %d for %d special tokens", size, len(tokenizer), added)
            _init_rows(tokenizer, model, {t: x for t, x in (init or {}).items() if tokenizer.convert_tokens_to_ids(t) >= size})
    return added


def _init_rows(tokenizer: Any, model: Any, init: Mapping[str, str]) -> None:
    """Each token's input (and untied output) embedding row := the mean of its text's token rows."""
    import torch

    tables = [model.get_input_embeddings().weight]
    out = model.get_output_embeddings()
    if out is not None and out.weight.data_ptr() != tables[0].data_ptr():
        tables.append(out.weight)
    added = set(tokenizer.get_added_vocab().values())
    for token, text in init.items():
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids or added.intersection(ids):
            raise ConfigError(f"cannot initialise {token!r} from {text!r}: it must be text the base vocabulary "
                              f"writes without added tokens (got ids {ids})")
        row = tokenizer.convert_tokens_to_ids(token)
        with torch.no_grad():
            for table in tables:
                table[row] = table[ids].mean(0)
        log.info("embedding of %s initialised as the mean of %s (%d tokens)", token, text.strip(), len(ids))


# ---------------------------------------------------------------------------------------------
# methods

@dataclass
class TrainedMethod:
    """Shared render path and curriculum of the trained-style methods (see the module docstring).

    Options (all JSON-able, written into a checkpoint's ``anchored_reasoning.json``):
    ``k`` slots at the last stage, ``remove_steps_per_stage`` leading steps removed per stage,
    ``final_stage_removes_all`` (an extra last stage without any step when steps are removed),
    ``stage`` (None = the final stage), ``step_format`` ("text", or "calculations" for
    GSM8K's ``<<a*b=c>>`` annotations only, the augmented-GSM8K form Coconut trains on).
    """

    name: ClassVar[str] = "trained"
    reasons: ClassVar[bool] = True  # prompt ends with [BoR], target holds steps + [EoR]
    slot_kind: ClassVar[str | None] = None  # "ant", "pause" or None
    anchored: ClassVar[bool] = False  # Rendered.anchors filled (anchor loss at [ANT])
    style: ClassVar[str] = "trained"

    k: int = 0
    remove_steps_per_stage: int = 0
    final_stage_removes_all: bool = True
    stage: int | None = None
    step_format: str = "text"
    #: what joins the kept steps in the target: a newline, or a space to match a backbone pretrained on
    #: steps joined by spaces (``train.logic_text``'s documents; the demo sets it for ``logic-gpt2-search``)
    step_separator: str = "\n"

    @property
    def added_tokens(self) -> tuple[str, ...]:
        """Tokens this method writes beyond :data:`SPECIAL_TOKENS`, added to the tokenizer before training."""
        return ()

    @property
    def added_token_inits(self) -> dict[str, str]:
        """Added token -> a text whose tokens' mean embedding starts its row (:func:`add_special_tokens`)."""
        return {}

    def _require_int(self, key: str, minimum: int, nullable: bool = False) -> None:
        """Refuse option ``key`` unless it is an integer (not a bool) >= ``minimum``, or None where ``nullable``."""
        value = getattr(self, key)
        if nullable and value is None:
            return
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ConfigError(f"method {self.name}: option {key} must be an integer >= {minimum}"
                              f"{' or null' if nullable else ''}, got {value!r}")

    def _require_choice(self, key: str, choices: Sequence[str]) -> None:
        """Refuse option ``key`` unless it is one of ``choices``."""
        value = getattr(self, key)
        if value not in choices:
            raise ConfigError(f"method {self.name}: option {key} must be one of {', '.join(choices)}, got {value!r}")

    def __post_init__(self) -> None:
        if self.step_separator not in STEP_SEPARATORS:
            raise ConfigError(f"method {self.name}: option step_separator must be a newline or a space, "
                              f"got {self.step_separator!r}")
        self._require_choice("step_format", STEP_FORMATS)
        for key in ("k", "remove_steps_per_stage"):
            self._require_int(key, 0)
        if self.stage is None:
            self.stage = self.num_stages - 1
        if not isinstance(self.stage, int) or not 0 <= self.stage < self.num_stages:
            raise ConfigError(
                f"method {self.name}: stage {self.stage!r} out of range 0..{self.num_stages - 1} "
                f"(k={self.k}, remove_steps_per_stage={self.remove_steps_per_stage})"
            )

    @property
    def stop(self) -> list[str]:
        """Stop strings for generation: none, trained checkpoints end with EOS."""
        return []

    # -- curriculum ------------------------------------------------------------------------
    def _slot_stages(self) -> int:
        """Number of stages after stage 0 during which slots grow / steps are removed."""
        return self.k

    @property
    def num_stages(self) -> int:
        n = self._slot_stages() + 1
        if self.remove_steps_per_stage > 0 and self.final_stage_removes_all:
            n += 1
        return n

    def with_stage(self, stage: int) -> "TrainedMethod":
        """A copy of this method at curriculum ``stage`` (clamped to the last stage)."""
        if stage < 0:
            raise ConfigError(f"method {self.name}: stage must be >= 0, got {stage}")
        return dataclasses.replace(self, stage=min(int(stage), self.num_stages - 1))

    def num_slots(self, stage: int | None = None) -> int:
        s = self.stage if stage is None else stage
        return min(s, self.k) if self.slot_kind else 0

    def num_removed(self, n_steps: int, stage: int | None = None) -> int:
        s = self.stage if stage is None else stage
        if self.remove_steps_per_stage <= 0:
            return 0
        if self.final_stage_removes_all and s >= self.num_stages - 1 and s > self._slot_stages():
            return n_steps
        return min(s * self.remove_steps_per_stage, n_steps)

    @property
    def options(self) -> dict[str, Any]:
        """Constructor options, JSON-able: ``get_method(name, style="trained", **options)`` rebuilds it."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    # -- rendering -------------------------------------------------------------------------
    def slots(self, n: int) -> str:
        if n <= 0 or self.slot_kind is None:
            return ""
        if self.slot_kind == "ant":
            return BOA + ANT * n + EOA
        return PAUSE * n

    def steps_of(self, example: Example) -> list[str]:
        """The reasoning steps rendered: the example's text steps, or with
        ``step_format="calculations"`` the calculator annotations (``<<16-3-4=9>>``, the
        augmented-GSM8K form of iCoT/Coconut) of the steps that have them, when the example
        carries ``meta["calculations"]`` (GSM8K); other examples keep their text steps."""
        steps = [s.strip() for s in (example.steps or []) if isinstance(s, str) and s.strip()]
        calcs = (example.meta or {}).get("calculations")
        if self.step_format == "calculations" and isinstance(calcs, list) and any(calcs):
            steps = [" ".join(f"<<{c}>>" for c in step) for step in calcs if isinstance(step, list) and step]
        return steps

    def render(self, example: Example, task: Any = None) -> Rendered:
        """Training view of ``example`` at the current stage: prompt (no LM loss), target
        (LM loss; the trainer appends EOS) and the anchors of the ``[ANT]`` slots."""
        name = task_name_of(task, example)
        question = (example.question or "").strip()
        steps = self.steps_of(example)
        n_slots = self.num_slots()
        prompt = question + "\n" + self.slots(n_slots)
        final = answer_line(example, name)
        if self.reasons:
            prompt += BOR
            kept = steps[self.num_removed(len(steps)):]
            target = self.step_separator.join(kept) + EOR + "\n" + final
        else:
            target = final
        anchors: list[str] = []
        if self.anchored and n_slots > 0:
            anchors = extract_anchors(example, name)[:n_slots]
        return Rendered(prompt=prompt, target=target, anchors=anchors)

    def prompt(self, example: Example, task: Any = None) -> Prompt:
        """Evaluation prompt: the same text as ``render(example, task).prompt``."""
        return Prompt(text=self.render(example, task).prompt)


@dataclass
class TrainedNoCoT(TrainedMethod):
    """Question -> answer line, no reasoning."""

    name: ClassVar[str] = "nocot"
    reasons: ClassVar[bool] = False


@dataclass
class TrainedCoT(TrainedMethod):
    """Question [BoR] -> all steps [EoR] answer line."""

    name: ClassVar[str] = "cot"
    #: ProsQA: ``false`` ends the target at ``[EoR]``, without the answer line (``### Tom is a lempus.``): every
    #: ProsQA trace ends at the asked option, so the task's extractor reads the answer from the last step. The
    #: same option as ``anchor_chain``'s, for comparing the two at equal footing.
    answer_line: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.answer_line, bool):
            raise ConfigError(f"method cot: option answer_line must be true or false, got {self.answer_line!r}")
        super().__post_init__()

    def render(self, example: Example, task: Any = None) -> Rendered:
        rendered = super().render(example, task)
        if self.answer_line:
            return rendered
        name = task_name_of(task, example)
        require_prosqa_without_answer_line("cot", name, "steps")
        target = rendered.target[: rendered.target.index(EOR) + len(EOR)]
        want = prosqa_concept(str(example.answer), example)
        if want is None or prosqa_concept(target, example) != want:
            raise DataError(f"example {example.id}: its steps do not end at the answer {example.answer!r}, so "
                            "answer_line: false would train a wrong answer; keep the answer line")
        return dataclasses.replace(rendered, target=target)

    def prompt(self, example: Example, task: Any = None) -> Prompt:
        """The prompt alone: an example asked at evaluation needs no target, so no check of its steps."""
        return Prompt(text=super().render(example, task).prompt)


@dataclass
class SlotMethod(TrainedMethod):
    """A method with slots in its prompt (pause, acot). ``k`` counts anchors (one per stage);
    each anchor takes ``tokens_per_anchor`` consecutive slot tokens, so the prompt of stage ``s``
    holds ``min(s, k) * tokens_per_anchor`` of them. 1 is the paper's setting (GPT-2, where
    ``" 16"`` is one token); tokenizers that spell ``16`` as ``1``, ``6`` need more (see
    docs/acot-data.md and :func:`anchored_reasoning.train.data.collate.anchor_label_ids`)."""

    k: int = 6
    tokens_per_anchor: int = 1

    def __post_init__(self) -> None:
        self._require_int("tokens_per_anchor", 1)
        super().__post_init__()

    def slot_tokens(self, stage: int | None = None) -> int:
        """How many slot tokens the prompt of ``stage`` holds."""
        return self.num_slots(stage) * self.tokens_per_anchor

    def slots(self, n: int) -> str:
        if n <= 0:
            return ""
        width = n * self.tokens_per_anchor
        if self.slot_kind == "ant":
            return BOA + ANT * width + EOA
        return PAUSE * width

    def render(self, example: Example, task: Any = None) -> Rendered:
        rendered = super().render(example, task)
        rendered.tokens_per_anchor = self.tokens_per_anchor
        return rendered


@dataclass
class Pause(SlotMethod):
    """CoT with ``[PAUSE]`` slots in the prompt and no anchor loss (Goyal et al. pause tokens):
    the control that tells extra slots apart from anchor supervision."""

    name: ClassVar[str] = "pause"
    slot_kind: ClassVar[str | None] = "pause"


@dataclass
class ACoT(SlotMethod):
    """Anchored CoT: ``[BoA] [ANT] x n [EoA]`` in the prompt, each ``[ANT]`` (group of
    ``tokens_per_anchor``) trained to predict the next anchor, never decoded.
    ``remove_steps_per_stage=1`` gives the ProsQA schedule."""

    name: ClassVar[str] = "acot"
    slot_kind: ClassVar[str | None] = "ant"
    anchored: ClassVar[bool] = True


@dataclass
class Stepwise(TrainedMethod):
    """Stepwise internalisation (iCoT / Coconut without latents): stage ``s`` removes
    ``s * remove_steps_per_stage`` leading steps; ``stages`` removal stages, then (by default)
    a last stage without any step."""

    name: ClassVar[str] = "stepwise"
    remove_steps_per_stage: int = 1
    stages: int = 6

    def __post_init__(self) -> None:
        self._require_int("stages", 0)
        super().__post_init__()

    def _slot_stages(self) -> int:
        return self.stages


TRAINED_METHODS: dict[str, type[TrainedMethod]] = {
    cls.name: cls for cls in (TrainedNoCoT, TrainedCoT, Pause, ACoT, Stepwise)
}
