"""Runs of the ``prontoqa_real_cpu`` recipe with other methods, graded on the real ProntoQA test and paired.

    anchored-reasoning train prontoqa_real_cpu method.name=pause output_dir=runs/pq_pause_s0
    python -m benchmarks.prontoqa_real_runs --run runs/pq_pause_s0

The recipe (anchor_chain by default) is the route that took the real 5-hop ProntoQA test to 0.90. The
same data, steps and seed with another method (pause, ACoT, stepwise, No-CoT) answer what the issue's
"every method" asks: where does each stand on the real test beside the written chain? For each run folder:
its end-of-training validation (the 800 real test problems, greedy) -- accuracy with a 95% interval over
problems, tokens, answers naming no option -- and a paired comparison (bootstrap over problems, exact
McNemar) with the anchor_chain and CoT runs of the same seed and data in ``prontoqa_mirror.json``
(``<method>_h5_2000_train2-3-4-5_std1800_s<seed>``). Writes ``benchmarks/results/prontoqa_real_methods.json``,
one entry per run (``entry_key``: ``<method>[_curriculum][_<label>]_s<seed>``); a rerun replaces its own entries.

A grid of runs (``benchmarks/recipe_grid.sh``, e.g. every method x 3 seeds on one GPU) is graded with one
``--label`` for all its runs; each run is then also paired with the CoT and anchor_chain runs of the same
label and seed, and ``summary[<label>]`` gives per method the seeds' accuracies, the pooled accuracy and
the seed-pooled paired difference from the label's CoT (exact McNemar over (seed, problem) pairs)::

    bash benchmarks/recipe_grid.sh runs/pq_gpu
    python -m benchmarks.prontoqa_real_runs --label gpu $(printf -- '--run %s ' runs/pq_gpu/*/)

A run of another method beside such a grid (same recipe, data and seed) is paired with the grid's runs of its
seed by ``--pair-with <label>`` (e.g. a CPU Coconut run against the GPU grid's pause, ACoT, stepwise, No-CoT).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import accuracy_ci, last_validation, paired_with

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "prontoqa_real_methods.json"
MIRROR = ROOT / "benchmarks" / "results" / "prontoqa_mirror.json"


def group_key(entry: dict[str, Any]) -> str:
    """``<method>[_curriculum][_<label>]``: the runs of one method (seeds apart) in a grid's summary."""
    parts = [entry["method"]] + (["curriculum"] if entry.get("curriculum") else []) + ([entry["label"]] if entry.get("label") else [])
    return "_".join(parts)


def entry_key(entry: dict[str, Any]) -> str:
    """``<method>[_curriculum][_<label>]_s<seed>``: a run with steps removed by a curriculum, or of a labelled
    grid, never replaces the recipe's plain run of the same method and seed."""
    return f"{group_key(entry)}_s{entry['seed']}"


def _pair(seed: int, mine: dict[str, int], theirs: dict[str, int]) -> dict[str, Any]:
    """One seed's paired comparison (``common.paired_with``), the other side's count named as such."""
    pair = paired_with({seed: mine}, {seed: theirs})
    pair["only_second_right"] = pair.pop("only_cot_right")
    return pair


def grade_run(run: Path, mirror: dict[str, Any], label: str | None = None) -> dict[str, Any]:
    from anchored_reasoning.eval.records import load_records

    config = json.loads((run / "run_config.json").read_text())
    recipe = config["recipe"]
    found = last_validation(run)
    if found is None:
        raise SystemExit(f"{run}: no validation records (is the run finished?)")
    records = [r for r in load_records(found) if r.get("sample", 0) == 0]
    if len(records) < 800:
        raise SystemExit(f"{run}: {found} has {len(records)} records, not the 800 real test problems")
    correct = {r["id"]: int(bool(r["correct"])) for r in records}
    seed = int(recipe.get("seed", 0))
    entry = {
        "method": recipe["method"]["name"], "seed": seed, "run": str(run), "model": recipe["model"]["name"],
        "curriculum": bool((recipe.get("training") or {}).get("curriculum")), "label": label,
        "train_steps": config.get("completed_step") or config.get("last_checkpoint_step"),
        "records": str(found),
        "real_test": {**accuracy_ci([float(v) for v in correct.values()]), "chance": 0.5,
                      "tokens": round(sum(r.get("tokens", 0) for r in records) / len(records), 2),
                      "no_answer": sum(r.get("extracted") is None for r in records),
                      "answers": {str(k): sum(r.get("extracted") == k for r in records)
                                  for k in sorted({r.get("extracted") for r in records}, key=str)}},
        "paired": {},
    }
    for other in ("anchor_chain", "cot"):
        key = f"{other}_h5_2000_train2-3-4-5_std1800_s{seed}"
        theirs = (mirror.get(key) or {}).get("real_test", {}).get("_correct")
        if theirs:
            entry["paired"][f"{entry['method']} - {other} ({key})"] = _pair(seed, correct, {k: int(v) for k, v in theirs.items()})
    entry["_correct"] = correct
    return entry


