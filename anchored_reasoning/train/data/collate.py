"""Turn rendered examples into training tensors: LM labels on the target only, anchor labels at [ANT] slots.

One rendered example (``Rendered(prompt, target, anchors)``) becomes::

    input_ids      = tok(prompt) + tok(target) + [eos]
    labels         = [-100] * len(tok(prompt)) + tok(target) + [eos]          (LM loss, shifted by the model)
    anchor_labels  = -100 everywhere except at the [ANT] positions: anchor i owns the m = tokens_per_anchor
                     slots from i*m on, and its j-th slot is labelled with the j-th token of the anchor
                     (the hidden state AT that slot is trained to predict it; not shifted). Slots beyond
                     the anchor's tokens, and slots beyond ``len(anchors) * m``, stay -100 (no loss).

An anchor's tokens (:func:`anchor_label_ids`) are those of ``" " + anchor`` (its spelling mid-sentence)
with leading whitespace-only tokens removed: GPT-2 spells ``" 16"`` as one token, SmolLM2 / Qwen2.5 /
Llama 3 as ``" "``, ``"1"``, ``"6"``, and a label of ``" "`` would make every number the same anchor.
An anchor longer than m tokens keeps its first m (counted in ``stats["truncated_anchors"]``); an
anchor that tokenizes to nothing is a :class:`DataError` naming it and its example.
:func:`check_anchor_labels` runs these checks over a whole training set before training starts.

The prompt and the target are tokenized separately, exactly as evaluation sees them: the runner feeds
``tok(prompt)`` and the model generates the target token by token.

:class:`AnchoredCollator` renders rows of a ``datasets.Dataset`` on the fly with the method at the
current curriculum stage (``set_stage``), so a stage switch changes the data without rebuilding the
dataset. Rows either hold a serialized :class:`~anchored_reasoning.types.Example` (column ``example``,
rendered by the method) or an already rendered ``prompt`` / ``target`` / ``anchors`` triple.
"""
from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from anchored_reasoning.errors import DataError
from anchored_reasoning.methods import Rendered
from anchored_reasoning.types import Example

logger = logging.getLogger(__name__)

IGNORE = -100
DEFAULT_ANT_TOKEN = "[ANT]"


@dataclass
class TokenizedExample:
    """One tokenized training sequence. ``n_slots`` is the number of anchors the [ANT] slots of the
    prompt can hold (slot tokens / tokens_per_anchor), ``n_anchor_labels`` how many anchors are
    labelled (fewer when the trace has fewer anchors), ``truncated_anchors`` how many of those were
    longer than their ``tokens_per_anchor`` slots."""

    input_ids: list[int]
    labels: list[int]
    anchor_labels: list[int]
    n_slots: int = 0
    n_anchor_labels: int = 0
    truncated: bool = False
    truncated_anchors: int = 0


def _is_blank(tokenizer, token_id: int) -> bool:
    return not tokenizer.decode([token_id], skip_special_tokens=False).strip()


def anchor_label_ids(tokenizer, anchor: str) -> list[int]:
    """The label token ids of one anchor: the tokens of ``" " + anchor`` (the anchor as it appears
    mid-sentence) without leading whitespace-only tokens. ``[]`` when nothing is left."""
    anchor = anchor.strip()
    if not anchor:
        return []
    ids = list(tokenizer(" " + anchor, add_special_tokens=False)["input_ids"])
    while ids and _is_blank(tokenizer, ids[0]):
        ids.pop(0)
    return ids


