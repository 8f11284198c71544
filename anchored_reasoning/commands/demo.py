"""``anchored-reasoning demo``: the command over :mod:`anchored_reasoning.demo` (see its docstring)."""
from __future__ import annotations

import argparse
from pathlib import Path

from anchored_reasoning.demo import DEMO_METHODS, DemoSettings, parse_backbone, run_demo
from anchored_reasoning.demo_report import render_table
from anchored_reasoning import demo as _demo


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo",
        help="train the written anchors, CoT, pause and ACoT on generated ProsQA and compare them (CPU, minutes)",
        description=_demo.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    p.add_argument("--budget-minutes", type=float, default=7.0, help="total time budget for training + evaluation (default 7)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--methods", default=",".join(DEMO_METHODS), help="comma-separated, from nocot,cot,anchor_chain,pause,acot,stepwise (default cot,anchor_chain,pause,acot)")
    p.add_argument("--train-n", type=int, default=20000, help="generated training problems (default 20000)")
    p.add_argument("--eval-n", type=int, default=240, help="held-out generated problems, split over the depths (default 240)")
    p.add_argument("--hops", default="1,2,3", help="answer depths of the problems (ladder sizes; default 1,2,3)")
    p.add_argument("--trace", default="dfs", choices=["forward", "dfs", "dfs_paths"],
                   help="how the training problems' reasoning is written: the depth-first search from the asked entity "
                        "(dfs, default; dfs_paths writes the path so far at each step) or the dataset's proof (forward)")
    p.add_argument("--no-probe", action="store_true", help="skip the binding probe (the problems asked about the other entity)")
    p.add_argument("--real-n", type=int, default=0,
                   help="also evaluate on the first N real ProsQA test problems when $ANCHORED_REASONING_DATA is set (default 0)")
    p.add_argument("--backbone", default="logic-gpt2-search",
                   help="model every method fine-tunes: alias, checkpoint folder or Hub id (default: the shipped "
                        "logic-gpt2-search, the token-shift logic backbone pretrained on problems written as the search); 'none' trains a 2-layer GPT-2 from scratch instead")
    p.add_argument("--workers", type=int, default=None,
                   help="methods trained at once, one process each (default: one per core, at most one per method); "
                        "the terminal then shows one line per method")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: a 0.9M model trains faster on one thread than on two)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    settings = DemoSettings(
        methods=[m.strip() for m in args.methods.split(",") if m.strip()],
        seed=args.seed,
        budget_minutes=args.budget_minutes,
        train_n=args.train_n,
        eval_n=args.eval_n,
        real_n=args.real_n,
        hops=[int(h) for h in args.hops.split(",") if h.strip()],
        probe=not args.no_probe,
        trace=args.trace,
        threads=args.threads,
        workers=args.workers,
        backbone=parse_backbone(args.backbone),
    )
    summary = run_demo(settings, Path(args.out))
    print(render_table(summary))
    print(f"\nwrote {Path(args.out) / 'summary.json'}, {Path(args.out) / 'results.md'}, {Path(args.out) / 'demo.png'}")
    return 0


