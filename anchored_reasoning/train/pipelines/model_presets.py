"""The ``ar`` trainer's from-scratch GPT-2-class configurations (``model.preset`` in an ``ar`` or ``grpo`` recipe).

``gpt2-124m`` is GPT-2 small's shape (the paper's backbone size, here randomly initialised); the smaller
ones are what a CPU can train in minutes. A recipe's ``model.config`` overrides any field.
"""
from __future__ import annotations

from typing import Any

MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "gpt2-tiny": {"n_layer": 2, "n_embd": 128, "n_head": 4, "n_positions": 512},
    "gpt2-mini": {"n_layer": 4, "n_embd": 256, "n_head": 4, "n_positions": 512},
    "gpt2-small": {"n_layer": 6, "n_embd": 384, "n_head": 6, "n_positions": 1024},
    "gpt2-124m": {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024},
}
_PRESET_DEFAULTS = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
