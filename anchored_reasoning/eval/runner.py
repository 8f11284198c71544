"""The evaluation runner: task x method x backend -> per-sample records and a summary.

Longer than ~400 lines on purpose: resume, chunked fsynced writes, grading and summaries all
keep the invariants of one records file, and read best together.

>>> from anchored_reasoning.backends import get_backend
>>> backend = get_backend("hf", "smollm2-135m")
>>> run_eval("gsm8k", backend, "cot", limit=20, out_dir="runs/gsm8k-cot")  # doctest: +SKIP

Files in ``out_dir``:

* ``records.jsonl``: one JSON record per (example, sample): ``id, sample, prompt, completion,
  gold, extracted, correct, tokens, seconds, finish_reason, details, session, time``;
* ``summary.json`` / ``summary.md``: see :mod:`anchored_reasoning.eval.report`;
* ``config.json``: what was run (task, split, method, backend description, sampling).

Resuming: rerunning into the same ``out_dir`` reads the records that are there, generates only
the missing (example, sample) pairs and never writes one twice. Records are appended in chunks
and fsynced, so a crash or SIGKILL loses at most the chunk in flight (when a backend fails with a
:class:`BackendError` carrying ``partial`` -- the openai backend when its server dies -- the prompts
of the chunk that did finish are written first, so only the requests in flight are lost); a last line cut short by
a kill is dropped and the file repaired. A run whose task, split, method, model or sampling
differ from ``config.json`` is refused with :class:`ResumeError` (``limit`` may change: a
larger limit extends the run).
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import fcntl
import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

from anchored_reasoning.backends import generate_with_progress
from anchored_reasoning.checkpoints import CHECKPOINT_META, read_checkpoint_meta
from anchored_reasoning.files import atomic_write
from anchored_reasoning.errors import BackendError, ConfigError, ResumeError
from anchored_reasoning.eval.progress import PhaseBars
from anchored_reasoning.eval.report import render_markdown, summarize
from anchored_reasoning.tasks.graders import accepts_keyword
from anchored_reasoning.types import Example, Grade, SamplingSpec

log = logging.getLogger(__name__)

RECORDS = "records.jsonl"
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
CONFIG = "config.json"
#: Backend description keys that may change between sessions of one run.
VOLATILE_BACKEND_KEYS = {"batch_size", "device", "max_concurrency", "concurrency", "workers", "timeout", "api_key_env"}


# ---------------------------------------------------------------------------------------------
# methods from checkpoints

def build_method(name: str | None, model_path: str | os.PathLike | None = None, **options: Any):
    """The method to evaluate with. A checkpoint trained by our trainer (``anchored_reasoning.json``
    in ``model_path``) gets its trained-style method and options; ``name``, when given, must then
    agree with it. Otherwise ``name`` is looked up in the method registry (instruct style)."""
    from anchored_reasoning.methods import get_method

    meta = read_checkpoint_meta(model_path)
    if meta is not None and meta.get("style", "trained") == "trained":
        trained = meta["method"]
        if name and name not in (trained, f"trained:{trained}"):
            raise ConfigError(
                f"checkpoint {model_path} was trained with method {trained!r} ({CHECKPOINT_META}); "
                f"--method {name!r} would prompt it in a format it never saw. Use --method {trained} or omit --method."
            )
        opts = {**(meta.get("method_options") or {}), **options}
        log.info("checkpoint %s: trained-style method %s %s", model_path, trained, opts)
        return get_method(trained, style="trained", **opts)
    if not name:
        raise ConfigError("no method given: pass --method (e.g. nocot or cot)")
    return get_method(name, **options)


def checkpoint_path(backend: Any, model: str | os.PathLike | None = None) -> str | None:
    """The local checkpoint directory ``backend`` serves, where there is one: its ``model_path``
    (hf, vllm, diffusion), else its model name when that is a directory (an openai backend talking to
    ``vllm serve /path/to/ckpt``), else ``model`` when that is a directory. None for a Hub id or a
    model held only in memory."""
    for candidate in (getattr(backend, "model_path", None), getattr(backend, "model", None), model):
        if isinstance(candidate, (str, os.PathLike)) and str(candidate) and Path(candidate).is_dir():
            return str(candidate)
    return None


def method_for_backend(name: str | None, backend: Any, model: str | os.PathLike | None = None, **options: Any):
    """:func:`build_method` for the checkpoint ``backend`` serves (:func:`checkpoint_path`): what
    ``anchored-reasoning eval --method NAME`` and ``run_eval(task, backend, "NAME")`` both prompt with.
    A checkpoint trained here gets the format it was trained in, or a ConfigError naming the fix."""
    return build_method(name, checkpoint_path(backend, model), **options)


def check_method_fits(method: Any, backend: Any) -> None:
    """Refuse an instruct-style method object for a checkpoint trained here: that checkpoint
    learned the trained format (``anchored_reasoning.json``) and never saw the task's instruct prompt."""
    path = checkpoint_path(backend)
    meta = read_checkpoint_meta(path)
    if meta is None or meta.get("style", "trained") != "trained" or getattr(method, "style", "instruct") != "instruct":
        return
    name = getattr(method, "name", type(method).__name__)
    raise ConfigError(
        f"checkpoint {path} was trained with method {meta['method']!r} ({CHECKPOINT_META}), but the method "
        f"object given is the instruct-style {name!r}, a prompt format it never saw. Pass the method by name "
        f"(run_eval(task, backend, {meta['method']!r}) or None) or build it with build_method(None, {str(path)!r})."
    )


