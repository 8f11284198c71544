"""Summaries of a run's records: the summary dict (summary.json) and Markdown tables.

``summarize`` turns per-sample records into accuracy with a bootstrap 95% interval
(resampling examples), per-metric rates (GSM8K strict/flexible, read from each record's
``details``), pass@k with the unbiased estimator for code tasks, and token/time figures.
``markdown_table`` renders one or many summaries side by side (the compare command uses it).
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from anchored_reasoning.eval.metrics import denoiser_counters, mean_ci, pass_at_k_per_problem, sensible_ks

#: Metric names the runner computes itself (everything else is read from ``details``).
BUILTIN_METRICS = {"accuracy", "pass@k"}


def _group(records: Iterable[dict[str, Any]], ids: Sequence[str] | None) -> "OrderedDict[str, list[dict]]":
    groups: OrderedDict[str, list[dict]] = OrderedDict()
    if ids is not None:
        for i in ids:
            groups[str(i)] = []
    for r in records:
        key = str(r["id"])
        if ids is not None and key not in groups:
            continue
        groups.setdefault(key, []).append(r)
    for key in groups:
        groups[key].sort(key=lambda r: r["sample"])
    return groups


def summarize(
    records: Sequence[dict[str, Any]],
    *,
    metrics: Sequence[str] = ("accuracy",),
    is_code: bool = False,
    n: int = 1,
    ids: Sequence[str] | None = None,
    seed: int = 0,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Summary of ``records`` (restricted to ``ids`` when given, in that order).

    Every example counts once: its score is the mean over its samples, and intervals resample
    examples. Examples without any record are counted in ``counts.missing``.
    """
    groups = _group(records, ids)
    done = {k: v for k, v in groups.items() if v}
    per_example = [float(np.mean([bool(r.get("correct")) for r in rs])) for rs in done.values()]
    all_samples = [r for rs in done.values() for r in rs]
    tokens = [int(r.get("tokens") or 0) for r in all_samples]
    seconds = [float(r.get("seconds") or 0.0) for r in all_samples]
    summary: dict[str, Any] = dict(meta or {})
    summary["accuracy"] = mean_ci(per_example, seed=seed)
    summary["metrics"] = {}
    for name in metrics:
        if name in BUILTIN_METRICS:
            continue
        values = []
        for rs in done.values():
            vals = [(r.get("details") or {}).get(name) for r in rs]
            vals = [float(v) for v in vals if isinstance(v, (bool, int, float)) and not isinstance(v, str)]
            if vals:
                values.append(float(np.mean(vals)))
        if values:
            summary["metrics"][name] = mean_ci(values, seed=seed)
    if is_code or "pass@k" in metrics:
        ns = [len(rs) for rs in done.values()]
        cs = [sum(bool(r.get("correct")) for r in rs) for rs in done.values()]
        smallest = min(ns) if ns else 0
        summary["pass_at_k"] = {
            f"pass@{k}": mean_ci(pass_at_k_per_problem(ns, cs, k), seed=seed) for k in sensible_ks(min(n, smallest))
        }
    total_seconds = float(sum(seconds))
    summary["tokens"] = {
        "mean": float(np.mean(tokens)) if tokens else math.nan,
        "total": int(sum(tokens)),
        "generation_seconds": total_seconds,
        "tokens_per_second": (sum(tokens) / total_seconds) if total_seconds > 0 else math.nan,
        "mean_seconds_per_sample": (total_seconds / len(all_samples)) if all_samples else math.nan,
    }
    summary["counts"] = {
        "examples": len(groups),
        "examples_done": len(done),
        "missing": len(groups) - len(done),
        "samples": len(all_samples),
        "correct": int(sum(bool(r.get("correct")) for r in all_samples)),
        "no_answer": int(sum(r.get("extracted") is None for r in all_samples)),
        "grading_errors": int(sum("grading_error" in (r.get("details") or {}) for r in all_samples)),
        "truncated": int(sum(r.get("finish_reason") == "length" for r in all_samples)),
    }
    summary.update(denoiser_counters(all_samples))  # diffusion runs: NFE and tokens per forward
    return summary


def _pct(stat: dict[str, float] | None) -> str:
    if not stat or stat.get("mean") is None or math.isnan(stat["mean"]):
        return "-"
    lo, hi = stat.get("ci_low"), stat.get("ci_high")
    if lo is None or hi is None or math.isnan(lo):
        return f"{100 * stat['mean']:.1f}"
    return f"{100 * stat['mean']:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def _num(x: Any, fmt: str = "{:.1f}") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return fmt.format(x)


def summary_row(summary: dict[str, Any]) -> "OrderedDict[str, str]":
    """One table row (column -> cell) for ``summary``."""
    row: OrderedDict[str, str] = OrderedDict()
    row["task"] = str(summary.get("task", "-"))
    row["method"] = str(summary.get("method", "-"))
    row["model"] = str(summary.get("model", "-"))
    row["n"] = str(summary.get("n", "-"))
    row["examples"] = str(summary.get("counts", {}).get("examples_done", "-"))
    row["accuracy % [95% CI]"] = _pct(summary.get("accuracy"))
    for name, stat in (summary.get("metrics") or {}).items():
        row[f"{name} %"] = _pct(stat)
    for name, stat in (summary.get("pass_at_k") or {}).items():
        row[f"{name} %"] = _pct(stat)
    tok = summary.get("tokens") or {}
    row["mean tokens"] = _num(tok.get("mean"))
    row["tokens/s"] = _num(tok.get("tokens_per_second"))
    row["no answer"] = str(summary.get("counts", {}).get("no_answer", "-"))
    return row


def rows_to_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """A Markdown table of ``rows`` (columns are the union of their keys, in first-seen order; "-" fills gaps)."""
    columns: list[str] = []
    for row in rows:
        for col in row:
            if col not in columns:
                columns.append(col)
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(c, "-")).replace("|", "\\|") for c in columns) + " |")
    return "\n".join(lines) + "\n"


def markdown_table(summaries: Sequence[dict[str, Any]]) -> str:
    """A Markdown table with one row per summary (columns are the union, in first-seen order)."""
    return rows_to_markdown([summary_row(s) for s in summaries])


def render_markdown(summary: dict[str, Any]) -> str:
    """summary.md: a title, the table, and the counts."""
    counts = summary.get("counts", {})
    title = f"# {summary.get('task', 'eval')} / {summary.get('method', '?')} / {summary.get('model', '?')}"
    parts = [title, "", markdown_table([summary])]
    parts.append(
        f"{counts.get('samples', 0)} samples over {counts.get('examples_done', 0)} of {counts.get('examples', 0)} examples; "
        f"{counts.get('correct', 0)} correct, {counts.get('no_answer', 0)} without an extractable answer, "
        f"{counts.get('grading_errors', 0)} grading errors, {counts.get('truncated', 0)} cut at max_new_tokens. "
        "Intervals: 95% percentile bootstrap over examples.\n"
    )
    return "\n".join(parts)
