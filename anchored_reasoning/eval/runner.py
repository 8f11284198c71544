"""The evaluation runner: task x method x backend -> per-sample records and a summary.

>>> from anchored_reasoning.backends import get_backend
>>> backend = get_backend("hf", "smollm2-135m")
>>> run_eval("gsm8k", backend, "cot", limit=20, out_dir="runs/gsm8k-cot")  # doctest: +SKIP

:func:`run_eval` reads top to bottom as its steps, each a function below: resolve the task and the
method (:func:`~anchored_reasoning.eval.methods.method_for_backend`), the sampling settings
(:func:`sampling_spec`), the examples, the code sandbox's preflight for code tasks, the resume plan
(what ``records.jsonl`` already holds), then chunk by chunk generation (:func:`_generate`) and grading
into records (:func:`_grade_chunk`, with :func:`~anchored_reasoning.eval.grading.grade_all`) appended to the file, and last the summary (:func:`_summarise`).
The run directory's files and a record's fields are described in :mod:`anchored_reasoning.eval.records`.

Resuming: rerunning into the same ``out_dir`` reads the records that are there, generates only
the missing (example, sample) pairs and never writes one twice. Records are appended in chunks
and fsynced, so a crash or SIGKILL loses at most the chunk in flight (when a backend fails with a
:class:`BackendError` carrying ``partial`` -- the openai backend when its server dies -- the prompts
of the chunk that did finish are written first, so only the requests in flight are lost); a last line
cut short by a kill is dropped and the file repaired. A run whose task, split, method, model or
sampling differ from ``config.json`` is refused with :class:`ResumeError` (``limit`` may change: a
larger limit extends the run).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from anchored_reasoning.backends.latent import require_latent_backend
from anchored_reasoning.backends import generate_with_progress
from anchored_reasoning.errors import BackendError, ConfigError, ResumeError
from anchored_reasoning.eval.grading import gold_of, grade_all
from anchored_reasoning.eval.methods import check_method_fits, method_for_backend
from anchored_reasoning.eval.progress import PhaseBars
from anchored_reasoning.eval.records import (
    RECORDS,
    SUMMARY_JSON,
    SUMMARY_MD,
    append_records,
    describe_method,
    jsonable,
    load_records,
    make_record,
    now,
    samples_done,
    start_session,
    write_config,
)
from anchored_reasoning.eval.report import render_markdown, summarize
from anchored_reasoning.files import atomic_write
from anchored_reasoning.types import Completion, Example, Prompt, SamplingSpec

log = logging.getLogger(__name__)

#: The split :func:`run_eval` evaluates when none is given.
DEFAULT_SPLIT = "test"


def run_eval(task: Any, backend: Any, method: Any, *, out_dir: str | os.PathLike, split: str = DEFAULT_SPLIT,
             limit: int | None = None, n: int = 1, seed: int = 0, temperature: float | None = None,
             top_p: float | None = None, max_new_tokens: int | None = None, stop: Sequence[str] | None = None,
             data_dir: str | os.PathLike | None = None, chunk_size: int | None = None, progress: bool = True,
             examples: list[Example] | None = None) -> dict[str, Any]:
    """Evaluate ``method`` on ``task`` with ``backend``; write records and summaries to ``out_dir``
    and return the summary. ``task`` and ``method`` may be names or objects. A method name (or None)
    is resolved against the checkpoint ``backend`` serves (:func:`method_for_backend`), as
    ``anchored-reasoning eval --method`` does: a checkpoint trained here is prompted in its trained
    format, and a name it was not trained with is refused; an instruct-style method object for such a
    checkpoint is refused too. Sampling defaults come from the task's ``generation`` settings; the
    arguments override them. ``examples`` replaces the task's own (``limit`` still applies)."""
    task = resolve_task(task)
    if method is None or isinstance(method, str):
        method = method_for_backend(method, backend)  # as the CLI does: a trained checkpoint's own format
    else:
        check_method_fits(method, backend)
    require_latent_backend(method, backend)  # continuous thoughts (coconut) need the hf backend
    spec = sampling_spec(task, method, n=n, seed=seed, temperature=temperature, top_p=top_p,
                         max_new_tokens=max_new_tokens, stop=stop)
    examples = _load_examples(task, split, limit, data_dir, examples)
    if getattr(task, "is_code", False):  # refuse unisolated code execution before generating anything
        from anchored_reasoning.tasks.code_exec import preflight

        preflight()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "task": getattr(task, "name", str(task)), "split": split, "method": describe_method(method),
        "backend": jsonable(backend.describe()), "sampling": jsonable(dataclasses.asdict(spec)), "limit": limit,
        "data_dir": str(data_dir) if data_dir is not None else os.environ.get("ANCHORED_REASONING_DATA"),
    }
    with _locked(out):
        session = start_session(out, config)  # refuses a different run already in out
        records = load_records(out / RECORDS)
        have = samples_done(records)
        todo, done_before = _resume_plan(out, examples, have, n)
        size = max(1, int(chunk_size or getattr(backend, "batch_size", 16) or 16))
        t0, had = time.perf_counter(), len(records)
        bars = PhaseBars(len(examples) * n, done_before, records, f"{config['task']}/{config['method']['name']}",
                         show=progress)
        try:
            for start in range(0, len(todo), size):
                chunk = _generate(backend, task, method, todo[start : start + size], spec, bars)
                new = _grade_chunk(task, chunk, have, session, bars)
                append_records(out / RECORDS, new)
                records.extend(new)
                bars.graded(new)
                _log_session(out, config, t0, len(records) - had)  # a killed session still counts its time
                if chunk.failed is not None:
                    log.warning("%s: kept the %d samples that finished before the backend failed", out, len(new))
                    raise chunk.failed
        finally:
            bars.close()
        _log_session(out, config, t0, len(records) - had, ended=now())
        return _summarise(out, task, backend, records, examples, config, spec)