def describe_method(method: Any) -> dict[str, Any]:
    options = getattr(method, "options", None)
    return {
        "name": getattr(method, "name", type(method).__name__),
        "style": getattr(method, "style", "instruct"),
        "options": _jsonable(options if isinstance(options, dict) else {}),
    }


# ---------------------------------------------------------------------------------------------
# records file

def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


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


def _append(path: Path, records: list[dict[str, Any]]) -> None:
    data = "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in records)
    with open(path, "a", encoding="utf-8") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


# ---------------------------------------------------------------------------------------------
# config identity

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
    diffs = diff_settings(_identity(old), _identity(_jsonable(config)))
    if diffs:
        raise ResumeError(
            f"{out_dir} holds a run with different settings:\n  " + "\n  ".join(diffs)
            + "\nUse a new --out directory, or the same settings to resume that run."
        )
    return old


# ---------------------------------------------------------------------------------------------
# the run

def _grade_all(
    task: Any, texts: list[str], examples: list[Example], finish_reasons: list[str | None] | None = None
) -> list[Grade]:
    """Grade with ``task.grade_batch`` (or ``task.grade``); an exception becomes a graded-wrong
    result carrying the error, never a crash. ``finish_reasons`` reach a task whose grading
    takes them (GSM8K gives no credit for the number a token-capped loop ends on)."""
    reasons = list(finish_reasons) if finish_reasons is not None else [None] * len(texts)
    if hasattr(task, "grade_batch"):
        try:
            if finish_reasons is not None and accepts_keyword(task.grade_batch, "finish_reasons"):
                grades = list(task.grade_batch(texts, examples, finish_reasons=reasons))
            else:
                grades = list(task.grade_batch(texts, examples))
            if len(grades) == len(texts):
                return grades
            log.warning("grade_batch returned %d grades for %d completions; grading one by one", len(grades), len(texts))
        except Exception as exc:  # noqa: BLE001 - grading must never crash the run
            log.warning("grade_batch failed (%s: %s); grading one by one", type(exc).__name__, exc)
    out = []
    with_reason = finish_reasons is not None and accepts_keyword(task.grade, "finish_reason")
    for text, ex, reason in zip(texts, examples, reasons):
        try:
            out.append(task.grade(text, ex, finish_reason=reason) if with_reason else task.grade(text, ex))
        except Exception as exc:  # noqa: BLE001
            log.warning("grading %s failed: %s: %s", ex.id, type(exc).__name__, exc)
            out.append(Grade(False, None, {"grading_error": f"{type(exc).__name__}: {exc}"}))
    return out


def gold_of(task: Any, example: Example) -> Any:
    """The record's ``gold``: ``task.gold(example)`` (the registry's tasks: what the grader compares
    with, None for code tasks), else the example's answer."""
    gold = getattr(task, "gold", None)
    return _jsonable(gold(example) if callable(gold) else example.answer)


def _resolve_task(task: Any) -> Any:
    if isinstance(task, str):
        from anchored_reasoning.tasks import get_task

        return get_task(task)
    return task


