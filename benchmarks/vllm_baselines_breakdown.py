"""Why a baseline run scores what it scores: per run, how many samples were right, wrong (the model
ended its answer and it is wrong: the model), cut off by the token budget while wrong (truncated:
the harness budget may be to blame), or ended without an answer in the expected form (format).

    python benchmarks/vllm_baselines_breakdown.py benchmarks/results/vllm-baselines
        # writes benchmarks/results/vllm-baselines/breakdown.json and prints a Markdown table
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path


def classify(record: dict) -> str:
    """correct; truncated (wrong and cut off by the token budget: the harness may be to blame); wrong
    answer (the model finished and gave a wrong answer: the model); format (finished, no answer found)."""
    if record.get("correct"):
        return "correct"
    if record.get("finish_reason") == "length":
        return "truncated"
    return "wrong answer" if record.get("extracted") not in (None, "") else "no answer: format"


def breakdown(run_dir: Path) -> dict:
    records = [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines() if x.strip()]
    counts = Counter(classify(r) for r in records)
    tokens = sorted(r.get("tokens") or 0 for r in records)
    return {"run": run_dir.name, "samples": len(records), **{k: counts.get(k, 0) for k in
            ("correct", "wrong answer", "truncated", "no answer: format")},
            "median_tokens": tokens[len(tokens) // 2] if tokens else 0,
            "budget": json.loads((run_dir / "config.json").read_text())["sampling"]["max_new_tokens"]}


def main(root: str) -> int:
    base = Path(root)
    rows = [breakdown(d) for d in sorted(base.iterdir()) if (d / "records.jsonl").is_file()]
    (base / "breakdown.json").write_text(json.dumps({"command": f"python benchmarks/vllm_baselines_breakdown.py {root}",
                                                     "runs": rows}, indent=2) + "\n")
    keys = ["run", "samples", "correct", "wrong answer", "truncated", "no answer: format", "median_tokens", "budget"]
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/vllm-baselines"))
