"""A run directory's files: the per-sample records, the run's config and the check that lets a rerun resume.

Files in a run directory (``out_dir`` of :func:`~anchored_reasoning.eval.runner.run_eval`):

* ``records.jsonl`` (:data:`RECORDS`): one JSON record per (example, sample), built by :func:`make_record`:

  ============== =====================================================================================
  ``id``         the example's id (a string)
  ``sample``     the sample index, 0 .. n-1
  ``prompt``     the prompt text the backend got
  ``completion`` the generated text (cut before a stop string)
  ``gold``       what the grader compares with (``task.gold(example)``; None for code tasks)
  ``extracted``  the answer the grader read from the completion (None when there is none)
  ``correct``    the grade
  ``tokens``     tokens generated
  ``seconds``    generation time of this sample
  ``finish_reason`` ``stop`` / ``length`` / ..., as the backend reports it
  ``meta``       only when the backend reports it: its per-sample counters (e.g. a diffusion sampler's
                 NFE and layer calls)
  ``details``    the grader's extra fields (strict / flexible, test results, a grading error)
  ``session``    the id of the session (one call of ``run_eval``) that wrote it
  ``time``       when it was written (UTC, ISO 8601)
  ============== =====================================================================================

* ``config.json`` (:data:`CONFIG`): what was run (task, split, method, backend description, sampling,
  limit, data folder) and its sessions (start, end, wall seconds, samples generated);
* ``summary.json`` / ``summary.md``: see :mod:`anchored_reasoning.eval.report`.

Records are appended in chunks and fsynced (:func:`append_records`); :func:`load_records` drops a last
line cut short by a kill and repairs the file. :func:`check_resume` refuses to continue a run whose task,
split, method, model or sampling differ from its ``config.json``.
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

from anchored_reasoning.errors import ConfigError, ResumeError
from anchored_reasoning.files import atomic_write
from anchored_reasoning.types import Completion, Example, Grade, Prompt

log = logging.getLogger(__name__)

RECORDS = "records.jsonl"
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
CONFIG = "config.json"
#: Backend description keys that may change between sessions of one run.
VOLATILE_BACKEND_KEYS = {"batch_size", "device", "max_concurrency", "concurrency", "workers", "timeout", "api_key_env"}


def jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON types (anything else as its ``str``)."""
    return json.loads(json.dumps(obj, default=str))


