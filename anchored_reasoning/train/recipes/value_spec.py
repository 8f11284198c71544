"""What a config key accepts (:class:`Value`), written by hand or read from a dataclass field's type
(:func:`from_annotation`), the check of one value against it, and the error that names the key, the value
and what it accepts. :mod:`anchored_reasoning.train.recipes.values` holds the recipe's specs."""
from __future__ import annotations

import dataclasses
import difflib
import enum
import re
import types
import typing
from typing import Any, Callable, Mapping, Sequence

from anchored_reasoning.errors import ConfigError

#: a number as a recipe may spell it, also where YAML 1.1 reads a string (``1e-3``)
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


@dataclasses.dataclass(frozen=True)
class Value:
    """What one recipe key accepts. ``kinds``: int, float (an int too), bool, str, mapping, list, any, or
    object (a Python object, not settable from a recipe); a number is within ``low``/``high``
    (exclusive with ``low_open``/``high_open``); a string is one of ``choices`` (a tuple, or a function
    returning one) or matches ``pattern``; ``also``: values accepted besides, which ``note`` explains."""

    kinds: tuple[str, ...]
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[Any, ...] | Callable[[], Sequence[Any]] = ()
    pattern: str | None = None
    says: str = ""  # what ``pattern`` means, or what ``accept`` takes besides the choices
    accept: Callable[[Any], bool] | None = None
    also: tuple[Any, ...] = ()
    note: str = ""
    nullable: bool = False
    item: "Value | None" = None

    def options(self) -> tuple[Any, ...]:
        return tuple(self.choices() if callable(self.choices) else self.choices)

    def expected(self) -> str:
        if self.kinds == ("object",):
            return "null (the field takes a Python object, which a recipe cannot give)"
        parts = [self._kind_text(kind) for kind in self.kinds]
        text = " or ".join(p for p in parts if p)
        if self.also:
            text += ", or " + " or ".join(_show(a) for a in self.also) + (f" ({self.note})" if self.note else "")
        elif self.note:
            text += f" ({self.note})"
        return text + (", or null" if self.nullable else "")

    def _kind_text(self, kind: str) -> str:
        if kind in ("int", "float"):
            return ("an integer" if kind == "int" else "a number") + self._range_text()
        if kind == "str":
            if self.options():
                return "one of " + ", ".join(_show(c) for c in self.options()) + (f" {self.says}" if self.says else "")
            return self.says or "a string"
        if kind == "list":
            return f"a list, each item {self.item.expected()}" if self.item else "a list"
        return {"bool": "true or false", "mapping": "a mapping", "any": "any value", "object": ""}.get(kind, kind)

    def _range_text(self) -> str:
        if self.low is not None and self.high is not None:
            return f" in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f" {'>' if self.low_open else '>='} {_num(self.low)}"
        if self.high is not None:
            return f" {'<' if self.high_open else '<='} {_num(self.high)}"
        return ""

    def check(self, value: Any) -> tuple[bool, Any]:
        """(accepted, the value as the trainer should get it: a number key's ``"1e-3"`` becomes 0.001)."""
        if value is None:
            return self.nullable, value
        if any(type(a) is type(value) and a == value for a in self.also):
            return True, value
        for kind in self.kinds:
            ok, out = self._check_kind(kind, value)
            if ok:
                return True, out
        return False, value

    def _check_kind(self, kind: str, value: Any) -> tuple[bool, Any]:
        if kind == "any":
            return True, value
        if kind == "bool":
            return isinstance(value, bool), value
        if kind == "int":
            return isinstance(value, int) and not isinstance(value, bool) and self._in_range(value), value
        if kind == "float":
            if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
                value = float(value)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and self._in_range(value)
            return ok, value
        if kind == "str":
            if not isinstance(value, str):
                return False, value
            if self.accept is not None and self.accept(value):
                return True, value
            if self.options():
                return value in self.options(), value
            return (self.pattern is None or re.fullmatch(self.pattern, value) is not None), value
        if kind == "mapping":
            return isinstance(value, Mapping), value
        if kind == "list":
            if not isinstance(value, (list, tuple)):
                return False, value
            checked = [self.item.check(v) if self.item else (True, v) for v in value]
            return all(ok for ok, _ in checked), [v for _, v in checked]
        return False, value

    def _in_range(self, x: float) -> bool:
        low_ok = self.low is None or (x > self.low if self.low_open else x >= self.low)
        high_ok = self.high is None or (x < self.high if self.high_open else x <= self.high)
        return bool(low_ok and high_ok)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def _show(value: Any) -> str:
    """A value as a recipe spells it: 'text', null, true, 3."""
    if isinstance(value, str):
        return repr(value)
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _what(value: Any, spec: Value) -> str:
    """`` (a string)`` where the value's type is not one the key takes (a number out of range needs no note)."""
    kinds = {bool: ("a boolean", "bool"), str: ("a string", "str"), float: ("a float", "float"),
             list: ("a list", "list"), dict: ("a mapping", "mapping")}
    name, kind = kinds.get(type(value), ("", ""))
    return f" ({name})" if name and kind not in spec.kinds else ""


def value_error(path: str, value: Any, spec: Value) -> ConfigError:
    """``recipe value <path>=<value>: expected ...``, with a close match among the choices when there is one."""
    close = difflib.get_close_matches(value, [str(c) for c in spec.options()], n=1) if isinstance(value, str) else []
    hint = f"; did you mean {close[0]!r}?" if close else ""
    shown = repr(value) if isinstance(value, str) else _show(value)
    return ConfigError(f"recipe value {path}={shown}{_what(value, spec)}: expected {spec.expected()}{hint}")


# short constructors

def integer(low: int | None = 1, **kw: Any) -> Value:
    """An integer >= ``low`` (1: a count, a size, a number of steps)."""
    return Value(("int",), low=low, **kw)


def number(low: float | None = 0, **kw: Any) -> Value:
    """A number (an int is one too) >= ``low``; ``low_open=True`` for > ``low``."""
    return Value(("float",), low=low, **kw)


def text(**kw: Any) -> Value:
    return Value(("str",), **kw)


def choice(*names: Any, **kw: Any) -> Value:
    return Value(("str",), choices=tuple(names), **kw)


def from_annotation(hint: Any) -> Value:
    """The spec a dataclass field's type gives: ``int | None`` -> an integer or null; an Enum -> its values."""
    kinds: list[str] = []
    choices: tuple[Any, ...] = ()
    also: tuple[Any, ...] = ()
    nullable, item = False, None
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for arg in args:
        origin = typing.get_origin(arg)
        if arg is type(None):
            nullable = True
        elif arg is Any:
            kinds.append("any")
        elif isinstance(arg, type) and issubclass(arg, enum.Enum):
            kinds.append("str")
            choices = tuple(m.value for m in arg)
        elif arg in (bool, int, float, str):
            kinds.append(arg.__name__)
        elif origin is typing.Literal:
            also += typing.get_args(arg)
        elif arg in (list, tuple) or origin in (list, tuple, Sequence):
            kinds.append("list")
            inner = typing.get_args(arg)
            item = from_annotation(inner[0]) if inner else None
        elif arg in (dict, Mapping) or origin in (dict, Mapping):
            kinds.append("mapping")
        else:
            kinds.append("object")
    # an Enum beside str (``SchedulerType | str``): a string must still be one of the Enum's values
    return Value(tuple(dict.fromkeys(kinds)), choices=choices, also=also, nullable=nullable, item=item)
