"""The words of generated logic text (ProsQA / ProntoQA): the back-up and step forms a written search uses,
and the nodes and walks read back from a trace. The bottom of the logic-text modules: the trace writers
(:mod:`anchored_reasoning.generators.traces`) and the anchor extractors (:mod:`anchored_reasoning.anchors`)
both import it, and it imports neither.
"""
from __future__ import annotations

import re
from typing import Hashable, Iterable, Sequence, TypeVar

T = TypeVar("T", bound=Hashable)

#: Words of the ProntoQA / ProsQA templates that are never reasoning-path nodes.
LOGIC_STOPWORDS = frozenset(
    """every each all is are a an not no the and or of true false if then so
    also either neither nor what which who whether it its that this these those""".split()
)

#: The word a search backs up with: the ``dfs`` step ``Back to <parent>.``, and a walk's back-up (the anchor
#: chain with ``mark_backups``: ``Back <parent>``).
BACK_WORD = "Back"
#: A ``dfs`` back-up step as written (``traces.prosqa_dfs``) and as read back (anchors, search replay): the parent.
BACK_UP = re.compile(BACK_WORD + r" to (\w+)\.")
#: A step down as read back (the probes, the search replay): ``X is a Y.`` / ``Every X is a Y.`` -> (X, Y).
STEP = re.compile(r"(?:Every )?(\S+) is an? (\S+?)\.?")

_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")


def dedupe(items: Iterable[T]) -> list[T]:
    """``items`` in order, each once."""
    seen: set[T] = set()
    out: list[T] = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def singular(word: str) -> str:
    """Singular of a ProntoQA/ProsQA concept word: ``zumpuses`` -> ``zumpus``, ``cats`` -> ``cat``."""
    lower = word.lower()
    if lower.endswith("uses"):
        return word[:-2]
    if lower.endswith(("ches", "shes", "xes", "sses", "zes")):
        return word[:-2]
    if lower.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if lower.endswith("s") and not lower.endswith(("ss", "us", "is")) and len(word) > 3:
        return word[:-1]
    return word


def logic_nodes(steps: Sequence[str]) -> list[str]:
    """Ordered distinct nodes (entities, concepts, properties) of a ProntoQA/ProsQA trace.

    Entities keep their capital (``Tom``); concepts are lower-cased and singular (``terpus``). A search's
    back-up step (``Back to terpus.``, the ``dfs`` trace of :mod:`anchored_reasoning.generators.traces`)
    names a node already visited and adds none, so the nodes of a written search are those it visited.
    """
    return dedupe(node for nodes in _sentence_nodes(steps) for node in nodes)


def logic_walk(steps: Sequence[str]) -> list[str]:
    """The node each sentence of a ProntoQA/ProsQA trace arrives at, after the first one's subject: the
    walk, one node per step. Unlike :func:`logic_nodes` a node comes back each time the walk returns to
    it, so a written search's back-up (``Back to terpus.``) gives ``terpus`` again; on a proof, whose
    steps each add one node, the two are the same list. A sentence that restates the node the walk is at
    (ProntoQA's ``Stella is a gorpus.`` after ``Zumpuses are gorpuses.``) adds nothing.

    >>> logic_walk(["Rex is a rempus.", "Every rempus is a impus.", "Back to rempus.", "Every rempus is a lempus."])
    ['Rex', 'rempus', 'impus', 'rempus', 'lempus']
    """
    walk: list[str] = []
    for nodes in _sentence_nodes(steps):
        for node in nodes if not walk else nodes[-1:]:
            if not walk or node != walk[-1]:  # a sentence restating where the walk is ("Stella is a gorpus.")
                walk.append(node)
    return walk


def _sentence_nodes(steps: Sequence[str]) -> Iterable[list[str]]:
    """Per sentence of the trace, its nodes in order (a back-up step: the node it returns to)."""
    for step in steps:
        for sentence in re.split(r"(?<=[.!?])\s+", step):
            back = BACK_UP.fullmatch(sentence.strip())
            if back:
                yield [back.group(1)]
                continue
            words = _WORD.findall(sentence)
            nodes = []
            for i, word in enumerate(words):
                if word.lower() in LOGIC_STOPWORDS:
                    continue
                # An entity is capitalised; a sentence-initial capital is an entity only when a
                # singular "is" follows ("Zumpuses are gorpuses." starts with a plural concept).
                nxt = words[i + 1].lower() if i + 1 < len(words) else ""
                nodes.append(word if word[0].isupper() and (i > 0 or nxt == "is") else singular(word).lower())
            yield nodes