def now() -> str:
    """The current UTC time as ISO 8601 with milliseconds (a record's ``time``, a session's start)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


# ---------------------------------------------------------------------------------------------
# records.jsonl

def make_record(example: Example, sample: int, prompt: Prompt, completion: Completion, gold: Any, grade: Grade,
                session: str) -> dict[str, Any]:
    """One line of ``records.jsonl`` (the fields are listed in the module docstring)."""
    meta = getattr(completion, "meta", None)
    return {
        "id": str(example.id),
        "sample": int(sample),
        "prompt": prompt.text,
        "completion": completion.text,
        "gold": jsonable(gold),
        "extracted": grade.extracted,
        "correct": bool(grade.correct),
        "tokens": int(completion.n_tokens),
        "seconds": round(float(completion.seconds), 6),
        "finish_reason": completion.finish_reason,
        **({"meta": jsonable(meta)} if meta else {}),
        "details": jsonable(grade.details or {}),
        "session": session,
        "time": now(),
    }


def load_records(path: str | os.PathLike, *, repair: bool = True) -> list[dict[str, Any]]:
    """Read ``records.jsonl``, dropping a last line cut short by a kill, unparseable lines and
    repeated (id, sample) pairs (the first one wins). With ``repair`` the file is rewritten
    (atomically) when anything was dropped, so appends continue on a clean line."""
    path = Path(path)
    if not path.exists():
        return []
    raw = path.read_bytes()
    records: list[dict[str, Any]] = []
    seen: set[tuple[str, int]] = set()
    dropped = 0
    lines = raw.split(b"\n")
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            key = (str(rec["id"]), int(rec["sample"]))
        except (ValueError, KeyError, TypeError):
            dropped += 1
            where = "last line (cut short)" if lineno == len(lines) else f"line {lineno}"
            log.warning("%s: dropping unreadable %s", path, where)
            continue
        if key in seen:
            dropped += 1
            log.warning("%s: dropping repeated record %s (line %d)", path, key, lineno)
            continue
        seen.add(key)
        records.append(rec)
    needs_newline = bool(raw) and not raw.endswith(b"\n")
    if repair and (dropped or needs_newline):
        atomic_write(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        log.info("%s: repaired (%d records kept, %d dropped)", path, len(records), dropped)
    return records


def append_records(path: str | os.PathLike, records: list[dict[str, Any]]) -> None:
    """Append ``records`` to ``path`` in one write and fsync it, so a kill loses at most this chunk."""
    data = "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in records)
    with open(path, "a", encoding="utf-8") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def samples_done(records: list[dict[str, Any]]) -> dict[str, set[int]]:
    """Example id -> the sample indices ``records`` already hold."""
    have: dict[str, set[int]] = {}
    for r in records:
        have.setdefault(str(r["id"]), set()).add(int(r["sample"]))
    return have


# ---------------------------------------------------------------------------------------------
# config.json: what was run, and whether a rerun may resume it

def describe_method(method: Any) -> dict[str, Any]:
    """A method as ``config.json`` records it: name, style (instruct or trained) and options."""
    options = getattr(method, "options", None)
    return {
        "name": getattr(method, "name", type(method).__name__),
        "style": getattr(method, "style", "instruct"),
        "options": jsonable(options if isinstance(options, dict) else {}),
    }


def write_config(out_dir: Path, config: dict[str, Any]) -> None:
    atomic_write(Path(out_dir) / CONFIG, json.dumps(config, indent=2, default=str) + "\n")


def _method_identity(method: Any) -> Any:
    """A method's settings with every option filled in by the method itself, so a run recorded before an
    option existed (``{..., "mark_backups": true}``) matches the same run asked for now, where the new
    option holds its default (``backup_marker: "word"``); an explicit non-default value still differs."""
    from anchored_reasoning.methods import get_method

    if not (isinstance(method, dict) and isinstance(method.get("name"), str) and isinstance(method.get("options"), dict)):
        return method
    try:
        built = get_method(method["name"], style=method.get("style") or "instruct", **method["options"])
    except (ConfigError, TypeError):
        return method
    return {**method, "options": {**method["options"], **describe_method(built)["options"]}}


def _identity(config: dict[str, Any]) -> dict[str, Any]:
    backend = {k: v for k, v in (config.get("backend") or {}).items() if k not in VOLATILE_BACKEND_KEYS}
    return {
        "task": config.get("task"),
        "split": config.get("split"),
        "method": _method_identity(config.get("method")),
        "backend": backend,
        "sampling": config.get("sampling"),
    }


def diff_settings(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Every dotted key whose value differs between two nested settings dicts, as
    ``"key: old (in the run) != new (asked for)"`` lines (also used by the trainers' resume check)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            out += diff_settings(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    return [] if old == new else [f"{prefix}: {old!r} (in the run) != {new!r} (asked for)"]


def check_resume(out_dir: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """The config of an earlier run in ``out_dir`` (None if there is none); ResumeError when it
    differs from ``config`` in task, split, method, model or sampling."""
    path = out_dir / CONFIG
    if not path.exists():
        if (out_dir / RECORDS).exists() and (out_dir / RECORDS).stat().st_size > 0:
            raise ResumeError(
                f"{out_dir} holds {RECORDS} but no {CONFIG}; cannot tell what produced it. "
                "Use a new --out directory or delete the old records."
            )
        return None
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ResumeError(f"{path} is unreadable ({exc}); use a new --out directory or delete {out_dir}") from exc
    diffs = diff_settings(_identity(old), _identity(jsonable(config)))
    if diffs:
        raise ResumeError(
            f"{out_dir} holds a run with different settings:\n  " + "\n  ".join(diffs)
            + "\nUse a new --out directory, or the same settings to resume that run."
        )
    return old


def start_session(out_dir: Path, config: dict[str, Any]) -> str:
    """Check ``config`` against an earlier run in ``out_dir`` (:func:`check_resume`), add a new session to
    ``config["sessions"]`` (after the earlier run's), keep its ``created`` time, and write ``config.json``.
    Returns the new session's id."""
    old = check_resume(out_dir, config) or {}
    session = uuid.uuid4().hex[:12]
    config["sessions"] = [*old.get("sessions", []), {"session": session, "started": now()}]
    config["created"] = old.get("created", now())
    write_config(out_dir, config)
    return session
