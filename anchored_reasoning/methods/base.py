"""What a method renders: the one type the method modules share (kept apart from the registry in
``methods/__init__.py``, so the modules that define methods import it without importing the registry)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Rendered:
    """An example rendered for training in the ``trained`` style.

    ``prompt`` is everything the model is given (no LM loss on it), ``target`` what it must
    generate (LM loss). ``anchors`` are the anchor strings, in order, that the ``[ANT]`` slots
    inside ``prompt`` are trained to predict (empty for methods without anchor supervision):
    anchor ``i`` takes the ``tokens_per_anchor`` slots from ``i * tokens_per_anchor`` on.
    ``prompt + target`` is the full training text.
    """

    prompt: str
    target: str
    anchors: list[str] = field(default_factory=list)
    tokens_per_anchor: int = 1
