"""Side-by-side comparison of finished runs: table, paired significance tests, plots.

>>> from anchored_reasoning.eval.compare import compare_runs
>>> result = compare_runs(["runs/gsm8k-nocot", "runs/gsm8k-cot"], out_dir="runs/compare")  # doctest: +SKIP

For each run directory written by the eval runner (``config.json``, ``records.jsonl``,
``summary.json``) the table shows accuracy with its 95% bootstrap interval, the task's extra
metrics (GSM8K strict/flexible), pass@k, mean generated tokens and two throughputs:
``tokens/s`` as the backend measured it (generated tokens / summed per-sample seconds) and
``tokens/s (wall)`` (generated tokens / wall-clock seconds of the run sessions).

For every pair of runs on the same task, on the examples both have finished:

* **McNemar's exact test** on the correctness of sample 0 (binary, paired): ``b`` examples
  only the first run gets right, ``c`` only the second; the two-sided p-value is the binomial
  probability of a split at least as uneven as (b, c) under p = 1/2;
* a **paired bootstrap** of the accuracy difference (per-example mean over samples), with its
  95% interval.

Files in ``out_dir``: ``compare.json``, ``compare.md``, ``accuracy.png`` (accuracy with
intervals), ``accuracy_vs_tokens.png`` (accuracy against mean generated tokens).
"""
from __future__ import annotations

import json
import logging
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any, Sequence

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.eval.metrics import paired_bootstrap_diff
from anchored_reasoning.eval.report import rows_to_markdown, summarize, summary_row

logger = logging.getLogger(__name__)


@dataclass
class Run:
    """A finished (or partly finished) run directory."""

    path: Path
    config: dict[str, Any]
    summary: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)
    label: str = ""

    @property
    def task(self) -> str:
        return str(self.summary.get("task") or self.config.get("task") or "?")

    def per_example(self) -> dict[str, list[dict[str, Any]]]:
        """Records grouped by example id, samples in order."""
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in self.records:
            groups.setdefault(str(r["id"]), []).append(r)
        for rs in groups.values():
            rs.sort(key=lambda r: int(r.get("sample", 0)))
        return groups


def is_run_dir(path: Path) -> bool:
    return (path / "records.jsonl").is_file() and (path / "config.json").is_file()


def expand_run_dirs(paths: Sequence[str | Path]) -> list[Path]:
    """Run directories, in the order given; a directory that is not a run but holds runs (e.g. a
    suite's output folder) stands for the runs below it, sorted by path."""
    out: list[Path] = []
    for p in map(Path, paths):
        if is_run_dir(p):
            out.append(p)
            continue
        if not p.is_dir():
            raise ConfigError(f"{p} is not a directory; give run directories written by `anchored-reasoning eval`")
        found = sorted({c.parent for c in p.rglob("records.jsonl") if is_run_dir(c.parent)})
        if not found:
            raise ConfigError(f"{p} holds no run (no config.json + records.jsonl in it or below it)")
        out.extend(found)
    seen, unique = set(), []
    for p in out:
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def load_run(path: str | Path) -> Run:
    """Read a run directory. Its summary is recomputed from the records when summary.json is
    missing (a run that was stopped before the end)."""
    from anchored_reasoning.eval.records import load_records

    path = Path(path)
    if not is_run_dir(path):
        raise ConfigError(f"{path} is not a run directory (needs config.json and records.jsonl)")
    try:
        config = json.loads((path / "config.json").read_text())
    except ValueError as exc:
        raise ConfigError(f"{path / 'config.json'} is not valid JSON: {exc}") from exc
    records = load_records(path / "records.jsonl", repair=False)
    summary_path = path / "summary.json"
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
    else:
        backend = config.get("backend") or {}
        sampling = config.get("sampling") or {}
        summary = summarize(
            records,
            n=int(sampling.get("n", 1)),
            meta={
                "task": config.get("task"),
                "method": (config.get("method") or {}).get("name"),
                "model": backend.get("model_arg") or backend.get("model"),
                "backend": backend.get("backend"),
                "n": sampling.get("n", 1),
                "wall_seconds": sum(float(s.get("wall_seconds") or 0.0) for s in config.get("sessions", [])),
            },
        )
        logger.info("%s has no summary.json (unfinished run?); summarised its %d records", path, len(records))
    return Run(path=path, config=config, summary=summary, records=records)


