"""Numbers in model output: the value an answer commits to, the result a sentence states, and
the part of a capped completion that was written before it fell into a repetition loop.

Three pieces the GSM8K extractors (:mod:`anchored_reasoning.tasks.extract`) build on:

* :func:`chain_value`: the value of the arithmetic chain that starts at a position,
  ``20 * $40 = $800`` -> ``800``, ``20 * $40`` -> ``800``, ``2 * 1.5 = 2 bolts`` -> ``2``
  (what the text states after its last ``=``, evaluated when that is itself an expression;
  never the first operand). Operators: ``+ - * x × · / ÷``, ``\\times \\cdot \\div``,
  parentheses; numbers may carry ``$``, thousands commas, ``%`` (dropped) and a unit of up to
  three words between a number and the next operator (``20 candles * $2.00``). Exact rational
  arithmetic; a value is returned as an integer, a terminating decimal or ``p/q``.
* :func:`result_sentence_value`: the number the last sentence holding a number states as its
  result: the last clause of that sentence (after ``, so`` / ``, which`` / ``; ``), a leading
  ``In 4 weeks,`` phrase skipped, then the chain starting at its first number
  (``So Janet makes $18 every day.`` -> ``18``; ``So, she will spend $900 after 60 days.`` -> ``900``).
* :func:`committed_prefix`: for a completion cut by the token cap, the text before its
  repetition loop (digits masked, so counting loops count) plus one copy of the loop's unit,
  with the unfinished last sentence dropped.

Every function is linear in the text (the loop search looks at the last 8,000 characters and
units of at most 400), so hostile or junk output costs milliseconds.
"""
from __future__ import annotations

import re
from fractions import Fraction

NUMBER = r"-?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_NUMBER_AT = re.compile(r"(?<![\w.])(" + NUMBER + r")(?!\d)(\s*%)?")
_NUMBER_ANY = re.compile(r"(?<![\w.])" + NUMBER + r"(?!\d)")
_SPACE = re.compile(r"[ \t]*+")
_OP = r"(?:\\times|\\cdot|\\div|[-+*/×·÷=]|[xX](?=[ \t]*+[-$(\d]))"
_OPERATOR = re.compile(r"[ \t]*+(" + _OP + r")")
# a unit between a number and the next operator: "20 candles * $2", "4 hours x 30", "30mph / 2"
_UNIT = re.compile(r"(?:[ \t]++[A-Za-z][A-Za-z'-]*+){1,3}(?=[ \t]*+" + _OP + r")")
_UNIT_GLUED = re.compile(r"[A-Za-z]{1,6}+(?=[ \t]*+" + _OP + r")")
_MULTIPLY = {"*", "x", "X", "×", "·", "\\times", "\\cdot"}
_DIVIDE = {"/", "÷", "\\div"}
#: How far a chain may run (characters): answer chains are short, junk is not.
MAX_CHAIN = 300


def normalize_number(text: str) -> str | None:
    """``"$1,000."`` -> ``"1000"``, ``"-3.50"`` -> ``"-3.50"``; None if not a number."""
    t = text.strip().rstrip(".").replace("$", "").replace(",", "").replace(" ", "")
    t = t.replace("\\!", "")
    if re.fullmatch(r"-?\d+(\.\d+)?", t):
        return t
    return None


def format_value(value: Fraction) -> str:
    """``Fraction(800)`` -> ``"800"``, ``Fraction(5, 2)`` -> ``"2.5"``, ``Fraction(1, 3)`` -> ``"1/3"``."""
    if value.denominator == 1:
        return str(value.numerator)
    d = value.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    if d == 1:
        digits = 0
        scaled = value
        while scaled.denominator != 1:
            scaled *= 10
            digits += 1
        sign = "-" if scaled < 0 else ""
        s = str(abs(scaled.numerator)).rjust(digits + 1, "0")
        return f"{sign}{s[:-digits]}.{s[-digits:]}"
    return f"{value.numerator}/{value.denominator}"


