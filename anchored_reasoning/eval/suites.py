"""Evaluation suites: one YAML file, many (task, method) runs against one model, then a comparison.

    anchored-reasoning eval eval/baselines.yaml --model Qwen/Qwen2.5-1.5B-Instruct --base-url http://127.0.0.1:8000/v1
    anchored-reasoning eval baselines            # a suite name is looked up in the eval/ folders

A suite file::

    name: baselines
    model: Qwen/Qwen2.5-1.5B-Instruct   # --model overrides
    backend: openai                     # --backend overrides (hf, the default; openai, vllm, diffusion)
    backend_args: {base_url: http://127.0.0.1:8000/v1, concurrency: 16}   # --base-url / --backend-arg override
    out: runs/baselines                 # --out overrides (default runs/<name>); each run goes to OUT/<task>-<method>
    defaults: {split: test, n: 1}       # settings every run starts from
    runs:
      - {task: gsm8k, methods: [nocot, cot]}
      - {task: humaneval, methods: [nocot, cot], n: 10, temperature: 0.8}
    compare: true                       # write OUT/compare (table, paired tests, plots)

Run settings (in ``defaults`` or per run): split, limit, n, seed, temperature, top_p,
max_new_tokens, stop, method_args; a setting left out takes :func:`~anchored_reasoning.eval.runner.run_eval`'s
default (or the task's generation settings). ``run_suite(path, overrides)`` applies a mapping over the
file: ``model``, ``backend``, ``backend_args`` (merged over the file's), ``out``, ``data_dir``, any run
setting (over every run), and ``task`` / ``method``, which keep only the matching runs. The ``eval``
command passes the flags the user gave (``--model``, ``--limit``, ``--base-url``, ...) as that mapping.
The backend is built once and shared by all runs. Every run is resumable, so rerunning the suite
continues where it stopped.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.resources import search_dirs

logger = logging.getLogger(__name__)

SUITE_KEYS = {"name", "description", "model", "backend", "backend_args", "out", "defaults", "runs", "compare"}
RUN_SETTINGS = {"split", "limit", "n", "seed", "temperature", "top_p", "max_new_tokens", "stop", "method_args"}
RUN_KEYS = {"task", "method", "methods", "name"} | RUN_SETTINGS
#: what ``run_suite``'s overrides may set (see the module docstring)
OVERRIDE_KEYS = {"model", "backend", "backend_args", "out", "data_dir", "task", "method"} | RUN_SETTINGS
_INT_SETTINGS = ("limit", "n", "seed", "max_new_tokens")


@dataclass
class SuiteRun:
    """One (task, method) run of a suite, with its settings."""

    task: str
    method: str
    name: str
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class Suite:
    name: str
    path: Path
    model: str | None
    backend: str
    backend_args: dict[str, Any]
    out: str
    runs: list[SuiteRun]
    compare: bool = True
    description: str = ""


def find_suite(name_or_path: str | os.PathLike) -> Path:
    """A suite file: the path itself, else ``<name>.yaml`` in the eval folders."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    stem = p.name[:-5] if p.name.endswith(".yaml") else p.name
    for folder in search_dirs("eval"):
        for candidate in (folder / f"{stem}.yaml", folder / f"{stem}.yml"):
            if candidate.is_file():
                return candidate
    known = sorted({f.stem for d in search_dirs("eval") if d.is_dir() for f in d.glob("*.y*ml")})
    raise ConfigError(f"no suite file {str(name_or_path)!r}; built-in suites: {', '.join(known) or 'none'}")