def resolve_task(task: Any) -> Any:
    """``task`` as a Task: a name is looked up in the registry, anything else is returned as it is."""
    if isinstance(task, str):
        from anchored_reasoning.tasks import get_task

        return get_task(task)
    return task


def sampling_spec(task: Any, method: Any, *, n: int = 1, seed: int = 0, temperature: float | None = None,
                  top_p: float | None = None, max_new_tokens: int | None = None,
                  stop: Sequence[str] | None = None) -> SamplingSpec:
    """What to generate: each argument given, else the task's ``generation`` settings for this method
    (``task.generation_for``: per-method overrides such as a short nocot budget), else the
    :class:`SamplingSpec` defaults. Stop strings: ``stop`` replaces the task's and the method's."""
    if n < 1:
        raise ConfigError(f"n={n}: ask for at least one sample per example")
    if hasattr(task, "generation_for"):
        gen = dict(task.generation_for(describe_method(method)["name"]))
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
    return spec


def _load_examples(task: Any, split: str, limit: int | None, data_dir: Any, examples: list[Example] | None) -> list[Example]:
    """The task's examples of ``split`` (or the ``examples`` given), the first ``limit``; ids must be unique."""
    if limit is not None and limit < 1:
        raise ConfigError(f"limit={limit}: must be >= 1 (omit it for the whole split)")
    if examples is None:
        examples = task.load(split, data_dir=data_dir, limit=limit)
    elif limit is not None:
        examples = examples[:limit]
    ids = [str(e.id) for e in examples]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"task {getattr(task, 'name', task)!r} split {split!r} has repeated example ids")
    return examples


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    """Hold ``out/.lock`` for the run: a second run writing to the same folder is refused."""
    with open(out / ".lock", "w") as lock_file:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ResumeError(f"another run is writing to {out} right now; wait for it or use another --out") from None
        yield


def _resume_plan(out: Path, examples: list[Example], have: dict[str, set[int]], n: int) -> tuple[list[Example], int]:
    """The examples that still miss one of their ``n`` samples, and how many samples are done already."""
    todo = [e for e in examples if not have.get(str(e.id), set()) >= set(range(n))]
    done = sum(len(have.get(str(e.id), set()) & set(range(n))) for e in examples)
    if done:
        log.info("resuming %s: %d of %d samples already done", out, done, len(examples) * n)
    return todo, done


