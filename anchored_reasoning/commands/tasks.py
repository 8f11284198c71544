"""``anchored-reasoning tasks``: list the registered tasks with their splits, metrics and methods.

The methods are the task's prompt templates (``prompts`` in its YAML), each the name of an
instruct-style method ``anchored-reasoning eval --method`` takes (nocot, cot, and HumanEval's
completion); the trained formats (acot, pause, ...) render any task and are not listed per task."""
from __future__ import annotations

import argparse
import json
from typing import Any


def _splits(task: Any) -> list[str]:
    splits = getattr(task, "splits", None)
    if isinstance(splits, dict):
        return list(splits)
    if isinstance(splits, (list, tuple)):
        return [str(s) for s in splits]
    return []


def task_rows() -> list[dict[str, Any]]:
    """One dict per registered task: name, splits, metrics, code?, description."""
    from anchored_reasoning.tasks import get_task, list_tasks

    rows = []
    for name in list_tasks():
        task = get_task(name)
        rows.append({
            "name": getattr(task, "name", name),
            "splits": _splits(task),
            "metrics": list(getattr(task, "metrics", None) or ["accuracy"]),
            "code": bool(getattr(task, "is_code", False)),
            "methods": sorted((getattr(task, "prompts", None) or {}).keys()),
            "description": str(getattr(task, "description", "") or "").strip().splitlines()[0:1],
        })
    for row in rows:
        row["description"] = row["description"][0] if row["description"] else ""
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    header = ["task", "splits", "metrics", "methods", "description"]
    body = [
        [r["name"], ",".join(r["splits"]) or "-", ",".join(r["metrics"]), ",".join(r["methods"]) or "-", r["description"]]
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)] if body else [len(h) for h in header]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in body]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    rows = task_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(format_table(rows))
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("tasks", help="list the reasoning tasks (splits, metrics, prompting methods)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)