def _check_keys(where: str, mapping: dict, allowed: set[str]) -> None:
    unknown = sorted(set(mapping) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")


def load_suite(name_or_path: str | os.PathLike) -> Suite:
    """Read and validate a suite file; errors name the file and the offending key."""
    path = find_suite(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a suite is a YAML mapping with a 'runs' list")
    _check_keys(str(path), data, SUITE_KEYS)
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ConfigError(f"{path}: 'defaults' must be a mapping")
    _check_keys(f"{path}: defaults", defaults, RUN_SETTINGS)
    defaults = _check_settings(f"{path}: defaults", defaults)
    backend_args = data.get("backend_args") or {}
    if not isinstance(backend_args, dict):
        raise ConfigError(f"{path}: 'backend_args' must be a mapping")
    raw_runs = data.get("runs")
    if not isinstance(raw_runs, list) or not raw_runs:
        raise ConfigError(f"{path}: 'runs' must be a non-empty list of {{task, methods}} entries")
    runs: list[SuiteRun] = []
    for i, entry in enumerate(raw_runs):
        where = f"{path}: runs[{i}]"
        if not isinstance(entry, dict) or "task" not in entry:
            raise ConfigError(f"{where}: each run needs a 'task'")
        _check_keys(where, entry, RUN_KEYS)
        methods = entry.get("methods", entry.get("method"))
        if methods is None:
            raise ConfigError(f"{where}: give 'method' or 'methods'")
        methods = [methods] if isinstance(methods, str) else list(methods)
        settings = {**defaults, **_check_settings(where, {k: v for k, v in entry.items() if k in RUN_SETTINGS})}
        for method in methods:
            name = entry.get("name") or f"{entry['task']}-{method}"
            if len(methods) > 1 and entry.get("name"):
                name = f"{entry['name']}-{method}"
            runs.append(SuiteRun(task=str(entry["task"]), method=str(method), name=str(name), settings=dict(settings)))
    names = [r.name for r in runs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"{path}: run names repeat ({', '.join(dupes)}); give repeated (task, method) runs a 'name'")
    return Suite(
        name=str(data.get("name") or path.stem),
        path=path,
        model=data.get("model"),
        backend=str(data.get("backend") or "hf"),
        backend_args=dict(backend_args),
        out=str(data.get("out") or f"runs/{data.get('name') or path.stem}"),
        runs=runs,
        compare=bool(data.get("compare", True)),
        description=str(data.get("description") or ""),
    )


def _check_settings(where: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Run settings with their types checked (a single ``stop`` string becomes a list of one)."""
    def bad(key: str, what: str) -> ConfigError:
        return ConfigError(f"{where}: {key} must be {what}, got {settings[key]!r}")

    out = dict(settings)
    for key in _INT_SETTINGS:
        if key in out and out[key] is not None and (isinstance(out[key], bool) or not isinstance(out[key], int)):
            raise bad(key, "an integer")
    for key in ("temperature", "top_p"):
        if key in out and out[key] is not None and (isinstance(out[key], bool) or not isinstance(out[key], (int, float))):
            raise bad(key, "a number")
    if "split" in out and not isinstance(out["split"], str):
        raise bad("split", "a split name")
    if isinstance(out.get("stop"), str):
        out["stop"] = [out["stop"]]
    if out.get("stop") is not None and not all(isinstance(x, str) for x in out["stop"]):
        raise bad("stop", "a list of strings")
    if out.get("method_args") is not None and not isinstance(out["method_args"], dict):
        raise bad("method_args", "a mapping")
    return out


def plan(suite: Suite, overrides: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[SuiteRun]]:
    """The backend spec (``{"backend", "model", "options"}``) and the runs, after ``overrides`` (see the
    module docstring; a None value counts as not given) and the task / method filters."""
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    _check_keys("suite overrides", given, OVERRIDE_KEYS)
    if not isinstance(given.get("backend_args", {}), dict):
        raise ConfigError(f"suite overrides: backend_args must be a mapping, got {given['backend_args']!r}")
    model = given.get("model") or suite.model
    if not model:
        raise ConfigError(f"{suite.path}: no model; set 'model:' in the suite or give one (--model)")
    spec = {"backend": given.get("backend") or suite.backend, "model": str(model),
            "options": {**suite.backend_args, **(given.get("backend_args") or {})}}
    over = _check_settings("suite overrides", {k: v for k, v in given.items() if k in RUN_SETTINGS})
    only_task, only_method = given.get("task"), given.get("method")
    runs = [SuiteRun(r.task, r.method, r.name, {**r.settings, **over}) for r in suite.runs
            if not (only_task and r.task != only_task or only_method and r.method != only_method)]
    if not runs:
        raise ConfigError(f"{suite.path}: no run matches task {only_task} / method {only_method}")
    return spec, runs


def run_suite(path: str | os.PathLike, overrides: dict[str, Any] | None = None, *, progress: bool = True) -> dict[str, Any]:
    """Run every (task, method) of the suite with one backend, then compare them. ``overrides`` apply over
    the suite file (see the module docstring). Returns ``{"suite", "out", "runs" (their folders),
    "summaries", "table" (Markdown), "compare" (:func:`~anchored_reasoning.eval.compare.compare_runs`'s
    result, None for a single run or ``compare: false``)}``."""
    from anchored_reasoning.backends import build_backend
    from anchored_reasoning.eval.compare import compare_runs
    from anchored_reasoning.eval.methods import method_for_backend
    from anchored_reasoning.eval.report import markdown_table
    from anchored_reasoning.eval.runner import run_eval

    suite = load_suite(path)
    spec, runs = plan(suite, overrides)
    given = overrides or {}
    out = Path(given.get("out") or suite.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "suite.json").write_text(json.dumps({
        "suite": suite.name, "file": str(suite.path), "backend": spec["backend"], "model": spec["model"],
        "runs": [{"name": r.name, "task": r.task, "method": r.method, **r.settings} for r in runs],
    }, indent=2, default=str) + "\n")
    logger.info("suite %s: %d runs of %s (%s backend) into %s", suite.name, len(runs), spec["model"], spec["backend"], out)
    seed = runs[0].settings.get("seed")  # the backend's and the comparison's (None: their defaults)
    backend = build_backend(spec["backend"], spec["model"], seed=seed, **spec["options"])
    summaries, dirs = [], []
    for i, r in enumerate(runs, 1):
        settings = {k: v for k, v in r.settings.items() if v is not None}  # null in the file: run_eval's default
        method = method_for_backend(r.method, backend, spec["model"], **(settings.pop("method_args", None) or {}))
        logger.info("suite %s: run %d/%d: %s", suite.name, i, len(runs), r.name)
        summaries.append(run_eval(r.task, backend, method, out_dir=out / r.name, data_dir=given.get("data_dir"),
                                  progress=progress, **settings))
        dirs.append(out / r.name)
    table = markdown_table(summaries)
    (out / "summary.md").write_text(f"# Suite {suite.name}: {spec['model']} ({spec['backend']})\n\n{table}")
    compared = None
    if suite.compare and len(dirs) > 1:
        compared = compare_runs(dirs, out_dir=out / "compare", **({} if seed is None else {"seed": seed}))
    return {"suite": suite.name, "out": out, "runs": dirs, "summaries": summaries, "table": table, "compare": compared}