def _labels(runs: list[Run]) -> None:
    """Short unique labels: method/model, plus the task when tasks differ, else the directory name."""
    tasks = {r.task for r in runs}
    for r in runs:
        model = str(r.summary.get("model") or "?").rstrip("/").split("/")[-1]
        base = f"{r.summary.get('method', '?')}/{model}"
        r.label = f"{r.task}/{base}" if len(tasks) > 1 else base
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.label] = counts.get(r.label, 0) + 1
    for r in runs:
        if counts[r.label] > 1:
            r.label = f"{r.label} ({r.path.name})"


def wall_throughput(run: Run) -> float:
    """Generated tokens per wall-clock second over the run's sessions (nan when unknown)."""
    wall = float(run.summary.get("wall_seconds") or 0.0)
    if wall <= 0:
        wall = sum(float(s.get("wall_seconds") or 0.0) for s in run.config.get("sessions", []))
    total = (run.summary.get("tokens") or {}).get("total")
    if not wall or total is None:
        return math.nan
    return float(total) / wall


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for discordant counts ``b`` and ``c``:
    ``min(1, 2 * P[X <= min(b, c)])`` with ``X ~ Binomial(b + c, 1/2)``; 1.0 when b = c = 0."""
    if b < 0 or c < 0:
        raise ValueError("discordant counts must be >= 0")
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    # sum_{i<=k} C(n, i) / 2^n, in log space to stay exact-ish for large n
    log_terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - n * math.log(2) for i in range(k + 1)]
    top = max(log_terms)
    tail = math.exp(top) * sum(math.exp(t - top) for t in log_terms)
    return float(min(1.0, 2.0 * tail))


def paired_test(a: Run, b: Run, *, seed: int = 0) -> dict[str, Any]:
    """McNemar (sample 0) and paired bootstrap (per-example mean) on the examples both runs finished."""
    ga, gb = a.per_example(), b.per_example()
    shared = [i for i in ga if i in gb]
    first_a = [bool(ga[i][0].get("correct")) for i in shared]
    first_b = [bool(gb[i][0].get("correct")) for i in shared]
    only_a = sum(x and not y for x, y in zip(first_a, first_b))
    only_b = sum(y and not x for x, y in zip(first_a, first_b))
    mean_a = [sum(bool(r.get("correct")) for r in ga[i]) / len(ga[i]) for i in shared]
    mean_b = [sum(bool(r.get("correct")) for r in gb[i]) / len(gb[i]) for i in shared]
    boot = paired_bootstrap_diff(mean_a, mean_b, seed=seed)
    return {
        "a": a.label,
        "b": b.label,
        "task": a.task,
        "shared_examples": len(shared),
        "accuracy_a": (sum(mean_a) / len(shared)) if shared else math.nan,
        "accuracy_b": (sum(mean_b) / len(shared)) if shared else math.nan,
        "only_a_correct": int(only_a),
        "only_b_correct": int(only_b),
        "both_correct": int(sum(x and y for x, y in zip(first_a, first_b))),
        "both_wrong": int(sum(not x and not y for x, y in zip(first_a, first_b))),
        "mcnemar_p": mcnemar_exact(only_a, only_b),
        "diff": boot["diff"],
        "diff_ci_low": boot["ci_low"],
        "diff_ci_high": boot["ci_high"],
    }


def table_rows(runs: list[Run]) -> list["OrderedDict[str, str]"]:
    rows = []
    for r in runs:
        row = summary_row(r.summary)
        out: OrderedDict[str, str] = OrderedDict([("run", r.label)])
        for k, v in row.items():
            if k in ("method", "model"):
                continue  # both are in the label
            out[k] = v
        wall = wall_throughput(r)
        out["tokens/s (wall)"] = "-" if math.isnan(wall) else f"{wall:.1f}"
        out["backend"] = str(r.summary.get("backend") or (r.config.get("backend") or {}).get("backend") or "-")
        rows.append(out)
    return rows




def tests_markdown(tests: list[dict[str, Any]]) -> str:
    if not tests:
        return "No pair of runs shares a task: no paired test.\n"
    rows = []
    for t in tests:
        rows.append(OrderedDict([
            ("A", t["a"]), ("B", t["b"]), ("task", t["task"]), ("shared", str(t["shared_examples"])),
            ("acc A %", f"{100 * t['accuracy_a']:.1f}"), ("acc B %", f"{100 * t['accuracy_b']:.1f}"),
            ("A-B pts [95% CI]", f"{100 * t['diff']:+.1f} [{100 * t['diff_ci_low']:+.1f}, {100 * t['diff_ci_high']:+.1f}]"),
            ("only A / only B", f"{t['only_a_correct']} / {t['only_b_correct']}"),
            ("McNemar exact p", f"{t['mcnemar_p']:.3g}"),
        ]))
    return rows_to_markdown(rows)


def plot(runs: list[Run], out_dir: Path) -> list[Path]:
    """accuracy.png and accuracy_vs_tokens.png (matplotlib, Agg canvas: no display needed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def ci(r: Run) -> tuple[float, float, float]:
        acc = r.summary.get("accuracy") or {}
        m = float(acc.get("mean", math.nan))
        lo, hi = float(acc.get("ci_low", m)), float(acc.get("ci_high", m))
        lo, hi = (m, m) if math.isnan(lo) or math.isnan(hi) else (lo, hi)
        return 100 * m, 100 * max(0.0, m - lo), 100 * max(0.0, hi - m)

    paths = []
    labels = [r.label for r in runs]
    means, lows, highs = zip(*(ci(r) for r in runs))

    fig = Figure(figsize=(max(4.0, 1.3 * len(runs) + 2), 3.6), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    xs = range(len(runs))
    ax.bar(xs, means, yerr=[lows, highs], capsize=4, color="#4C72B0")
    ax.set_xticks(list(xs), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("accuracy % (95% CI)")
    ax.set_ylim(0, max(5.0, min(100.0, max(m + h for m, h in zip(means, highs)) * 1.15)))
    tasks = sorted({r.task for r in runs})
    ax.set_title(f"accuracy: {', '.join(tasks)}", fontsize=10)
    fig.tight_layout()
    p = out_dir / "accuracy.png"
    fig.savefig(p)
    paths.append(p)

    fig = Figure(figsize=(5.0, 3.8), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for r, m, lo, hi in zip(runs, means, lows, highs):
        tok = float((r.summary.get("tokens") or {}).get("mean", math.nan))
        ax.errorbar([tok], [m], yerr=[[lo], [hi]], fmt="o", capsize=3)
        ax.annotate(r.label, (tok, m), textcoords="offset points", xytext=(5, 5), fontsize=7)
    ax.margins(x=0.3, y=0.15)  # room for the labels
    ax.set_xlabel("mean generated tokens per sample")
    ax.set_ylabel("accuracy % (95% CI)")
    ax.set_title("accuracy vs generated tokens", fontsize=10)
    fig.tight_layout()
    p = out_dir / "accuracy_vs_tokens.png"
    fig.savefig(p)
    paths.append(p)
    return paths


def compare_runs(run_dirs: Sequence[str | Path], out_dir: str | Path | None = None, *, seed: int = 0,
                 plots: bool = True) -> dict[str, Any]:
    """Compare runs; write compare.json / compare.md / PNGs to ``out_dir`` when given. Returns
    ``{"runs": [...], "table_markdown": str, "tests": [...], "tests_markdown": str, "files": [...]}``."""
    dirs = expand_run_dirs(run_dirs)
    if not dirs:
        raise ConfigError("compare needs at least one run directory")
    runs = [load_run(d) for d in dirs]
    _labels(runs)
    table = rows_to_markdown(table_rows(runs))
    tests = [paired_test(a, b, seed=seed) for a, b in combinations(runs, 2) if a.task == b.task]
    result: dict[str, Any] = {
        "runs": [
            {
                "label": r.label,
                "path": str(r.path),
                "task": r.task,
                "method": r.summary.get("method"),
                "model": r.summary.get("model"),
                "backend": r.summary.get("backend"),
                "n": r.summary.get("n"),
                "accuracy": r.summary.get("accuracy"),
                "metrics": r.summary.get("metrics"),
                "pass_at_k": r.summary.get("pass_at_k"),
                "tokens": r.summary.get("tokens"),
                "tokens_per_second_wall": wall_throughput(r),
                "counts": r.summary.get("counts"),
            }
            for r in runs
        ],
        "table_markdown": table,
        "tests": tests,
        "tests_markdown": tests_markdown(tests),
        "files": [],
    }
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        files = []
        if plots:
            files += plot(runs, out)
        md = (
            "# Comparison\n\n" + table + "\nAccuracy intervals: 95% percentile bootstrap over examples. "
            "tokens/s: generated tokens over the backend's per-sample seconds; tokens/s (wall): over the "
            "wall-clock time of the run.\n\n## Paired tests (shared examples)\n\n" + result["tests_markdown"]
            + "\nMcNemar: exact two-sided test on sample 0's correctness; A-B: paired bootstrap of the "
            "per-example accuracy difference.\n"
        )
        (out / "compare.md").write_text(md)
        files.append(out / "compare.md")
        result["files"] = [str(f) for f in files + [out / "compare.json"]]
        (out / "compare.json").write_text(json.dumps(_clean(result), indent=2, allow_nan=False) + "\n")
    return result


def _clean(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf become null, paths strings."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj
