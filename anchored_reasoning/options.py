"""``key=value`` options as given on a command line (``--backend-arg``, ``--method-arg``) or in a suite.

Library code (evaluation suites) and the CLI commands both parse them here, so the library never
imports the command layer.
"""
from __future__ import annotations

from typing import Any

import yaml

from anchored_reasoning.errors import ConfigError


def parse_key_values(items: list[str] | None, flag: str) -> dict[str, Any]:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}`` (values parsed as YAML scalars).

    Dashes in keys become underscores (``top-k=3`` -> ``top_k``); ``flag`` names the option in the
    ConfigError raised for an item that is not ``key=value``.
    """
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ConfigError(f"{flag} {item!r}: expected key=value")
        try:
            out[key] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            out[key] = value
    return out
