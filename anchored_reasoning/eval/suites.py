"""Evaluation suites: one YAML file, many (task, method) runs against one model, then a comparison.

    anchored-reasoning eval eval/baselines.yaml --model Qwen/Qwen2.5-1.5B-Instruct --base-url http://127.0.0.1:8000/v1
    anchored-reasoning eval baselines            # a suite name is looked up in the eval/ folders

A suite file::

    name: baselines
    model: Qwen/Qwen2.5-1.5B-Instruct   # --model overrides
    backend: openai                     # --backend overrides (hf, openai, vllm, diffusion)
    backend_args: {base_url: http://127.0.0.1:8000/v1, concurrency: 16}   # --base-url / --backend-arg override
    out: runs/baselines                 # --out overrides; each run goes to OUT/<task>-<method>
    defaults: {split: test, n: 1}       # settings every run starts from
    runs:
      - {task: gsm8k, methods: [nocot, cot]}
      - {task: humaneval, methods: [nocot, cot], n: 10, temperature: 0.8}
    compare: true                       # write OUT/compare (table, paired tests, plots)

Run settings (in ``defaults`` or per run): split, limit, n, seed, temperature, top_p,
max_new_tokens, stop, method_args. Command-line flags (--limit, --n, --seed, --temperature,
--top-p, --max-new-tokens, --split, --data-dir) override every run; --task / --method keep
only the matching runs. The backend is built once and shared by all runs. Every run is
resumable, so rerunning the suite continues where it stopped.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.options import parse_key_values
from anchored_reasoning.resources import search_dirs

logger = logging.getLogger(__name__)

SUITE_KEYS = {"name", "description", "model", "backend", "backend_args", "out", "defaults", "runs", "compare"}
RUN_SETTINGS = {"split", "limit", "n", "seed", "temperature", "top_p", "max_new_tokens", "stop", "method_args"}
RUN_KEYS = {"task", "method", "methods", "name"} | RUN_SETTINGS
# eval flags that override every run (argparse dest -> run setting)
CLI_OVERRIDES = {"split": "split", "limit": "limit", "n": "n", "seed": "seed", "temperature": "temperature",
                 "top_p": "top_p", "max_new_tokens": "max_new_tokens", "stop": "stop"}
# eval parser defaults: a flag left at its default does not override the suite
PARSER_DEFAULTS = {"split": "test", "n": 1, "seed": 0, "backend": "hf"}


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
        settings = {**defaults, **{k: v for k, v in entry.items() if k in RUN_SETTINGS}}
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


def _cli(args: argparse.Namespace | None, name: str) -> Any:
    """The value of an eval flag, or None when it was not given (left at its default)."""
    if args is None:
        return None
    value = getattr(args, name, None)
    if value is None or (name in PARSER_DEFAULTS and value == PARSER_DEFAULTS[name]):
        return None
    return value


def plan(suite: Suite, args: argparse.Namespace | None = None) -> tuple[dict[str, Any], list[SuiteRun]]:
    """The backend spec and the runs after command-line overrides and filters."""
    model = _cli(args, "model") or suite.model
    if not model:
        raise ConfigError(f"{suite.path}: no model; set 'model:' in the suite or pass --model")
    backend = _cli(args, "backend") or suite.backend
    options = dict(suite.backend_args)
    options.update(parse_key_values(getattr(args, "backend_arg", None), "--backend-arg") if args else {})
    for flag in ("base_url", "api_key_env", "batch_size"):
        if _cli(args, flag) is not None:
            options[flag] = _cli(args, flag)
    spec = {"backend": backend, "model": str(model), "options": options}
    runs = []
    only_task, only_method = _cli(args, "task"), _cli(args, "method")
    for r in suite.runs:
        if only_task and r.task != only_task or only_method and r.method != only_method:
            continue
        settings = dict(r.settings)
        for flag, key in CLI_OVERRIDES.items():
            if _cli(args, flag) is not None:
                settings[key] = _cli(args, flag)
        runs.append(SuiteRun(r.task, r.method, r.name, settings))
    if not runs:
        raise ConfigError(f"{suite.path}: no run matches --task {only_task} / --method {only_method}")
    return spec, runs


def build_backend(spec: dict[str, Any], seed: int = 0):
    from anchored_reasoning.backends import get_backend

    try:
        try:
            return get_backend(spec["backend"], spec["model"], seed=seed, **spec["options"])
        except TypeError as exc:
            if "seed" not in str(exc):
                raise
            return get_backend(spec["backend"], spec["model"], **spec["options"])
    except TypeError as exc:
        raise ConfigError(f"backend {spec['backend']!r} does not accept options {sorted(spec['options'])}: {exc}") from None


def run_suite(path: str | os.PathLike, args: argparse.Namespace | None = None) -> int:
    """Run every (task, method) of the suite with one backend, then compare them. Returns 0."""
    from anchored_reasoning.eval.compare import compare_runs
    from anchored_reasoning.eval.report import markdown_table
    from anchored_reasoning.eval.runner import method_for_backend, run_eval

    suite = load_suite(path)
    spec, runs = plan(suite, args)
    out = Path(_cli(args, "out") or suite.out)
    out.mkdir(parents=True, exist_ok=True)
    data_dir = _cli(args, "data_dir")
    progress = not bool(getattr(args, "no_progress", False))
    (out / "suite.json").write_text(json.dumps({
        "suite": suite.name, "file": str(suite.path), "backend": spec["backend"], "model": spec["model"],
        "runs": [{"name": r.name, "task": r.task, "method": r.method, **r.settings} for r in runs],
    }, indent=2, default=str) + "\n")
    logger.info("suite %s: %d runs of %s (%s backend) into %s", suite.name, len(runs), spec["model"], spec["backend"], out)
    backend = build_backend(spec, seed=int(runs[0].settings.get("seed", 0)))
    summaries, dirs = [], []
    for i, r in enumerate(runs, 1):
        s = dict(r.settings)
        method = method_for_backend(r.method, backend, spec["model"], **(s.pop("method_args", None) or {}))
        logger.info("suite %s: run %d/%d: %s", suite.name, i, len(runs), r.name)
        summary = run_eval(
            r.task, backend, method, out_dir=out / r.name, data_dir=data_dir, progress=progress,
            split=s.get("split", "test"), limit=s.get("limit"), n=int(s.get("n", 1)), seed=int(s.get("seed", 0)),
            temperature=s.get("temperature"), top_p=s.get("top_p"), max_new_tokens=s.get("max_new_tokens"),
            stop=s.get("stop"),
        )
        summaries.append(summary)
        dirs.append(out / r.name)
    table = markdown_table(summaries)
    (out / "summary.md").write_text(f"# Suite {suite.name}: {spec['model']} ({spec['backend']})\n\n{table}")
    print(table, end="")
    if suite.compare and len(dirs) > 1:
        result = compare_runs(dirs, out_dir=out / "compare", seed=int(runs[0].settings.get("seed", 0)))
        print("\nPaired tests (shared examples):")
        print(result["tests_markdown"], end="")
        print(f"comparison in {out / 'compare'}")
    print(f"suite {suite.name}: {len(dirs)} runs in {os.path.abspath(out)}")
    return 0
