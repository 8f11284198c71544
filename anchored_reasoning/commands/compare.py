"""``anchored-reasoning compare``: put finished runs side by side.

    anchored-reasoning compare runs/gsm8k-nocot runs/gsm8k-cot --out runs/compare

Prints a table (accuracy with 95% interval, task metrics, pass@k, mean generated tokens,
throughput) and paired significance tests (exact McNemar, paired bootstrap) for runs on the
same task, and saves compare.md, compare.json and PNG plots in ``--out``. A directory that
holds several runs (a suite's output folder) stands for all of them.
"""
from __future__ import annotations

import argparse
from typing import Any


def run(args: argparse.Namespace) -> int:
    from anchored_reasoning.eval.compare import compare_runs

    result = compare_runs(args.runs, out_dir=args.out, seed=args.seed, plots=not args.no_plots)
    print(result["table_markdown"])
    print("Paired tests (shared examples):")
    print(result["tests_markdown"])
    if result["files"]:
        print("wrote " + ", ".join(result["files"]))
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "compare",
        help="side-by-side table, paired tests and plots for finished eval runs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (or folders holding runs)")
    p.add_argument("--out", default="compare", help="where to write compare.md/.json and PNGs (default: ./compare)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.set_defaults(func=run)
