"""``anchored-reasoning eval``: evaluate a model on a task with a method; resumable.

    anchored-reasoning eval --task gsm8k --model smollm2-135m --method cot --limit 20 --out runs/gsm8k-cot

Rerunning the same command into the same ``--out`` resumes (finished samples are kept).
``anchored-reasoning eval SUITE.yaml`` runs an evaluation suite (``anchored_reasoning.eval.suites``, where
that module is installed); the flags given then override the suite file's settings.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.options import parse_key_values

log = logging.getLogger(__name__)


#: flags that set a run's settings (run_eval keywords, suite run settings); a flag left out is absent, so
#: run_eval's default or the suite file's value applies
RUN_FLAGS = ("split", "limit", "n", "seed", "temperature", "top_p", "max_new_tokens", "stop", "data_dir")
#: flags a suite takes as overrides besides the run settings (task / method filter its runs)
SUITE_FLAGS = ("model", "backend", "out", "task", "method")


def backend_options(args: argparse.Namespace) -> dict[str, Any]:
    """The backend's options: ``--backend-arg KEY=VALUE`` pairs, with ``--batch-size``, ``--base-url`` and
    ``--api-key-env`` where given."""
    options = parse_key_values(args.backend_arg, "--backend-arg")
    for flag in ("batch_size", "base_url", "api_key_env"):
        if getattr(args, flag) is not None:
            options[flag] = getattr(args, flag)
    return options


def run_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The run settings the user gave on the command line, as run_eval keywords."""
    return {flag: getattr(args, flag) for flag in RUN_FLAGS if getattr(args, flag) is not None}


def suite_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The flags the user gave, as ``run_suite``'s overrides of the suite file."""
    overrides = {**run_settings(args), **{f: getattr(args, f) for f in SUITE_FLAGS if getattr(args, f) is not None}}
    options = backend_options(args)
    if options:
        overrides["backend_args"] = options
    if args.method_arg:  # method options over every run of the suite (the suite's own method_args key)
        overrides["method_args"] = parse_key_values(args.method_arg, "--method-arg")
    return overrides


