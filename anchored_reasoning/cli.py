"""The ``anchored-reasoning`` command. Each subcommand lives in ``anchored_reasoning/commands/<name>.py``
and exposes ``register(subparsers)`` (adds its parser and sets ``func``)."""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import sys

from anchored_reasoning.errors import AnchoredReasoningError

SUBCOMMANDS = ["tasks", "models", "eval", "train", "export", "demo", "serve", "compare", "ppl"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="anchored-reasoning",
        description="Anchor-then-generate reasoning: train anchored AR/diffusion models and run reasoning evals.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        module = f"anchored_reasoning.commands.{name}"
        if importlib.util.find_spec(module) is None:
            continue
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse stops a positional list at the first option: "train RECIPE --quiet a=1" leaves "a=1" over.
    # Overrides after an option are still overrides; anything else is an error, as parse_args would say.
    if extra and isinstance(getattr(args, "overrides", None), list) and all(
            "=" in x and not x.startswith("-") for x in extra):
        args.overrides += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except AnchoredReasoningError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
