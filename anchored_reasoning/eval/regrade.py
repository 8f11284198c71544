"""Grade a run's records again with the task's current grader, and summarise them again.

When a grader changes (GSM8K's headline rule, for instance), the generated text in
``records.jsonl`` is still good. :func:`regrade_run` grades every record's completion again,
with the finish reason the backend recorded for it, rewrites the grade fields of each record
(``extracted``, ``correct``, ``details``; ``gold`` too, which records written before it existed
lack) and the run's ``summary.json`` / ``summary.md``
(through :func:`~anchored_reasoning.eval.report.summarize`, as the runner does), and lists
every record whose grade changed. Everything generation produced (prompt, completion, tokens,
seconds, finish_reason, session, time) and ``config.json`` are left as they were.

>>> result = regrade_run("benchmarks/results/smollm2-gsm8k/gsm8k-cot")  # doctest: +SKIP
>>> [(c["id"], c["old"]["correct"], c["new"]["correct"]) for c in result.changes]  # doctest: +SKIP

A record whose ``finish_reason`` is missing counts as cut by the token cap when it generated
``max_new_tokens`` tokens (the cap in ``config.json``).
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anchored_reasoning.errors import ConfigError, DataError, ResumeError
from anchored_reasoning.eval.report import render_markdown, summarize
from anchored_reasoning.eval.grading import gold_of, grade_all
from anchored_reasoning.eval.records import CONFIG, RECORDS, SUMMARY_JSON, SUMMARY_MD, jsonable, load_records
from anchored_reasoning.eval.runner import resolve_task
from anchored_reasoning.files import atomic_write

log = logging.getLogger(__name__)

#: The fields of a record that grading writes.
GRADE_FIELDS = ("extracted", "correct", "details")


@dataclass
class Regrade:
    """What :func:`regrade_run` did: the new summary, the records whose grade changed (``id``,
    ``sample``, ``old`` and ``new`` grade fields) and how many records it graded."""

    summary: dict[str, Any]
    changes: list[dict[str, Any]] = field(default_factory=list)  # see _changed
    graded: int = 0


def _finish_reason(record: dict[str, Any], cap: int | None) -> str | None:
    reason = record.get("finish_reason")
    if reason is None and cap and int(record.get("tokens") or 0) >= cap:
        return "length"
    return reason


def _changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """A grade changed when its answer, its verdict or a detail it had before differs (a detail
    the new grader adds, such as GSM8K's ``answer_rule``, is not a change by itself)."""
    if old.get("extracted") != new["extracted"] or bool(old.get("correct")) != new["correct"]:
        return True
    before, after = old.get("details") or {}, new["details"]
    return any(after.get(k, _MISSING) != v for k, v in before.items())


_MISSING = object()


def regrade_run(
    run_dir: str | os.PathLike,
    *,
    task: Any = None,
    data_dir: str | os.PathLike | None = None,
    write: bool = True,
) -> Regrade:
    """Grade the records in ``run_dir`` again (``task`` defaults to the run's own, by name, with
    its examples loaded from ``data_dir``, else the run's data folder when it exists here, else
    as ``task.load`` finds them) and, with ``write``, rewrite
    the records' grade fields and the summaries. Raises :class:`ConfigError` for a folder that
    is not a run, :class:`DataError` for records of examples the task no longer has."""
    run = Path(run_dir)
    if not (run / CONFIG).is_file() or not (run / RECORDS).is_file():
        raise ConfigError(f"{run} is not a run directory (needs {CONFIG} and {RECORDS})")
    try:
        config = json.loads((run / CONFIG).read_text())
    except ValueError as exc:
        raise ConfigError(f"{run / CONFIG} is not valid JSON: {exc}") from exc
    task = resolve_task(task if task is not None else config.get("task"))
    if getattr(task, "is_code", False):  # refuse unisolated code execution (never graded wrong instead)
        from anchored_reasoning.tasks.code_exec import preflight

        preflight()
    folder = data_dir
    if folder is None and config.get("data_dir") and Path(config["data_dir"]).is_dir():
        folder = config["data_dir"]  # the run's own data, when this machine has it
    examples = task.load(config.get("split", "test"), data_dir=folder, limit=config.get("limit"))
    by_id = {str(e.id): e for e in examples}
    records = load_records(run / RECORDS, repair=False)
    unknown = sorted({str(r["id"]) for r in records} - set(by_id))
    if unknown:
        raise DataError(
            f"{run / RECORDS}: {len(unknown)} record(s) for examples task {task.name!r} does not have "
            f"in split {config.get('split')!r} (first: {unknown[:3]}); regrade with the data the run used"
        )
    sampling = config.get("sampling") or {}
    cap = int(sampling["max_new_tokens"]) if sampling.get("max_new_tokens") else None
    grades = grade_all(
        task,
        [r["completion"] for r in records],
        [by_id[str(r["id"])] for r in records],
        [_finish_reason(r, cap) for r in records],
    )
    new_records, changes = [], []
    for record, grade in zip(records, grades):
        new = dict(record)
        new.update(gold=gold_of(task, by_id[str(record["id"])]), extracted=grade.extracted, correct=bool(grade.correct),
                   details=jsonable(grade.details or {}))
        if _changed(record, new):
            changes.append({
                "id": record["id"],
                "sample": record["sample"],
                "finish_reason": record.get("finish_reason"),
                "old": {k: record.get(k) for k in GRADE_FIELDS},
                "new": {k: new[k] for k in GRADE_FIELDS},
            })
        new_records.append(new)

    old_summary: dict[str, Any] = {}
    if (run / SUMMARY_JSON).is_file():
        old_summary = json.loads((run / SUMMARY_JSON).read_text())
    summary_args = dict(
        metrics=list(getattr(task, "metrics", None) or ["accuracy"]),
        is_code=bool(getattr(task, "is_code", False)),
        n=int(sampling.get("n", 1)),
        ids=[str(e.id) for e in examples],
        seed=int(old_summary.get("seed", sampling.get("seed", 0))),
    )
    computed = set(summarize(new_records, **summary_args))  # the keys summarize itself writes
    meta = {k: v for k, v in old_summary.items() if k not in computed}
    meta.setdefault("task", config.get("task"))
    meta.setdefault("method", (config.get("method") or {}).get("name"))
    summary = summarize(new_records, meta=meta, **summary_args)
    if write:
        _write(run, new_records, summary)
    log.info("%s: regraded %d records, %d changed", run, len(records), len(changes))
    return Regrade(summary=summary, changes=changes, graded=len(records))


def _write(run: Path, records: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    lock_path = run / ".lock"
    existed = lock_path.exists()
    with open(lock_path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ResumeError(f"a run is writing to {run} right now; regrade it when that run has ended") from None
        try:
            atomic_write(run / RECORDS, "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in records))
            atomic_write(run / SUMMARY_JSON, json.dumps(summary, indent=2, default=str) + "\n")
            atomic_write(run / SUMMARY_MD, render_markdown(summary))
        finally:
            if not existed:
                lock_path.unlink(missing_ok=True)