def _run_suite(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("anchored_reasoning.eval.suites") is None:
        raise ConfigError(f"eval suites are not available in this installation (asked for {args.suite})")
    suites = importlib.import_module("anchored_reasoning.eval.suites")
    result = suites.run_suite(args.suite, suite_overrides(args), progress=not args.no_progress)
    print(result["table"], end="")
    if result["compare"] is not None:
        print("\nPaired tests (shared examples):")
        print(result["compare"]["tests_markdown"], end="")
        print(f"comparison in {Path(result['out']) / 'compare'}")
    print(f"suite {result['suite']}: {len(result['runs'])} runs in {os.path.abspath(result['out'])}")
    return 0


def _choose_backend(args: argparse.Namespace, local: str | None) -> None:
    """Set ``args.backend``: as given, else ``diffusion`` (``diffusion_gemma``) for a local diffusion
    (DiffusionGemma) checkpoint, else ``hf``. A backend that cannot load the checkpoint is refused in one line."""
    from anchored_reasoning.models.zoo import checkpoint_kind

    kind, why = checkpoint_kind(local) if local else (None, "")
    if kind in ("diffusion", "diffusion_gemma") and args.backend is None:
        log.info("%s is a %s checkpoint (%s): evaluating with --backend %s", local, kind.replace("_", " "), why, kind)
        args.backend = kind
    elif kind == "diffusion" and args.backend in ("hf", "vllm"):
        raise ConfigError(f"{local} is a diffusion checkpoint ({why}); --backend {args.backend} loads causal LMs "
                          "only: use --backend diffusion (or leave --backend out)")
    elif kind == "diffusion_gemma" and args.backend in ("hf", "vllm", "diffusion"):
        raise ConfigError(f"{local} is a DiffusionGemma checkpoint ({why}); it generates with its own block "
                          "diffusion: use --backend diffusion_gemma (or leave --backend out)")
    args.backend = args.backend or "hf"


def check_before_loading(args: argparse.Namespace, task: Any, method_options: dict[str, Any]) -> Any:
    """Check what needs no model before the model loads: ``--split``, ``--limit``, ``--n``, the
    ``--method`` name, the ``--model`` reference (missing path, mistyped alias) and the backend that fits
    the checkpoint. Returns the method when it is already known (a local checkpoint or a ``--method``
    name), else None (an alias or Hub id may carry its own metadata, read once it is resolved)."""
    from anchored_reasoning.eval.methods import build_method
    from anchored_reasoning.eval.runner import DEFAULT_SPLIT
    from anchored_reasoning.methods import list_methods
    from anchored_reasoning.models.zoo import ALIASES, check_model_reference

    splits = [str(s) for s in (getattr(task, "splits", None) or [])]
    split = args.split or DEFAULT_SPLIT
    if splits and split not in splits:
        raise ConfigError(f"task {args.task!r} has no split {split!r}; --split takes one of: {', '.join(splits)}")
    for flag, value in (("--limit", args.limit), ("--n", args.n)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} {value}: must be >= 1" + (" (omit it for the whole split)" if flag == "--limit" else ""))
    known = sorted({m.removeprefix("trained:") for m in list_methods()})
    if args.method and args.method.removeprefix("trained:") not in known:
        close = difflib.get_close_matches(args.method, known, n=2)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise ConfigError(f"unknown --method {args.method!r}{hint} (known: {', '.join(known)})")
    local = args.model if Path(str(args.model)).is_dir() else None
    if args.backend != "openai":  # an OpenAI-compatible server's model is a served name, not a reference
        check_model_reference(args.model)
    _choose_backend(args, local)
    if local or args.method or args.model not in ALIASES:
        return build_method(args.method, local, **method_options)
    return None


def run(args: argparse.Namespace) -> int:
    if getattr(args, "quiet", False):  # also for suites, which read --no-progress
        from anchored_reasoning.commands import quiet_console

        quiet_console()
        args.no_progress = True
    if getattr(args, "confirm_run_unsafe_code", False):  # read by the code sandbox (docs/sandbox.md)
        os.environ["ANCHORED_REASONING_ALLOW_UNISOLATED_CODE"] = "1"
    if args.suite:
        return _run_suite(args)
    missing = [flag for flag, value in (("--task", args.task), ("--model", args.model), ("--out", args.out)) if not value]
    if missing:
        raise ConfigError(f"eval needs {', '.join(missing)} (or a suite file as the only argument)")
    from anchored_reasoning.backends import build_backend
    from anchored_reasoning.eval.methods import method_for_backend
    from anchored_reasoning.eval.report import markdown_table
    from anchored_reasoning.eval.runner import run_eval
    from anchored_reasoning.tasks import get_task

    task = get_task(args.task)
    method_options = parse_key_values(args.method_arg, "--method-arg")
    method = check_before_loading(args, task, method_options)
    backend = build_backend(args.backend, args.model, seed=args.seed, **backend_options(args))
    if method is None or not Path(str(args.model)).is_dir():  # an alias's metadata is known once it is resolved
        method = method_for_backend(args.method, backend, args.model, **method_options)
    summary = run_eval(task, backend, method, out_dir=args.out, progress=not args.no_progress, **run_settings(args))
    print(markdown_table([summary]), end="")
    print(f"records, summary.json, summary.md and config.json in {os.path.abspath(args.out)}")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("suite", nargs="?", help="an evaluation suite YAML file (instead of --task/--model/--method)")
    p.add_argument("--task", help="task name (see `anchored-reasoning tasks`)")
    p.add_argument("--model", help="checkpoint directory, Hub id, alias (smollm2-135m) or served model name")
    p.add_argument("--method", help="nocot, cot, ... (default for our trained checkpoints: the one they were trained with)")
    p.add_argument("--method-arg", action="append", metavar="KEY=VALUE", help="method option (repeatable)")
    p.add_argument("--split", help="data split (default: test, or the suite's)")
    p.add_argument("--limit", type=int, help="evaluate only the first N examples")
    p.add_argument("--n", type=int, help="samples per example (pass@k for code tasks; default 1, or the suite's)")
    p.add_argument("--seed", type=int, help="sampling and bootstrap seed (default 0, or the suite's)")
    p.add_argument("--temperature", type=float, help="sampling temperature (0 = greedy; default from the task)")
    p.add_argument("--top-p", type=float, help="nucleus sampling threshold")
    p.add_argument("--max-new-tokens", type=int, help="generation budget per sample (default from the task)")
    p.add_argument("--stop", action="append", help="stop string (repeatable; replaces the task's)")
    p.add_argument("--batch-size", type=int, help="prompts per generation batch")
    p.add_argument("--backend", help="hf, openai, vllm or diffusion (default: diffusion for a diffusion checkpoint, "
                                     "else hf)")
    p.add_argument("--backend-arg", action="append", metavar="KEY=VALUE", help="backend option, e.g. dtype=bfloat16 (repeatable)")
    p.add_argument("--base-url", help="server URL for the openai backend")
    p.add_argument("--api-key-env", help="environment variable holding the API key (openai backend)")
    p.add_argument("--data-dir", help="local data folder (default: $ANCHORED_REASONING_DATA, else the Hub)")
    p.add_argument("--out", help="output directory (rerun with the same one to resume)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--quiet", action="store_true", help="no progress bars and only warnings on the console")
    p.add_argument("--confirm-run-unsafe-code", action="store_true",
                   help="code tasks: run model-written programs even where the sandbox cannot isolate them (no "
                        "namespaces; root with no unprivileged uid). Without it such runs are refused.")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "eval",
        help="evaluate a model on a reasoning task (resumable)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=run)