def run_eval(
    task: Any,
    backend: Any,
    method: Any,
    *,
    out_dir: str | os.PathLike,
    split: str = "test",
    limit: int | None = None,
    n: int = 1,
    seed: int = 0,
    temperature: float | None = None,
    top_p: float | None = None,
    max_new_tokens: int | None = None,
    stop: Sequence[str] | None = None,
    data_dir: str | os.PathLike | None = None,
    chunk_size: int | None = None,
    progress: bool = True,
    examples: list[Example] | None = None,
) -> dict[str, Any]:
    """Evaluate ``method`` on ``task`` with ``backend``; write records and summaries to ``out_dir``
    and return the summary. ``task`` and ``method`` may be names or objects. A method name (or None)
    is resolved against the checkpoint ``backend`` serves (:func:`method_for_backend`), as
    ``anchored-reasoning eval --method`` does: a checkpoint trained here is prompted in its trained
    format, and a name it was not trained with is refused; an instruct-style method object for such a
    checkpoint is refused too. Sampling defaults come from the task's ``generation`` settings; the
    arguments override them."""
    task = _resolve_task(task)
    if method is None or isinstance(method, str):
        method = method_for_backend(method, backend)  # as the CLI does: a trained checkpoint's own format
    else:
        check_method_fits(method, backend)
    if n < 1:
        raise ConfigError(f"n={n}: ask for at least one sample per example")
    if limit is not None and limit < 1:
        raise ConfigError(f"limit={limit}: must be >= 1 (omit it for the whole split)")
    method_name = describe_method(method)["name"]
    if hasattr(task, "generation_for"):
        gen = dict(task.generation_for(method_name))  # per-method overrides (e.g. a short nocot budget)
    else:
        gen = {k: v for k, v in (getattr(task, "generation", None) or {}).items() if k != "methods"}
    spec = SamplingSpec(
        max_new_tokens=int(max_new_tokens if max_new_tokens is not None else gen.get("max_new_tokens", 512)),
        temperature=float(temperature if temperature is not None else gen.get("temperature", 0.0)),
        top_p=float(top_p if top_p is not None else gen.get("top_p", 1.0)),
        n=int(n),
        stop=list(stop) if stop is not None else list(dict.fromkeys([*(gen.get("stop") or []), *getattr(method, "stop", [])])),
        seed=int(seed),
    )
    if spec.greedy and n > 1:
        log.warning("n=%d with greedy decoding: every sample is the same; set --temperature > 0 for pass@k", n)
    if examples is None:
        examples = task.load(split, data_dir=data_dir, limit=limit)
    elif limit is not None:
        examples = examples[:limit]
    ids = [str(e.id) for e in examples]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"task {getattr(task, 'name', task)!r} split {split!r} has repeated example ids")
    if getattr(task, "is_code", False):  # refuse unisolated code execution before generating anything
        from anchored_reasoning.tasks.code_exec import preflight

        preflight()

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    task_name = getattr(task, "name", str(task))
    backend_desc = _jsonable(backend.describe())
    config = {
        "task": task_name,
        "split": split,
        "method": describe_method(method),
        "backend": backend_desc,
        "sampling": _jsonable(dataclasses.asdict(spec)),
        "limit": limit,
        "data_dir": str(data_dir) if data_dir is not None else os.environ.get("ANCHORED_REASONING_DATA"),
    }
    lock_file = open(out / ".lock", "w")
    try:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ResumeError(f"another run is writing to {out} right now; wait for it or use another --out") from None
        old = check_resume(out, config)
        session = uuid.uuid4().hex[:12]
        sessions = list((old or {}).get("sessions", []))
        sessions.append({"session": session, "started": _now()})
        config["sessions"] = sessions
        if old is not None:
            config["created"] = old.get("created", _now())
        else:
            config["created"] = _now()
        atomic_write(out / CONFIG, json.dumps(config, indent=2, default=str) + "\n")

        records_path = out / RECORDS
        records = load_records(records_path)
        have: dict[str, set[int]] = {}
        for r in records:
            have.setdefault(str(r["id"]), set()).add(int(r["sample"]))
        todo = [e for e in examples if len(have.get(str(e.id), set()) & set(range(n))) < n]
        total = len(examples) * n
        done_before = total - sum(n - len(have.get(str(e.id), set()) & set(range(n))) for e in examples)
        if done_before:
            log.info("resuming %s: %d of %d samples already done", out, done_before, total)
        chunk = int(chunk_size or getattr(backend, "batch_size", 16) or 16)
        chunk = max(1, chunk)
        done_records = len(records)
        t0 = time.perf_counter()
        bars = PhaseBars(total, done_before, records, f"{task_name}/{describe_method(method)['name']}", show=progress)
        try:
            for start in range(0, len(todo), chunk):
                batch = todo[start : start + chunk]
                prompts = [method.prompt(ex, task) for ex in batch]
                t_gen = time.perf_counter()
                failed = None
                try:
                    completions = generate_with_progress(backend, prompts, spec, bars.live)
                except BackendError as err:
                    # a backend that says which prompts did finish (the openai backend when its server
                    # dies mid-chunk) gets those written before the error stops the run
                    partial = getattr(err, "partial", None) or {}
                    keep = sorted(i for i in partial if 0 <= i < len(batch))
                    if not keep:
                        raise
                    failed = err
                    batch, prompts, completions = [batch[i] for i in keep], [prompts[i] for i in keep], [partial[i] for i in keep]
                t_gen = time.perf_counter() - t_gen
                if len(completions) != len(batch) or any(len(c) != n for c in completions):
                    raise ConfigError(f"backend {getattr(backend, 'name', backend)!r} returned the wrong number of completions")
                flat_ex, flat_text, flat_meta = [], [], []
                for ex, prompt, samples in zip(batch, prompts, completions):
                    missing = set(range(n)) - have.get(str(ex.id), set())
                    for si, comp in enumerate(samples):
                        if si in missing:
                            flat_ex.append(ex)
                            flat_text.append(comp.text)
                            flat_meta.append((ex, prompt, si, comp))
                bars.generated(len(flat_meta), sum(int(m[3].n_tokens) for m in flat_meta), t_gen)
                grades = _grade_all(task, flat_text, flat_ex, [m[3].finish_reason for m in flat_meta])
                new = []
                for (ex, prompt, si, comp), grade in zip(flat_meta, grades):
                    new.append({
                        "id": str(ex.id),
                        "sample": si,
                        "prompt": prompt.text,
                        "completion": comp.text,
                        "gold": gold_of(task, ex),
                        "extracted": grade.extracted,
                        "correct": bool(grade.correct),
                        "tokens": int(comp.n_tokens),
                        "seconds": round(float(comp.seconds), 6),
                        "finish_reason": comp.finish_reason,
                        **({"meta": _jsonable(comp.meta)} if getattr(comp, "meta", None) else {}),
                        "details": _jsonable(grade.details or {}),
                        "session": session,
                        "time": _now(),
                    })
                    have.setdefault(str(ex.id), set()).add(si)
                _append(records_path, new)
                records.extend(new)
                bars.graded(new)
                # keep the session's progress in config.json, so a killed session still counts its time
                sessions[-1].update({"wall_seconds": round(time.perf_counter() - t0, 3), "generated": len(records) - done_records})
                atomic_write(out / CONFIG, json.dumps(config, indent=2, default=str) + "\n")
                if failed is not None:
                    log.warning("%s: kept the %d samples that finished before the backend failed", out, len(new))
                    raise failed
        finally:
            bars.close()
        elapsed = time.perf_counter() - t0
        sessions[-1].update({"ended": _now(), "wall_seconds": round(elapsed, 3), "generated": len(records) - done_records})
        atomic_write(out / CONFIG, json.dumps(config, indent=2, default=str) + "\n")

        summary = summarize(
            records,
            metrics=list(getattr(task, "metrics", None) or ["accuracy"]),
            is_code=bool(getattr(task, "is_code", False)),
            n=n,
            ids=ids,
            seed=seed,
            meta={
                "task": task_name,
                "split": split,
                "method": config["method"]["name"],
                "style": config["method"]["style"],
                "model": backend_desc.get("model_arg") or backend_desc.get("model"),
                "backend": backend_desc.get("backend", getattr(backend, "name", None)),
                "n": n,
                "temperature": spec.temperature,
                "max_new_tokens": spec.max_new_tokens,
                "seed": seed,
                "limit": limit,
                "wall_seconds": round(sum(float(s.get("wall_seconds") or 0.0) for s in sessions), 3),
            },
        )
        atomic_write(out / SUMMARY_JSON, json.dumps(summary, indent=2, default=str) + "\n")
        atomic_write(out / SUMMARY_MD, render_markdown(summary))
        return summary
    finally:
        lock_file.close()


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")
