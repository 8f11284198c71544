"""``anchored-reasoning models``: list the model aliases that ``--model`` (eval, serve, ppl), ``model.name``
(training recipes) and lm-eval's ``pretrained=`` accept, with their kind, size and where they come from.

    anchored-reasoning models            # a table
    anchored-reasoning models --json     # name, kind, size, source, description

Besides an alias, ``--model`` takes a local checkpoint directory or a Hugging Face Hub id (org/name).
"""
from __future__ import annotations

import argparse
import json
from typing import Any


def alias_rows() -> list[dict[str, Any]]:
    """One dict per alias: name, default (the default ``--model``), kind (AR or diffusion), size
    (parameters), source, description."""
    from anchored_reasoning.models.zoo import DEFAULT_MODEL, list_aliases

    return [{
        "name": a.name,
        "default": a.name == DEFAULT_MODEL,
        "kind": a.kind,
        "size": a.size or "-",
        "source": a.source or "-",
        "description": a.description,
    } for a in list_aliases()]


def format_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table; the description goes on its own indented line under each alias."""
    keys = ["name", "kind", "size", "source"]
    rows = [{**r, "name": r["name"] + (" (default)" if r["default"] else "")} for r in rows]
    widths = [max(len(k), *(len(r[k]) for r in rows)) if rows else len(k) for k in keys]
    lines = ["  ".join(k.ljust(w) for k, w in zip(keys, widths)).rstrip(), "  ".join("-" * w for w in widths)]
    for r in rows:
        lines.append("  ".join(r[k].ljust(w) for k, w in zip(keys, widths)).rstrip())
        lines.append(f"    {r['description']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    rows = alias_rows()
    print(json.dumps(rows, indent=2) if args.json else format_table(rows))
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "models",
        help="list the model aliases (kind, size, where the weights come from)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)
