"""Answer extractors: completion text -> the answer string it commits to, or None.

Each extractor is a pure function ``(completion, example) -> str | None`` registered in
``EXTRACTORS`` and referenced by name from a task YAML (``extractor:``). The rules:

* ``gsm8k_answer`` (the GSM8K headline, docs/tasks.md): the last final-answer marker
  (below); without one, the result the last sentence holding a number states
  (``So Janet makes $18 every day.`` -> 18, :func:`~anchored_reasoning.tasks.numeric.result_sentence_value`).
  A completion cut by the token cap (``finish_reason="length"``) is graded on markers in
  its committed prefix only (before a repetition loop, without the unfinished last
  sentence), never on the number the cap happened to leave at its end.
* ``gsm8k_strict``: an explicit final-answer marker, the **last** one in the text:
  ``#### N`` (GSM8K's own format, lm-eval's strict match), ``The (final) answer is N``,
  ``Answer: N`` or ``\\boxed{N}``. Anything else -> None. A marker followed by an
  arithmetic chain commits to the chain's value (``The answer is 20 * $40 = $800.`` -> 800,
  ``\\boxed{20 \\times 40}`` -> 800), never to its first operand.
* ``last_number`` (GSM8K flexible): the last number anywhere in the text.
  Numbers may carry ``$``, thousands commas, a sign, decimals, a trailing period;
  the result is normalised (``$1,000.`` -> ``1000``).
* ``math_final`` (AIME): the content of the last ``\\boxed{...}`` (braces balanced);
  else the last ``answer is X`` / ``Answer: X`` / ``#### X``. Returns the raw answer
  text; the grader checks it is an integer 0-999.
* ``choice_letter`` (GPQA, A-D): most explicit form wins, last occurrence within a form:
  1. ``\\boxed{C}`` (also ``\\boxed{(C)}``, ``\\boxed{\\text{C}}``)
  2. an answer phrase: ``Answer: C``, ``answer is (C)``, ``correct option is **C**``, ...
  3. bold ``**C**`` / ``**(C)**`` / ``**C)**`` / ``**C.**``
  4. a parenthesised ``(C)``
  5. a line starting with ``C.``, ``C)`` or ``C:`` (``C. text``)
  6. the whole completion is the letter (``C`` / ``C.``)
  Letters are upper-case, except right after ``Answer:`` and inside ``\\boxed{}``. A letter that is
  no option (``\\boxed{E}`` or ``The answer is E`` of four choices) is extracted and grades wrong.
* ``true_false`` (ProntoQA): the last whole word ``true``/``false`` (any case) -> "True"/"False";
  with neither word, the one-word answer a line ends on (``### Unknown``, ``The answer is
  unknown.``, ``Answer: maybe``) as written, which grades wrong; else None.
* ``prosqa_concept`` (ProsQA): the last ``<entity> is a(n) <concept>`` whose concept is one
  of the two options (``meta["answer_concept"]``/``meta["neg_concept"]``); else the last
  option word not preceded by "not"; else the concept of the last ``<entity> is a(n) <concept>``
  (lower-case), an answer that is neither option and grades wrong; else None.

None means the completion commits to no answer at all (counted as "no answer" in summaries); an
answer outside the options is extracted, so it counts as a wrong answer.
* ``none``: the completion itself (code tasks grade by execution).
"""
from __future__ import annotations

import re
from collections.abc import Callable

from anchored_reasoning.tasks.numeric import (
    NUMBER,
    chain_value,
    committed_prefix,
    latex_to_plain,
    normalize_number,
    result_sentence_value,
)
from anchored_reasoning.types import Example

Extractor = Callable[[str, Example], "str | None"]

_NUMBER_RE = re.compile(r"(?<![\w.])" + NUMBER + r"(?![\d])")


def boxed_spans(text: str) -> list[tuple[int, int, int]]:
    """``(position, content_start, content_end)`` of every ``\\boxed{...}`` / ``\\fbox{...}``
    with balanced braces, ordered by position.

    One pass with a brace stack and no slicing, so deeply nested or unclosed boxes cost
    linear time; callers slice only the contents they need.
    """
    opening = {m.end() - 1: m.start() for m in re.finditer(r"\\(?:boxed|fbox)[ \t]*+\{", text)}
    if not opening:
        return []
    stack: list[int] = []
    out: list[tuple[int, int, int]] = []
    for i, char in enumerate(text):
        if char == "{":
            stack.append(i)
        elif char == "}" and stack:
            j = stack.pop()
            if j in opening:
                out.append((opening[j], j + 1, i))
    out.sort()
    return out


def find_boxed(text: str, max_len: int | None = None) -> list[str]:
    """Contents of every ``\\boxed{...}`` / ``\\fbox{...}`` with balanced braces, in order
    (only those of at most ``max_len`` characters, when given)."""
    return [
        text[a:b].strip() for _, a, b in boxed_spans(text) if max_len is None or b - a <= max_len
    ]


def _unwrap_latex(text: str) -> str:
    t = text.strip()
    for _ in range(3):
        m = re.fullmatch(r"\\(?:text|textbf|mathrm|mathbf)\s*\{(.*)\}", t, re.S)
        if not m:
            break
        t = m.group(1).strip()
    return t.strip().strip("$").strip()


# ----------------------------------------------------------------------------- numbers

# Where an explicit final answer starts. Possessive quantifiers (*+, ++) keep these linear
# on long runs of spaces or asterisks.
_STRICT_MARKERS = [
    re.compile(r"####[\s*]*+"),
    re.compile(r"(?i)\banswer\s++is[\s:*]*+"),
    re.compile(r"(?i)\banswer[ \t]*+:[\s*]*+"),
]


def _marker_answers(completion: str) -> list[tuple[int, str]]:
    """``(position, value)`` of every final-answer marker followed by a number or an
    arithmetic chain (its value: ``The answer is 20 * $40 = $800`` -> 800)."""
    candidates: list[tuple[int, str]] = []
    for pattern in _STRICT_MARKERS:
        for m in pattern.finditer(completion):
            value = chain_value(completion, m.end())
            if value is not None:
                candidates.append((m.start(), value))
    for start, a, b in boxed_spans(completion):
        if b - a <= 200:  # longer contents are not one answer
            value = chain_value(latex_to_plain(_unwrap_latex(completion[a:b])))
            if value is not None:
                candidates.append((start, value))
    return candidates


def gsm8k_strict(completion: str, example: Example | None = None) -> str | None:
    candidates = _marker_answers(completion)
    return max(candidates)[1] if candidates else None


#: Finish reasons that mean the token budget, not the model, ended a completion: "length"
#: (every backend), and the diffusion backend's "shrunk" / "truncated_prompt" (a window cut to
#: fit the context that still ran out).
CAPPED_FINISH_REASONS = frozenset({"length", "shrunk", "truncated_prompt"})


def gsm8k_answer_rule(completion: str, finish_reason: str | None = None) -> tuple[str | None, str]:
    """The GSM8K headline answer and the rule that gave it: ``"marker"``, ``"sentence"``,
    ``"capped"`` (cut by the token cap, see :data:`CAPPED_FINISH_REASONS`: markers in the
    committed prefix only) or ``"none"``."""
    if finish_reason in CAPPED_FINISH_REASONS:
        candidates = _marker_answers(committed_prefix(completion))
        return (max(candidates)[1], "capped") if candidates else (None, "none")
    candidates = _marker_answers(completion)
    if candidates:
        return max(candidates)[1], "marker"
    value = result_sentence_value(completion)
    return (value, "sentence") if value is not None else (None, "none")


def gsm8k_answer(completion: str, example: Example | None = None, finish_reason: str | None = None) -> str | None:
    return gsm8k_answer_rule(completion, finish_reason)[0]


def last_number(completion: str, example: Example | None = None) -> str | None:
    matches = _NUMBER_RE.findall(completion)
    for raw in reversed(matches):
        value = normalize_number(raw)
        if value is not None:
            return value
    return None


# ----------------------------------------------------------------------------- AIME


_FINAL_PHRASES = [
    re.compile(r"(?i)\banswer\s++is[\s:$]*+([^\s$]+)"),
    re.compile(r"(?i)\banswer[ \t]*+:[\s$]*+([^\s$]+)"),
    re.compile(r"####\s*+([^\s]+)"),
]


def math_final(completion: str, example: Example | None = None) -> str | None:
    spans = boxed_spans(completion)
    if spans:
        _, a, b = spans[-1]
        value = _unwrap_latex(completion[a:b])
        return value or None
    candidates: list[tuple[int, str]] = []
    for pattern in _FINAL_PHRASES:
        for m in pattern.finditer(completion):
            value = m.group(1).strip().rstrip(".,;:!*").lstrip("*")
            if value:
                candidates.append((m.start(), value))
    if not candidates:
        return None
    return max(candidates)[1]


# ----------------------------------------------------------------------------- letters

_L = "[A-J]"
_ANSWER_PHRASE = re.compile(
    r"(?i:\b(?:answer|option|choice)\b(?:\s++(?:is|would\s++be|should\s++be)\b)?)"
    r"[\s:*(\[]*+(" + _L + r")(?![A-Za-z])([ \t]++[a-z])?"
)
_LOWER_ANSWER = re.compile(r"(?i:\banswer[ \t]*+:)[ \t*(]*+([a-j])[)*. \t]*+$", re.M)
_BOLD = re.compile(r"\*\*[ \t]*+\(?(" + _L + r")\)?[.:)]?[ \t]*+\*\*")
_PAREN = re.compile(r"\((" + _L + r")\)")
_LINE_START = re.compile(r"(?m)^[ \t]*+(" + _L + r")[.):](?:\s|$)")


def choice_letter(completion: str, example: Example | None = None) -> str | None:
    n = len(example.choices) if example is not None and example.choices else 4
    valid = "ABCDEFGHIJ"[:n]
    # 1. a boxed letter: the last one is the final commitment, an option or not
    for content in reversed(find_boxed(completion, max_len=32)):
        letter = _unwrap_latex(content).strip("()[] .").upper()
        if len(letter) == 1 and letter in "ABCDEFGHIJ":
            return letter
    # 2. an answer phrase; "The answer is A bit ..." is the article, not a letter
    phrases = [
        (m.start(), m.group(1))
        for m in _ANSWER_PHRASE.finditer(completion)
        if not (m.group(1) == "A" and m.group(2))
    ]
    phrases += [(m.start(), m.group(1).upper()) for m in _LOWER_ANSWER.finditer(completion)]
    named = [p for p in phrases if p[1] in valid]
    if named:
        return max(named)[1]
    # 3.-5. bold, parenthesised, line start
    for pattern in (_BOLD, _PAREN, _LINE_START):
        found = [m.group(1) for m in pattern.finditer(completion) if m.group(1) in valid]
        if found:
            return found[-1]
    # 6. the completion is just the letter
    whole = completion.strip().strip("*()[]. ")
    if len(whole) == 1 and whole in valid:
        return whole
    # an answer phrase naming a letter that is no option ("The answer is E" of four): a wrong answer
    outside = [p for p in phrases if p[1] not in valid and p[1] != "I"]
    return max(outside)[1] if outside else None


# ----------------------------------------------------------------------------- logic tasks


#: An explicit final answer that is one word: ``### X``, ``The answer is X``, ``Answer: X``.
_ONE_WORD_ANSWER = re.compile(
    r"(?i)(?:###|\banswer\s++is|\banswer[ \t]*+:)[ \t*\"']*+([A-Za-z]++)[ \t*\"']*+[.!]?[ \t*]*+$", re.M
)


def true_false(completion: str, example: Example | None = None) -> str | None:
    matches = re.findall(r"(?i)\b(true|false)\b", completion)
    if matches:
        return matches[-1].capitalize()
    # neither option, but an answer all the same ("The answer is Unknown."): a wrong answer, not none
    named = _ONE_WORD_ANSWER.findall(completion)
    return named[-1] if named else None


def prosqa_concept(completion: str, example: Example | None = None) -> str | None:
    if example is None:
        return None
    options = [example.meta.get("answer_concept"), example.meta.get("neg_concept")]
    options = [o for o in options if o]
    if not options:
        return None
    lowered = {o.lower(): o for o in options}
    entity = example.meta.get("entity")
    subject = re.escape(entity) if entity else r"\w+"
    sentences = re.findall(r"(?i)\b" + subject + r"\s+is\s+an?\s+([A-Za-z]+)", completion)
    for concept in reversed(sentences):
        if concept.lower() in lowered:
            return lowered[concept.lower()]
    alternation = "|".join(re.escape(o) for o in options)
    mentions = [
        m
        for m in re.finditer(r"(?i)\b(" + alternation + r")\b", completion)
        if not re.search(r"(?i)\bnot\s+(?:an?\s+)?$", completion[max(0, m.start() - 10) : m.start()])
    ]
    if mentions:
        return lowered[mentions[-1].group(1).lower()]
    # neither option named, but a concept all the same ("Sally is a rempus."): a wrong answer, not none
    return sentences[-1].lower() if sentences else None


def whole_completion(completion: str, example: Example | None = None) -> str | None:
    return completion if completion.strip() else None


EXTRACTORS: dict[str, Extractor] = {
    "gsm8k_answer": gsm8k_answer,
    "gsm8k_strict": gsm8k_strict,
    "last_number": last_number,
    "math_final": math_final,
    "choice_letter": choice_letter,
    "true_false": true_false,
    "prosqa_concept": prosqa_concept,
    "none": whole_completion,
}