@dataclasses.dataclass
class _Chunk:
    """One chunk's generation: the examples that got completions, their prompts, the completions, the
    seconds it took, and the backend's error when it failed part-way (raised once these are written)."""

    examples: list[Example]
    prompts: list[Prompt]
    completions: list[list[Completion]]
    seconds: float
    failed: BackendError | None = None


def _generate(backend: Any, task: Any, method: Any, batch: list[Example], spec: SamplingSpec, bars: PhaseBars) -> _Chunk:
    """Prompt and generate one chunk. A backend that fails saying which prompts did finish (the openai
    backend when its server dies mid-chunk: ``BackendError.partial``) gets those kept, with the error
    to raise once they are written; any other failure propagates at once."""
    prompts = [method.prompt(ex, task) for ex in batch]
    t = time.perf_counter()
    failed = None
    try:
        completions = generate_with_progress(backend, prompts, spec, bars.live)
    except BackendError as err:
        partial = getattr(err, "partial", None) or {}
        keep = sorted(i for i in partial if 0 <= i < len(batch))
        if not keep:
            raise
        failed = err
        batch, prompts, completions = [batch[i] for i in keep], [prompts[i] for i in keep], [partial[i] for i in keep]
    if len(completions) != len(batch) or any(len(c) != spec.n for c in completions):
        raise ConfigError(f"backend {getattr(backend, 'name', backend)!r} returned the wrong number of completions")
    return _Chunk(batch, prompts, completions, time.perf_counter() - t, failed)


def _grade_chunk(task: Any, chunk: _Chunk, have: dict[str, set[int]], session: str, bars: PhaseBars) -> list[dict[str, Any]]:
    """The chunk's records: every sample not already in ``have``, graded."""
    todo = [(ex, prompt, si, comp) for ex, prompt, samples in zip(chunk.examples, chunk.prompts, chunk.completions)
            for si, comp in enumerate(samples) if si not in have.get(str(ex.id), set())]
    bars.generated(len(todo), sum(int(comp.n_tokens) for *_, comp in todo), chunk.seconds)
    grades = grade_all(task, [comp.text for *_, comp in todo], [ex for ex, *_ in todo],
                        [comp.finish_reason for *_, comp in todo])
    return [make_record(ex, si, prompt, comp, gold_of(task, ex), grade, session)
            for (ex, prompt, si, comp), grade in zip(todo, grades)]


def _log_session(out: Path, config: dict[str, Any], t0: float, generated: int, **extra: Any) -> None:
    """Write this session's wall seconds and samples generated (and ``extra``) into ``config.json``."""
    config["sessions"][-1].update(wall_seconds=round(time.perf_counter() - t0, 3), generated=generated, **extra)
    write_config(out, config)


def _summarise(out: Path, task: Any, backend: Any, records: list[dict[str, Any]], examples: list[Example],
               config: dict[str, Any], spec: SamplingSpec) -> dict[str, Any]:
    """Write ``summary.json`` and ``summary.md`` (:func:`~anchored_reasoning.eval.report.summarize` of all the
    run's records, over every session) and return the summary."""
    described = config["backend"]
    summary = summarize(
        records,
        metrics=list(getattr(task, "metrics", None) or ["accuracy"]),
        is_code=bool(getattr(task, "is_code", False)),
        n=spec.n,
        ids=[str(e.id) for e in examples],
        seed=spec.seed,
        meta={
            "task": config["task"],
            "split": config["split"],
            "method": config["method"]["name"],
            "style": config["method"]["style"],
            "model": described.get("model_arg") or described.get("model"),
            "backend": described.get("backend", getattr(backend, "name", None)),
            "n": spec.n,
            "temperature": spec.temperature,
            "max_new_tokens": spec.max_new_tokens,
            "seed": spec.seed,
            "limit": config["limit"],
            "wall_seconds": round(sum(float(s.get("wall_seconds") or 0.0) for s in config["sessions"]), 3),
        },
    )
    atomic_write(out / SUMMARY_JSON, json.dumps(summary, indent=2, default=str) + "\n")
    atomic_write(out / SUMMARY_MD, render_markdown(summary))
    return summary