def pair_within(results: dict[str, Any], label: str) -> dict[str, Any]:
    """Pairs each run of ``label`` with the label's CoT and anchor_chain runs of its seed (in place), and
    returns the label's summary: per method (and curriculum) the seeds, their accuracies, the pooled
    accuracy over (seed, problem) and the seed-pooled paired difference from the label's CoT."""
    runs = {k: e for k, e in results.items() if e.get("label") == label and e.get("_correct")}
    by_method: dict[str, dict[int, dict[str, int]]] = {}
    for e in runs.values():
        by_method.setdefault(group_key(e), {})[e["seed"]] = e["_correct"]
    base = {m: f"{m}_{label}" for m in ("cot", "anchor_chain")}
    for e in runs.values():
        for other, group in base.items():
            theirs = by_method.get(group, {}).get(e["seed"])
            if theirs is not None and e["method"] != other:
                e["paired"][f"{e['method']} - {other} ({label}, seed {e['seed']})"] = _pair(e["seed"], e["_correct"], theirs)
    summary: dict[str, Any] = {}
    for group, seeds in sorted(by_method.items()):
        pooled = [float(v) for s in sorted(seeds) for v in seeds[s].values()]
        row = {"seeds": sorted(seeds), "per_seed": {str(s): round(sum(c.values()) / len(c), 4) for s, c in sorted(seeds.items())},
               "pooled": accuracy_ci(pooled), "chance": 0.5}
        cot = by_method.get(base["cot"])
        if cot and group != base["cot"]:
            row["minus_cot"] = paired_with(seeds, cot)
        summary[group] = row
    return summary


def pair_with_grid(entry: dict[str, Any], results: dict[str, Any], label: str) -> int:
    """Pairs ``entry`` (in place) with every run of the grid ``label`` of its seed (another method, or the
    same method with or without a curriculum): e.g. a CPU run of a method the GPU grid did not train, beside
    that grid's runs of the same recipe, data and seed. Returns how many pairs were added."""
    added = 0
    for e in results.values():
        if (isinstance(e, dict) and e.get("label") == label and e.get("seed") == entry["seed"] and e.get("_correct")
                and e is not entry and group_key(e) != group_key(entry)):
            entry["paired"][f"{entry['method']} - {group_key(e)} (seed {entry['seed']})"] = _pair(
                entry["seed"], entry["_correct"], e["_correct"])
            added += 1
    return added


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="append", required=True, help="a finished prontoqa_real_cpu run folder (repeat)")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--machine-note", default=None)
    p.add_argument("--label", default=None, help="one name for a grid of runs (e.g. gpu): keys, pairing within it, summary")
    p.add_argument("--pair-with", default=None, metavar="LABEL",
                   help="also pair each run with the runs of this grid label (e.g. gpu) of its seed")
    a = p.parse_args(argv)
    from anchored_reasoning.machine import machine_info

    mirror = json.loads(MIRROR.read_text())
    out = Path(a.out)
    results = json.loads(out.read_text()) if out.is_file() else {}
    for run in a.run:
        entry = grade_run(Path(run), mirror, a.label)
        entry["date"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        entry["machine"] = machine_info(note=a.machine_note)
        entry["command"] = "python -m benchmarks.prontoqa_real_runs " + " ".join(sys.argv[1:] if argv is None else argv)
        if a.pair_with and not pair_with_grid(entry, results, a.pair_with):
            raise SystemExit(f"--pair-with {a.pair_with}: no run of that label has seed {entry['seed']} in {out}")
        results[entry_key(entry)] = entry
        print(json.dumps({k: entry[k] for k in ("method", "seed", "real_test")}, default=str)[:400])
    if a.label:
        results.setdefault("summary", {})[a.label] = summary = pair_within(
            {k: v for k, v in results.items() if k != "summary"}, a.label)
        for group, row in summary.items():
            print(group, row["per_seed"], row["pooled"], row.get("minus_cot", ""))
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
