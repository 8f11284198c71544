"""``anchor_chain``: the anchors *decoded* as a terse chain of thought, and the search written as its anchors.

What works at small scale where the paper's latent ACoT does not (README, Results): the anchors are written
out, so each is fed back as an input as CoT's steps are, for a handful of tokens. With ``revisits`` the chain
is a search's walk (the node each step arrives at, back-ups included); ``mark_backups`` marks each back-up,
with a word (``Back``; ``backup_word``) or one added token (``backup_marker: token``), so a back-up reads apart
from a step down.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from anchored_reasoning.anchors import extract_anchors, logic_walk
from anchored_reasoning.errors import ConfigError
from anchored_reasoning.generators.traces import BACK_TOKEN, BACK_WORD
from anchored_reasoning.methods.base import Rendered
from anchored_reasoning.methods.anchored import BOA, EOA, TrainedMethod
from anchored_reasoning.methods.answers import answer_line, require_prosqa_without_answer_line, task_name_of
from anchored_reasoning.types import Example

#: How ``anchor_chain`` marks a walk's back-up: the word ``Back``, or the added token ``[Back]``.
BACKUP_MARKERS = ("word", "token")
#: Where the token marker's embedding starts: the resize's mean of the vocabulary, or the word ``Back``'s tokens.
MARKER_INITS = ("mean", "word")


@dataclass
class AnchorChain(TrainedMethod):
    """The anchors *decoded*, as a terse chain of thought: ``question "\n" [BoA]`` -> the anchors
    joined by spaces, ``[EoA]``, the answer line (ProsQA: ``Tom terpus brimpus lempus[EoA]``).

    Not the paper's ACoT, whose slots are never decoded: in a causal LM a slot's last-layer state
    (the one trained to predict its anchor) is read by no later position, so a shallow model cannot
    pass what its slots predict on to the answer (research/ladder/acot_slots.py measures this). Writing the
    anchors out feeds each one back as an input, as CoT does, for a handful of tokens. ``max_anchors``
    (None: every anchor of the trace, so the ProsQA chain reaches the answer) caps the chain."""

    name: ClassVar[str] = "anchor_chain"
    max_anchors: int | None = None
    #: ProntoQA's answer turns on the polarity of the last step ("Stella is not floral."), which the
    #: anchors drop; with ``negation`` the chain's last anchor keeps its "not" (``... lorpus not floral``).
    negation: bool = True
    #: Where the answer line is not itself the conclusion (ProntoQA's ``### True``), write the trace's
    #: last step before it (``Stella is not floral.``), as CoT ends: with the chain alone the True/False
    #: read-out was not learnt (every answer "False") although 88% of the chains were exactly right.
    conclusion: bool = True
    #: ProsQA/ProntoQA: write the node each step arrives at (``anchors.logic_walk``) instead of each node
    #: once, so a written search's back-ups stay in the chain (``Rex rempus impus rempus lempus``): every
    #: next node is then a child or the parent of the one before, as in the search it abbreviates.
    revisits: bool = False
    #: With ``revisits``: write ``Back`` before a node the walk returns to (``Rex rempus impus Back rempus
    #: lempus``), the word the ``dfs`` trace backs up with, so a back-up reads apart from a step down (two
    #: tokens more per back-up with the logic backbones' tokenizer).
    mark_backups: bool = False
    #: With ``mark_backups``: ``word`` writes ``Back <node>``; ``token`` glues the one added token ``[Back]``
    #: to the node backed up from (``Rex rempus impus[Back] rempus lempus``): one token a back-up on any
    #: tokenizer, a new embedding where ``Back`` is a word the backbone read in its pretraining searches.
    backup_marker: str = "word"
    #: With ``backup_marker: token``: ``mean`` starts ``[Back]``'s embedding where resizing puts a new row (the
    #: vocabulary's mean); ``word`` starts it as the mean of the embeddings of `` Back``'s tokens, so the marker
    #: begins as the word the backbone read at every back-up of its pretraining searches.
    backup_marker_init: str = "mean"
    #: With ``backup_marker: token``: how many ``[Back]`` tokens a back-up writes (``impus[Back][Back] rempus``
    #: at 2). The word ``Back`` is two tokens with the logic tokenizer; a width of 2 gives the fresh marker the
    #: word's extra position, to tell the position apart from the word's pretrained meaning.
    backup_marker_width: int = 1
    #: With ``backup_marker: word``: the word written before a node backed up to (``Back`` by default, the word
    #: the ``dfs`` trace and ``logic-gpt2-search``'s pretraining searches back up with). ``B`` is one token with
    #: the logic backbones' tokenizer (``ĠB``, the first of ``Back``'s two): a back-up for one token, the
    #: pretrained token kept, to tell what the word's pretraining carries apart from what its length does.
    #: A word of the question (a name or concept) is refused at render: its back-ups would read as steps.
    backup_word: str = BACK_WORD
    #: ProsQA: ``false`` ends the target at ``[EoA]`` (``Tom terpus lempus[EoA]``), without the answer line
    #: (``### Tom is a lempus.``, ten tokens with the logic tokenizer, ``###`` alone three): the chain's last
    #: node is the answer, and the task's extractor reads the last option named. A chain that stops short of an
    #: option then has no answer (graded wrong) where the answer line could still guess.
    answer_line: bool = True

    def __post_init__(self) -> None:
        self._require_int("max_anchors", 1, nullable=True)
        for key in ("negation", "conclusion", "revisits", "mark_backups", "answer_line"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"method anchor_chain: option {key} must be true or false, got {getattr(self, key)!r}")
        if self.mark_backups and not self.revisits:
            raise ConfigError("method anchor_chain: option mark_backups needs revisits: true (only a walk backs up)")
        self._require_choice("backup_marker", BACKUP_MARKERS)
        if self.backup_marker != "word" and not self.mark_backups:
            raise ConfigError("method anchor_chain: option backup_marker needs mark_backups: true")
        self._require_choice("backup_marker_init", MARKER_INITS)
        if self.backup_marker_init != "mean" and self.backup_marker != "token":
            raise ConfigError("method anchor_chain: option backup_marker_init needs backup_marker: token")
        self._require_int("backup_marker_width", 1)
        if self.backup_marker_width != 1 and self.backup_marker != "token":
            raise ConfigError("method anchor_chain: option backup_marker_width needs backup_marker: token")
        if not isinstance(self.backup_word, str) or not re.fullmatch(r"[A-Za-z]+", self.backup_word):
            raise ConfigError(f"method anchor_chain: option backup_word must be one word of letters, got {self.backup_word!r}")
        if self.backup_word != BACK_WORD and not (self.mark_backups and self.backup_marker == "word"):
            raise ConfigError("method anchor_chain: option backup_word needs mark_backups: true and backup_marker: word")
        if not self.answer_line and self.max_anchors is not None:
            raise ConfigError("method anchor_chain: option answer_line: false needs the whole chain (max_anchors: null), "
                              "whose last node is the answer")
        super().__post_init__()

    def render(self, example: Example, task: Any = None) -> Rendered:
        name = task_name_of(task, example)
        prompt = (example.question or "").strip() + "\n" + BOA
        steps = self.steps_of(example)
        if self.mark_backups and self.backup_marker == "word" and re.search(rf"\b{self.backup_word}\b", prompt):
            raise ConfigError(f"method anchor_chain: backup_word {self.backup_word!r} is a word of the question of "
                              f"example {example.id!r}, so its back-ups would read as steps; choose another word")
        anchors = self._walk(steps, name) if self.revisits else extract_anchors(example, name, max_anchors=self.max_anchors)
        if self.negation and anchors and steps and re.search(r"\bnot\s+" + re.escape(anchors[-1]), steps[-1]):
            anchors[-1] = "not " + anchors[-1]
        if not self.answer_line:
            require_prosqa_without_answer_line("anchor_chain", name, "anchors")
            return Rendered(prompt=prompt, target=" ".join(anchors) + EOA, anchors=[])
        chain = " ".join(anchors) + EOA + "\n"
        if self.conclusion and name == "prontoqa" and steps:
            chain += steps[-1] + "\n"
        return Rendered(prompt=prompt, target=chain + answer_line(example, name), anchors=[])

    def _walk(self, steps: list[str], name: str | None) -> list[str]:
        if name not in ("prosqa", "prontoqa"):
            raise ConfigError(f"method anchor_chain: option revisits needs a ProsQA/ProntoQA trace, not task {name!r}")
        walk = logic_walk(steps)
        walk = walk[: self.max_anchors] if self.max_anchors is not None else walk
        if not self.mark_backups:
            return walk
        # a search steps down only to new nodes: a node written before is a back-up
        backs = [node in walk[:i] for i, node in enumerate(walk)]
        if self.backup_marker == "word":
            return [f"{self.backup_word} {node}" if back else node for node, back in zip(walk, backs)]
        marker = BACK_TOKEN * self.backup_marker_width
        return [node + marker if i + 1 < len(walk) and backs[i + 1] else node for i, node in enumerate(walk)]

    @property
    def added_tokens(self) -> tuple[str, ...]:
        return (BACK_TOKEN,) if self.mark_backups and self.backup_marker == "token" else ()

    @property
    def added_token_inits(self) -> dict[str, str]:
        return {BACK_TOKEN: " " + BACK_WORD} if self.added_tokens and self.backup_marker_init == "word" else {}
