"""``anchored-reasoning eval``: evaluate a model on a task with a method; resumable.

    anchored-reasoning eval --task gsm8k --model smollm2-135m --method cot --limit 20 --out runs/gsm8k-cot

Rerunning the same command into the same ``--out`` resumes (finished samples are kept).
``anchored-reasoning eval SUITE.yaml`` runs an evaluation suite (handled by
``anchored_reasoning.eval.suites`` where that module is installed).
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


def build_backend(args: argparse.Namespace):
    """The backend named by ``--backend`` with options from the flags and ``--backend-arg``."""
    from anchored_reasoning.backends import get_backend

    options = parse_key_values(args.backend_arg, "--backend-arg")
    if args.batch_size is not None:
        options["batch_size"] = args.batch_size
    if args.base_url is not None:
        options["base_url"] = args.base_url
    if args.api_key_env is not None:
        options["api_key_env"] = args.api_key_env
    try:
        try:
            return get_backend(args.backend, args.model, seed=args.seed, **options)
        except TypeError as exc:
            if "seed" not in str(exc):
                raise
            return get_backend(args.backend, args.model, **options)  # this backend takes no seed
    except TypeError as exc:
        raise ConfigError(f"backend {args.backend!r} does not accept these options {sorted(options)}: {exc}") from None


def _choose_backend(args: argparse.Namespace, local: str | None) -> None:
    """Set ``args.backend``: as given, else ``diffusion`` for a local diffusion checkpoint, else ``hf``.
    A diffusion checkpoint asked for with ``--backend hf`` or ``vllm`` is refused in one line."""
    from anchored_reasoning.models.zoo import checkpoint_kind

    kind, why = checkpoint_kind(local) if local else (None, "")
    if kind == "diffusion" and args.backend is None:
        log.info("%s is a diffusion checkpoint (%s): evaluating with --backend diffusion", local, why)
        args.backend = "diffusion"
    elif kind == "diffusion" and args.backend in ("hf", "vllm"):
        raise ConfigError(f"{local} is a diffusion checkpoint ({why}); --backend {args.backend} loads causal LMs "
                          "only: use --backend diffusion (or leave --backend out)")
    args.backend = args.backend or "hf"


def check_before_loading(args: argparse.Namespace, task: Any, method_options: dict[str, Any]) -> Any:
    """Check what needs no model before the model loads: ``--split``, ``--limit``, ``--n``, the
    ``--method`` name, the ``--model`` reference (missing path, mistyped alias) and the backend that fits
    the checkpoint. Returns the method when it is already known (a local checkpoint or a ``--method``
    name), else None (an alias or Hub id may carry its own metadata, read once it is resolved)."""
    from anchored_reasoning.eval.runner import build_method
    from anchored_reasoning.methods import list_methods
    from anchored_reasoning.models.zoo import ALIASES, check_model_reference

    splits = [str(s) for s in (getattr(task, "splits", None) or [])]
    if splits and args.split not in splits:
        raise ConfigError(f"task {args.task!r} has no split {args.split!r}; --split takes one of: {', '.join(splits)}")
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
        if importlib.util.find_spec("anchored_reasoning.eval.suites") is None:
            raise ConfigError(f"eval suites are not available in this installation (asked for {args.suite})")
        suites = importlib.import_module("anchored_reasoning.eval.suites")
        return int(suites.run_suite(args.suite, args) or 0)
    missing = [flag for flag, value in (("--task", args.task), ("--model", args.model), ("--out", args.out)) if not value]
    if missing:
        raise ConfigError(f"eval needs {', '.join(missing)} (or a suite file as the only argument)")
    from anchored_reasoning.eval.runner import run_eval
    from anchored_reasoning.eval.report import markdown_table
    from anchored_reasoning.tasks import get_task

    task = get_task(args.task)
    method_options = parse_key_values(args.method_arg, "--method-arg")
    method = check_before_loading(args, task, method_options)
    backend = build_backend(args)
    if method is None or not Path(str(args.model)).is_dir():  # an alias's metadata is known once it is resolved
        from anchored_reasoning.eval.runner import method_for_backend

        method = method_for_backend(args.method, backend, args.model, **method_options)
    summary = run_eval(
        task,
        backend,
        method,
        out_dir=args.out,
        split=args.split,
        limit=args.limit,
        n=args.n,
        seed=args.seed,
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        stop=args.stop,
        data_dir=args.data_dir,
        progress=not args.no_progress,
    )
    print(markdown_table([summary]), end="")
    print(f"records, summary.json, summary.md and config.json in {os.path.abspath(args.out)}")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("suite", nargs="?", help="an evaluation suite YAML file (instead of --task/--model/--method)")
    p.add_argument("--task", help="task name (see `anchored-reasoning tasks`)")
    p.add_argument("--model", help="checkpoint directory, Hub id, alias (smollm2-135m) or served model name")
    p.add_argument("--method", help="nocot, cot, ... (default for our trained checkpoints: the one they were trained with)")
    p.add_argument("--method-arg", action="append", metavar="KEY=VALUE", help="method option (repeatable)")
    p.add_argument("--split", default="test", help="data split (default: test)")
    p.add_argument("--limit", type=int, help="evaluate only the first N examples")
    p.add_argument("--n", type=int, default=1, help="samples per example (pass@k for code tasks)")
    p.add_argument("--seed", type=int, default=0, help="sampling and bootstrap seed")
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