class _Parser:
    """Recursive-descent parser over ``text[pos:end]``: expr = term (+|- term)*,
    term = factor (*|/ factor)*, factor = number [unit] | ( expr )."""

    def __init__(self, text: str, pos: int, end: int) -> None:
        self.text, self.pos, self.end = text, pos, end

    def _number(self) -> Fraction | None:
        m = _NUMBER_AT.match(self.text, self.pos, self.end)
        if m is None:
            return None
        value = normalize_number(m.group(1))
        if value is None:
            return None
        self.pos = m.end()
        unit = _UNIT.match(self.text, self.pos, self.end) or _UNIT_GLUED.match(self.text, self.pos, self.end)
        if unit is not None:
            self.pos = unit.end()
        return Fraction(value)

    def _factor(self, depth: int) -> Fraction | None:
        start = self.pos
        m = _SPACE.match(self.text, self.pos, self.end)
        self.pos = m.end()
        if self.pos < self.end and self.text[self.pos] == "(" and depth < 8:
            self.pos += 1
            value = self._expr(depth + 1)
            m = _SPACE.match(self.text, self.pos, self.end)
            if value is not None and m.end() < self.end and self.text[m.end()] == ")":
                self.pos = m.end() + 1
                return value
            self.pos = start
            return None
        value = self._number()
        if value is None:
            self.pos = start
        return value

    def _operator(self, allowed: set[str]) -> str | None:
        m = _OPERATOR.match(self.text, self.pos, self.end)
        if m is None or m.group(1) not in allowed:
            return None
        self.pos = m.end()
        return m.group(1)

    def _term(self, depth: int) -> Fraction | None:
        value = self._factor(depth)
        while value is not None:
            before = self.pos
            op = self._operator(_MULTIPLY | _DIVIDE)
            if op is None:
                break
            right = self._factor(depth)
            if right is None:
                self.pos = before  # a dangling operator ("12 miles / hour") ends the term
                break
            if op in _DIVIDE:
                if right == 0:
                    return None
                value /= right
            else:
                value *= right
        return value

    def _expr(self, depth: int = 0) -> Fraction | None:
        value = self._term(depth)
        while value is not None:
            before = self.pos
            op = self._operator({"+", "-"})
            if op is None:
                break
            right = self._term(depth)
            if right is None:
                self.pos = before
                break
            value = value + right if op == "+" else value - right
        return value

    def chain(self) -> Fraction | None:
        value = self._expr()
        last = value
        while last is not None:
            before = self.pos
            if self._operator({"="}) is None:
                break
            nxt = self._expr()
            if nxt is None:  # "5 * 4 = " with nothing after: the last stated side stands
                self.pos = before
                break
            last = nxt
        return last


# skipped before a chain: spaces, bold asterisks, an inline-math opener ("answer is \\( 18 \\)")
_CHAIN_START = re.compile(r"(?:[ \t*]++|\\[(\[]\s*+)*+")


def chain_value(text: str, pos: int = 0, end: int | None = None) -> str | None:
    """The value of the ``=`` chain starting at ``text[pos]`` (spaces and ``*`` skipped), or
    None when no number starts there. See the module docstring."""
    stop = min(len(text) if end is None else end, pos + MAX_CHAIN)
    start = _CHAIN_START.match(text, pos, stop)
    value = _Parser(text, start.end() if start else pos, stop).chain()
    return None if value is None else format_value(value)


# ----------------------------------------------------------------------------- LaTeX

_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")


def latex_to_plain(text: str) -> str:
    """Boxed contents as plain arithmetic: ``\\frac{a}{b}`` -> ``(a)/(b)``, ``\\text{ dollars}``
    -> `` dollars``, ``\\$`` -> ``$``, ``1{,}000`` -> ``1,000``; spacing commands removed."""
    t = text.replace("\\$", "$").replace("{,}", ",").replace("\\%", "%")
    t = re.sub(r"\\[,!;: ]|\\quad|\\left|\\right", "", t)
    for _ in range(3):
        t = _FRAC.sub(r"(\1)/(\2)", t)
        t = _TEXT.sub(r" \1", t)
    return t.strip().strip("$").strip()


# ----------------------------------------------------------------------------- sentences

_SENTENCE_END = re.compile(r"(?<=[.!?])[ \t]++|\n++")
# where a result clause starts: ", so she ...", ", which is ...", "; ", "... each so she ...",
# "... and he made ..."
_CLAUSE = re.compile(
    r"(?i:[,;:]\s*(?:and\s+)?(?:so|which|thus|therefore|hence|giving|making)\b)|;\s*"
    r"|(?<=[a-z0-9])\s+so\s+(?=[a-z])"
    r"|(?<=[\w%])\s+and\s+(?=(?:he|she|they|it|we|you|the|his|her|their|its)\s)"
)
# a leading condition before the result: "In 4 weeks, ...", "after 4 rounds he has ...", "At $2 each, ..."
_LEADING = re.compile(
    r"(?i)^\s*(?:(?:so|therefore|thus|hence|finally|then|now|overall|altogether)\b,?\s*)?"
    r"(?:(?:in|after|for|over|within|by|at|on|during|every|each|with)\b[^,\d\n]{0,20}?"
    r"-?\$?\d[\d,.]*+%?(?:\s++[A-Za-z]++){0,2}+,?\s*"
    r"|(?:in|after|for|over|within|by|at|on|during|every|each|with)\b[^,\n]{0,60},\s*)"
)


