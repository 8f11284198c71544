"""Runs of the ``prontoqa_real_cpu`` recipe with other methods, graded on the real ProntoQA test and paired.

    anchored-reasoning train prontoqa_real_cpu method.name=pause output_dir=runs/pq_pause_s0
    python benchmarks/prontoqa_real_runs.py --run runs/pq_pause_s0

The recipe (anchor_chain by default) is the route that took the real 5-hop ProntoQA test to 0.90. The
same data, steps and seed with another method (pause, ACoT, stepwise, No-CoT) answer what the issue's
"every method" asks: where does each stand on the real test beside the written chain? For each run folder:
its end-of-training validation (the 800 real test problems, greedy) -- accuracy with a 95% interval over
problems, tokens, answers naming no option -- and a paired comparison (bootstrap over problems, exact
McNemar) with the anchor_chain and CoT runs of the same seed and data in ``prontoqa_mirror.json``
(``<method>_h5_2000_train2-3-4-5_std1800_s<seed>``). Writes ``benchmarks/results/prontoqa_real_methods.json``,
one entry per run (``<method>_s<seed>``); a rerun replaces its own entries.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
OUT = ROOT / "benchmarks" / "results" / "prontoqa_real_methods.json"
MIRROR = ROOT / "benchmarks" / "results" / "prontoqa_mirror.json"


def grade_run(run: Path, mirror: dict[str, Any]) -> dict[str, Any]:
    from anchored_reasoning.eval.runner import load_records
    from prontoqa_mirror import paired_with
    from prosqa_real import _ci, last_validation

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
        "train_steps": config.get("completed_step") or config.get("last_checkpoint_step"),
        "records": str(found),
        "real_test": {**_ci([float(v) for v in correct.values()]), "chance": 0.5,
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
            pair = paired_with({seed: correct}, {seed: {k: int(v) for k, v in theirs.items()}})
            pair["only_second_right"] = pair.pop("only_cot_right")
            entry["paired"][f"{entry['method']} - {other} ({key})"] = pair
    entry["_correct"] = correct
    return entry


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="append", required=True, help="a finished prontoqa_real_cpu run folder (repeat)")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--machine-note", default=None)
    a = p.parse_args(argv)
    from anchored_reasoning.machine import machine_info

    mirror = json.loads(MIRROR.read_text())
    out = Path(a.out)
    results = json.loads(out.read_text()) if out.is_file() else {}
    for run in a.run:
        entry = grade_run(Path(run), mirror)
        entry["date"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        entry["machine"] = machine_info(note=a.machine_note)
        entry["command"] = "python benchmarks/prontoqa_real_runs.py " + " ".join(sys.argv[1:] if argv is None else argv)
        results[f"{entry['method']}_s{entry['seed']}"] = entry
        print(json.dumps({k: entry[k] for k in ("method", "seed", "real_test", "paired")}, default=str)[:800])
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
