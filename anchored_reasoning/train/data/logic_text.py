"""The logic-text document format the shipped logic backbones (``logic-gpt2*``, ``logic-mdlm``, ``logic-adlm``)
were pretrained on, and its reader.

A question-free document is the facts of a generated problem, a newline, and a derivation that follows
them (:func:`document`: "Sally is a scrompus. Every scrompus is a rempus. ..."); a question-aware one
keeps the question and ends with `` ### `` and the answer (:func:`qa_document`). Both join a derivation's
steps with :data:`STEP_SEPARATOR`, which each backbone's ``backbone.json`` records so that a fine-tune can
write its steps the way the backbone read them (``train.separator``). The pretraining itself (corpora,
tokenizer, loop) is archived with the commands that rebuilt each asset in ``research/backbones/``.
"""
from __future__ import annotations

import random

#: What joins a derivation's steps in every pretraining document; ``backbone.json`` records it so a fine-tune
#: can write its steps the way the backbone read them (``train.ar`` warns where the method's default differs).
STEP_SEPARATOR = " "

#: Document kinds of ProsQA problems whose derivation is rewritten, by the trace order
#: (:mod:`anchored_reasoning.generators.traces`) that writes it.
TRACED_KINDS = {"prosqa_back": "options_backward", "prosqa_dfs": "dfs"}


def facts_of(question: str, task: str) -> str:
    """The question without its final query sentence."""
    marker = " Is " if task == "prosqa" else " True or false:"
    cut = question.rfind(marker)
    return question[:cut].strip() if cut > 0 else question.strip()


def document(example, task: str) -> str:
    """One logic-text document: facts, newline, derivation (no question, no answer marker)."""
    steps = STEP_SEPARATOR.join(s.strip() for s in (example.steps or []))
    tail = steps
    if task == "prosqa" and example.answer and example.answer not in steps:
        tail = f"{steps} {example.answer}".strip()
    return f"{facts_of(example.question, task)}\n{tail}"


def qa_document(example, task: str, rng: random.Random | None = None) -> str:
    """Facts + question, newline, derivation, `` ### `` answer (task ``drill``: facts, newline, 6 facts
    of the problem restated in random order -- each a lookup of the object from the subject; ``rdrill``:
    the same headed by their objects, ``"<object>: <fact>"`` -- each a lookup of the subject from the object;
    ``prosqa_back``: the derivation is the ``options_backward`` trace; ``prosqa_dfs``: the ``dfs`` trace)."""
    if task in ("drill", "rdrill"):
        from anchored_reasoning.generators.traces import proof_sentences

        head = facts_of(example.question, "prosqa")
        facts = proof_sentences(head)
        pick = (rng or random.Random(0)).sample(facts, min(6, len(facts)))
        if task == "rdrill":
            pick = [f"{f[:-1].split()[-1]}: {f}" for f in pick]
        return f"{head}\n{' '.join(pick)}"
    if task in TRACED_KINDS:
        from anchored_reasoning.generators.traces import apply_trace

        (example,) = apply_trace([example], "prosqa", TRACED_KINDS[task])
    steps = STEP_SEPARATOR.join(s.strip() for s in (example.steps or []))
    return f"{example.question.strip()}\n{steps} ### {example.answer.strip()}"


def document_answer(text: str) -> str:
    """The answer a continuation in :func:`qa_document`'s format gives: the last word of the line after
    `` ### `` (``lempus`` in ``... ### Tom is a lempus.``, ``True`` for ProntoQA), or '' with no ``###``."""
    if "###" not in text:
        return ""
    words = text.split("###", 1)[1].strip().split("\n")[0].rstrip(".").split()
    return words[-1] if words else ""


def encode(tokenizer, doc: str) -> tuple[list[int], int]:
    """Token ids of a document (+ EOS) and the length of its facts part (up to and including the newline)."""
    facts, derivation = doc.split("\n", 1)
    head = tokenizer(facts + "\n")["input_ids"]
    return head + tokenizer(derivation)["input_ids"] + [tokenizer.eos_token_id], len(head)