def _sentences(text: str) -> list[tuple[int, int]]:
    spans, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        if m.start() > start:
            spans.append((start, m.start()))
        start = m.end()
    if start < len(text):
        spans.append((start, len(text)))
    return spans


def result_sentence_value(text: str) -> str | None:
    """The result the last sentence holding a number states (see the module docstring)."""
    for start, end in reversed(_sentences(text)):
        sentence = text[start:end]
        if not _NUMBER_ANY.search(sentence):
            continue
        cuts = [m.end() for m in _CLAUSE.finditer(sentence)]
        clauses = [sentence[a:b] for a, b in zip([0, *cuts], [*cuts, len(sentence)])]
        for clause in reversed(clauses):
            lead = _LEADING.match(clause)
            offset = lead.end() if lead and _NUMBER_ANY.search(clause, lead.end()) else 0
            m = _NUMBER_ANY.search(clause, offset)
            if m is not None:
                return chain_value(clause, m.start())
    return None


# ----------------------------------------------------------------------------- the token cap

#: Only the end of a capped completion is searched for a loop, with units up to this long.
_LOOP_WINDOW = 8000
_MAX_UNIT = 400


def _mask_digits(text: str) -> tuple[str, list[int]]:
    """Digit runs -> one ``#``; and where each masked character starts in ``text``."""
    out, where, i = [], [], 0
    for m in re.finditer(r"\d+", text):
        for j in range(i, m.start()):
            out.append(text[j])
            where.append(j)
        out.append("#")
        where.append(m.start())
        i = m.end()
    for j in range(i, len(text)):
        out.append(text[j])
        where.append(j)
    return "".join(out), where


def _periodic_suffix(s: str, p: int) -> int:
    """Length of the longest suffix of ``s`` with period ``p``, 0 if under two periods. Binary
    search: a suffix with period p keeps it when shortened, and each test is one C compare."""
    n = len(s)
    if n < 2 * p or s[n - p :] != s[n - 2 * p : n - p]:
        return 0
    lo, hi = 2 * p, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if s[n - mid + p :] == s[n - mid : n - p]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def repetition_loop(text: str, min_repeats: float = 2.5, min_chars: int = 40) -> tuple[int, int] | None:
    """``(loop_start, unit_end)`` of a repetition loop that runs to the end of ``text``, or None.

    Digits are masked first, so ``The answer is 6. The answer is 7. ...`` is a loop. The loop
    covers at least ``min_repeats`` copies of its unit and ``min_chars`` characters;
    ``unit_end`` is where the first copy ends, both as positions in ``text``.
    """
    base = max(0, len(text) - _LOOP_WINDOW)
    masked, where = _mask_digits(text[base:])
    best: tuple[int, int] | None = None
    for p in range(1, min(_MAX_UNIT, len(masked) // 2) + 1):
        length = _periodic_suffix(masked, p)
        if length >= max(min_repeats * p, min_chars) and (best is None or length > best[0]):
            best = (length, p)
    if best is None:
        return None
    length, p = best
    start = len(masked) - length
    unit_end = where[start + p] if start + p < len(where) else len(masked)
    return base + where[start], base + unit_end


def committed_prefix(text: str) -> str:
    """What a completion cut by the token cap committed to: the text before its repetition
    loop plus one copy of the loop's unit, without the unfinished last sentence."""
    loop = repetition_loop(text)
    if loop is not None:
        start, unit_end = loop
        # the first copy may stop just short of its sentence's end ("The answer is 5|.")
        m = _BOUNDARY.search(text, unit_end, unit_end + (unit_end - start))
        text = text[: m.end() if m else unit_end]
    ends = [m.end() for m in _BOUNDARY.finditer(text)]
    return text[: ends[-1]] if ends else ""


_BOUNDARY = re.compile(r"[.!?](?=\s|$)|\n")