class AnchorLabels:
    """:func:`anchor_label_ids` with a cache, raising a :class:`DataError` for an anchor that
    tokenizes to nothing (naming the anchor and ``where`` it came from)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[str, list[int]] = {}

    def __call__(self, anchor: str, where: str = "") -> list[int]:
        ids = self._cache.get(anchor)
        if ids is None:
            ids = self._cache[anchor] = anchor_label_ids(self.tokenizer, anchor)
        if not ids:
            name = getattr(self.tokenizer, "name_or_path", "") or type(self.tokenizer).__name__
            raise DataError(
                f"{where or 'example'}: anchor {anchor!r} tokenizes to nothing with tokenizer {name!r} "
                "(no token is left once leading whitespace tokens are dropped); fix the anchor extractor "
                "or the example's steps"
            )
        return ids


def special_token_id(tokenizer, token: str) -> int:
    """The id of a single added token (e.g. ``[ANT]``); a clear error when the tokenizer lacks it."""
    tid = tokenizer.convert_tokens_to_ids(token)
    if tid is None or tid == tokenizer.unk_token_id or tokenizer.convert_ids_to_tokens(tid) != token:
        raise DataError(
            f"the tokenizer has no {token!r} token; add the method's special tokens first "
            "(anchored_reasoning.methods.anchored.add_special_tokens(tokenizer, model))"
        )
    return tid


def tokenize_rendered(
    rendered: Rendered,
    tokenizer,
    *,
    ant_id: int | None,
    max_length: int | None = None,
    add_eos: bool = True,
    where: str = "",
    labeler: AnchorLabels | None = None,
) -> TokenizedExample:
    """Tokenize one rendered example (see the module docstring for the layout)."""
    prompt_ids = list(tokenizer(rendered.prompt)["input_ids"])
    target_ids = list(tokenizer(rendered.target, add_special_tokens=False)["input_ids"]) if rendered.target else []
    if add_eos:
        if tokenizer.eos_token_id is None:
            raise DataError("the tokenizer has no eos token; set tokenizer.eos_token before training")
        target_ids.append(tokenizer.eos_token_id)
    input_ids = prompt_ids + target_ids
    labels = [IGNORE] * len(prompt_ids) + target_ids
    anchor_labels = [IGNORE] * len(input_ids)

    n_slots = truncated_anchors = 0
    firsts: list[int] = []  # the first labelled position of each labelled anchor
    if ant_id is not None:
        slots = [i for i, t in enumerate(prompt_ids) if t == ant_id]
        width = int(getattr(rendered, "tokens_per_anchor", 1) or 1)
        if len(slots) % width:
            raise DataError(
                f"{where or 'example'}: {len(slots)} [ANT] slots is not a multiple of tokens_per_anchor={width}"
            )
        n_slots = len(slots) // width
        labeler = labeler or AnchorLabels(tokenizer)
        for g, anchor in enumerate(list(rendered.anchors or [])[:n_slots]):
            ids = labeler(anchor, where)
            truncated_anchors += len(ids) > width
            group = slots[g * width : (g + 1) * width]
            for slot, tid in zip(group, ids):
                # The LM loss is read at p (predicting p+1); the anchor loss at the same p must not collide with it.
                if slot + 1 < len(labels) and labels[slot + 1] != IGNORE:
                    raise DataError(
                        f"{where or 'example'}: an [ANT] slot is the last prompt token, so its position already carries "
                        "the LM loss of the first target token; the method must close the slots ([EoA]) inside the prompt"
                    )
                anchor_labels[slot] = tid
            firsts.append(group[0])

    truncated = False
    if max_length is not None and len(input_ids) > max_length:
        truncated = True
        input_ids, labels, anchor_labels = input_ids[:max_length], labels[:max_length], anchor_labels[:max_length]
        firsts = [p for p in firsts if p < max_length]
    return TokenizedExample(input_ids, labels, anchor_labels, n_slots, len(firsts), truncated, truncated_anchors)


def check_anchor_labels(tokenizer, method, examples: Iterable[Example], task: Any = None) -> dict[str, Any]:
    """Before training: the anchors ``method`` will label on ``examples`` (at its final stage, the
    one with the most slots), tokenized as the collator will. Raises :class:`DataError` naming the
    anchor and its example when one tokenizes to nothing; returns counts and warns when anchors
    are longer than ``tokens_per_anchor`` or distinct anchors share a label sequence. A method
    without anchors returns ``{}``."""
    if not getattr(method, "anchored", False):
        return {}
    final = method.with_stage(method.num_stages - 1) if hasattr(method, "with_stage") else method
    width = int(getattr(final, "tokens_per_anchor", 1) or 1)
    first_seen: dict[str, str] = {}
    for ex in examples:
        for anchor in final.render(ex, task).anchors:
            first_seen.setdefault(anchor, str(ex.id))
    labeler = AnchorLabels(tokenizer)
    by_labels: dict[tuple[int, ...], list[str]] = defaultdict(list)
    lengths: dict[str, int] = {}
    for anchor, ex_id in first_seen.items():
        ids = labeler(anchor, f"example {ex_id}")
        lengths[anchor] = len(ids)
        by_labels[tuple(ids[:width])].append(anchor)
    longer = sorted(a for a, n in lengths.items() if n > width)
    colliding = sorted(a for group in by_labels.values() if len(group) > 1 for a in group)
    stats = {
        "distinct_anchors": len(first_seen),
        "tokens_per_anchor": width,
        "max_anchor_tokens": max(lengths.values(), default=0),
        "anchors_truncated": len(longer),
        "anchors_sharing_labels": len(colliding),
    }
    if longer:
        logger.warning(
            "%d of %d distinct anchors are longer than tokens_per_anchor=%d (e.g. %s); they keep their first %d "
            "token(s). The longest has %d: set method.options.tokens_per_anchor=%d to keep them whole",
            len(longer), len(first_seen), width, ", ".join(map(repr, longer[:3])), width,
            stats["max_anchor_tokens"], stats["max_anchor_tokens"],
        )
    if colliding:
        logger.warning("%d distinct anchors share a label sequence with another (e.g. %s)",
                       len(colliding), ", ".join(map(repr, colliding[:4])))
    return stats


def pad_batch(items: Sequence[TokenizedExample], pad_id: int, pad_to_multiple_of: int | None = None) -> dict[str, Any]:
    """Right-pad a list of tokenized examples into tensors (attention mask 0 and labels -100 on padding)."""
    import torch

    if not items:
        raise DataError("empty batch")
    width = max(len(it.input_ids) for it in items)
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    n = len(items)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    labels = torch.full((n, width), IGNORE, dtype=torch.long)
    anchors = torch.full((n, width), IGNORE, dtype=torch.long)
    for row, it in enumerate(items):
        length = len(it.input_ids)
        input_ids[row, :length] = torch.tensor(it.input_ids, dtype=torch.long)
        attention[row, :length] = 1
        labels[row, :length] = torch.tensor(it.labels, dtype=torch.long)
        anchors[row, :length] = torch.tensor(it.anchor_labels, dtype=torch.long)
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "labels": labels,
        "anchor_labels": anchors,
        "anchor_slots": torch.tensor([it.n_slots for it in items], dtype=torch.long),
        "anchor_targets": torch.tensor([it.n_anchor_labels for it in items], dtype=torch.long),
    }


def example_to_row(example: Example) -> dict[str, str]:
    """A dataset row holding one Example (JSON keeps ``meta`` free of Arrow schema constraints)."""
    return {"example": json.dumps(example.to_dict(), ensure_ascii=False)}


def row_to_example(row: dict[str, Any]) -> Example:
    data = json.loads(row["example"]) if isinstance(row.get("example"), str) else row
    try:
        return Example(
            id=str(data["id"]),
            question=data["question"],
            answer=str(data["answer"]),
            steps=list(data.get("steps") or []),
            choices=data.get("choices"),
            meta=dict(data.get("meta") or {}),
        )
    except KeyError as exc:
        raise DataError(f"training row lacks the field {exc.args[0]!r}: {str(data)[:200]}") from None


def examples_dataset(examples: Iterable[Example]):
    """A ``datasets.Dataset`` with one ``example`` column, for :class:`AnchoredCollator`."""
    from datasets import Dataset

    rows = [example_to_row(ex) for ex in examples]
    if not rows:
        raise DataError("no training examples")
    return Dataset.from_list(rows)


def rendered_dataset(rendered: Iterable[Rendered]):
    """A ``datasets.Dataset`` of pre-rendered ``prompt`` / ``target`` / ``anchors`` rows (no method needed)."""
    from datasets import Dataset

    rows = [
        {"prompt": r.prompt, "target": r.target, "anchors": list(r.anchors), "tokens_per_anchor": r.tokens_per_anchor}
        for r in rendered
    ]
    if not rows:
        raise DataError("no training examples")
    return Dataset.from_list(rows)


@dataclass
class AnchoredCollator:
    """Render (with the method at the current stage), tokenize and pad a batch of dataset rows.

    ``method`` may be None when the rows are pre-rendered. ``stats`` counts what was collated:
    examples, examples with fewer anchors than slots, examples with slots but no anchor at all, and
    truncated sequences (the trainer logs its own per-step counts from the batch tensors).
    """

    tokenizer: Any
    method: Any = None
    task: Any = None
    ant_token: str = DEFAULT_ANT_TOKEN
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    stage: int | None = None
    #: Tag each batch with the stage it was rendered at and its source rows, so the trainer can
    #: re-render a batch the data loader prefetched before a curriculum stage switch.
    keep_rows: bool = False
    stats: dict[str, int] = field(
        default_factory=lambda: {"examples": 0, "fewer_anchors": 0, "no_anchors": 0, "truncated": 0, "truncated_anchors": 0}
    )

    def __post_init__(self) -> None:
        self._staged = None
        self._labeler = AnchorLabels(self.tokenizer)
        self._ant_id: int | None = None
        vocab = self.tokenizer.get_vocab()
        if self.ant_token in vocab:
            self._ant_id = vocab[self.ant_token]
        if self.tokenizer.pad_token_id is None:
            raise DataError("the tokenizer has no pad token; set tokenizer.pad_token (e.g. to the eos token) first")
        self.set_stage(self.stage)

    @property
    def ant_id(self) -> int | None:
        return self._ant_id

    def set_stage(self, stage: int | None) -> None:
        """Render later batches with ``method.with_stage(stage)``; None keeps the method's own stage
        (a method built without ``stage`` sits at its final stage)."""
        self.stage = None if stage is None else int(stage)
        if self.method is not None:
            if self.stage is None or not hasattr(self.method, "with_stage"):
                self._staged = self.method
            else:
                self._staged = self.method.with_stage(self.stage)

    @property
    def staged_method(self):
        return self._staged

    def render_row(self, row: dict[str, Any]) -> Rendered:
        if "prompt" in row and "target" in row:
            return Rendered(
                prompt=row["prompt"], target=row["target"], anchors=list(row.get("anchors") or []),
                tokens_per_anchor=int(row.get("tokens_per_anchor") or 1),
            )
        if self._staged is None:
            raise DataError("rows hold examples but the collator has no method to render them with")
        return self._staged.render(row_to_example(row), self.task)

    def tokenize(self, row: dict[str, Any]) -> TokenizedExample:
        rendered = self.render_row(row)
        where = f"example {json.loads(row['example']).get('id')}" if isinstance(row.get("example"), str) else ""
        item = tokenize_rendered(
            rendered, self.tokenizer, ant_id=self._ant_id, max_length=self.max_length, where=where, labeler=self._labeler
        )
        self.stats["examples"] += 1
        self.stats["truncated_anchors"] = self.stats.get("truncated_anchors", 0) + item.truncated_anchors
        if item.n_slots and item.n_anchor_labels < item.n_slots:
            self.stats["fewer_anchors"] += 1
            if item.n_anchor_labels == 0:
                self.stats["no_anchors"] += 1
        if item.truncated:
            self.stats["truncated"] += 1
            if self.stats["truncated"] in (1, 10, 100, 1000):
                logger.warning("%d training sequence(s) truncated to max_length=%s", self.stats["truncated"], self.max_length)
        return item

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        batch = pad_batch([self.tokenize(r) for r in rows], self.tokenizer.pad_token_id, self.pad_to_multiple_of)
        if self.keep_rows:
            batch[STAGE_KEY] = self.stage
            batch[ROWS_KEY] = list(rows)
        return batch


#: Keys of a ``keep_rows`` batch (removed by the trainer before the model sees the batch).
STAGE_KEY = "collated_stage"
ROWS_KEY = "collated_rows"
