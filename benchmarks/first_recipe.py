"""The README's first CPU recipe, ``prosqa_search_cpu``: what each method reaches, with its interval, per depth and
paired against CoT over seeds.

    python -m benchmarks.first_recipe --work-dir runs/first_recipe --seeds 0 1 2       # trains what is missing
    python -m benchmarks.first_recipe --work-dir runs/first_recipe --no-train    # only the runs that finished

Each run is the README's command, ``anchored-reasoning train prosqa_search_cpu method.name=M ... seed=S
output_dir=<work-dir>/<method>_s<S>`` (one process at a time, one thread; rerun to resume: finished runs are
reused), graded on the recipe's 240 held-out problems (80 each at 1, 2 and 3 hops; none occurs in training) by the
recipe's own validation at its last step. Writes ``benchmarks/results/first_recipe.json``: per method the accuracy
over seeds with a 95% bootstrap interval (per problem averaged over seeds), per depth, per seed, mean tokens, and
the difference to CoT paired over the seeds both ran (bootstrap interval, exact McNemar test). Chance is 0.5.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import accuracy_ci, last_validation, paired_with, write_result

logger = logging.getLogger("benchmarks.first_recipe")

RECIPE = "prosqa_search_cpu"
#: The README's command line per method (the overrides after the recipe name).
METHODS: dict[str, list[str]] = {
    "cot": ["method.name=cot"],
    "anchor_chain": ["method.name=anchor_chain", "method.options.revisits=true", "method.options.mark_backups=true"],
    "nocot": ["method.name=nocot"],
}
#: The recipe's held-out mix: source i of data.valid holds the (i + 1)-hop problems (ids gen-valid<i>-<n>).
HOPS_OF_SOURCE = {"0": 1, "1": 2, "2": 3}
OUT = Path("benchmarks/results/first_recipe.json")


def command(method: str, seed: int, run_dir: Path) -> list[str]:
    return ["anchored-reasoning", "train", RECIPE, *METHODS[method], f"seed={seed}", f"output_dir={run_dir}"]


def hops_of(example_id: str) -> int:
    """1, 2 or 3 for a record id ``gen-valid<i>-<n>`` of the recipe's held-out mix."""
    source = example_id.split("-")[1].removeprefix("valid")
    return HOPS_OF_SOURCE[source]


def read_run(run_dir: Path) -> dict[str, Any]:
    """Per-problem correctness (id -> 0/1) and tokens of a finished run's last validation."""
    path = last_validation(run_dir)
    if path is None:
        raise FileNotFoundError(f"{run_dir} has no validation records (did the run finish?)")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {"correct": {r["id"]: int(bool(r["correct"])) for r in records},
            "tokens": sum(r["tokens"] for r in records) / len(records), "validation": str(path.parent)}


def summarise(runs: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    """Per method: pooled accuracy over seeds, per depth, per seed, tokens, and the paired difference to CoT."""
    out: dict[str, Any] = {}
    for method, by_seed in runs.items():
        seeds = sorted(by_seed)
        ids = sorted(set.intersection(*(set(by_seed[s]["correct"]) for s in seeds)))
        per_problem = [sum(by_seed[s]["correct"][i] for s in seeds) / len(seeds) for i in ids]
        depth = {str(h): accuracy_ci([p for i, p in zip(ids, per_problem) if hops_of(i) == h]) for h in (1, 2, 3)}
        entry = {"seeds": seeds, **accuracy_ci(per_problem), "by_hops": depth,
                 "per_seed": {str(s): round(sum(by_seed[s]["correct"].values()) / len(by_seed[s]["correct"]), 4)
                              for s in seeds},
                 "mean_tokens": round(sum(by_seed[s]["tokens"] for s in seeds) / len(seeds), 1)}
        if method != "cot" and "cot" in runs:
            entry["minus_cot"] = paired_with({s: r["correct"] for s, r in by_seed.items()},
                                             {s: r["correct"] for s, r in runs["cot"].items()})
            entry["tokens_vs_cot"] = round(entry["mean_tokens"] / (sum(r["tokens"] for r in runs["cot"].values())
                                                                   / len(runs["cot"])), 3)
        out[method] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work-dir", default="runs/first_recipe", help="where the runs are (and are trained)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--no-train", action="store_true", help="only read finished runs")
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    work = Path(args.work_dir)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    for method in args.methods:
        for seed in args.seeds:
            run_dir = work / f"{method}_s{seed}"
            if not (run_dir / "train_summary.json").is_file():
                if args.no_train:  # report the seeds that finished; the JSON lists them per method
                    logger.warning("%s is not finished: left out (run without --no-train to train it)", run_dir)
                    continue
                logger.info("training %s seed %d: %s", method, seed, " ".join(command(method, seed, run_dir)))
                subprocess.run(command(method, seed, run_dir), check=True, env=env)
            runs.setdefault(method, {})[seed] = read_run(run_dir)
        if method not in runs:
            raise SystemExit(f"{method}: no finished run in {work} for seeds {args.seeds}; run without --no-train")
    result = {
        "question": "What does the README's first CPU recipe reach per method (held-out 1-3-hop shortcut-free ProsQA)?",
        "recipe": RECIPE, "commands": {m: " ".join(command(m, 0, work / f"{m}_s0")) for m in args.methods},
        "chance": 0.5, "held_out": "240 problems, 80 per depth at 1-3 hops, none in training",
        "methods": summarise(runs),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "threads": int(env["OMP_NUM_THREADS"]),
                    "processes": "one run at a time", "python": sys.version.split()[0]},
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": "python -m benchmarks.first_recipe " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    write_result(args.out, result)
    for method, r in result["methods"].items():
        extra = f", minus CoT {r['minus_cot']['diff']:+.3f} {r['minus_cot']['ci95']} (p = {r['minus_cot']['mcnemar_p']})" \
            if r.get("minus_cot") else ""
        print(f"{method}: {r['accuracy']:.3f} {r['ci95']} at {r['mean_tokens']} tokens{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
