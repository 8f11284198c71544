"""Why a baseline run scores what it scores: per run, how many samples were right, wrong (the model
ended its answer and it is wrong: the model), cut off by the token budget while wrong -- split into
*looping* (the text's tail repeats itself: a larger budget would not help, the model is to blame) and
*still going* (the harness budget may be to blame) -- or ended without an answer in the expected form
(format).

    python -m benchmarks.vllm_baselines_breakdown benchmarks/results/vllm-baselines
        # writes benchmarks/results/vllm-baselines/breakdown.json and prints a Markdown table
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path


#: A cut-off sample whose tail has at least this share of repeated word 6-grams is looping. On the
#: committed SmolLM2 runs, samples that ended on their own stay at or below 0.53 (one at 0.78), and 24
#: of the 27 AIME 2024 CoT samples cut at 4,096 tokens are at 0.79-1.00 (the other three: 0.57, 0, 0).
LOOP_SHARE = 0.6


def repeated_share(text: str, n: int = 6, tail_chars: int = 1500) -> float:
    """Share of the word ``n``-grams in the last ``tail_chars`` characters that occur earlier in that tail."""
    words = text[-tail_chars:].split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def classify(record: dict) -> str:
    """correct; truncated: looping (wrong, cut off by the token budget while repeating itself: the model)
    or truncated: still going (wrong and cut off: the harness budget may be to blame); wrong answer (the
    model finished and gave a wrong answer: the model); format (finished, no answer found)."""
    if record.get("correct"):
        return "correct"
    if record.get("finish_reason") == "length":
        looping = repeated_share(str(record.get("completion") or "")) >= LOOP_SHARE
        return "truncated: looping" if looping else "truncated: still going"
    return "wrong answer" if record.get("extracted") not in (None, "") else "no answer: format"


CATEGORIES = ("correct", "wrong answer", "truncated: looping", "truncated: still going", "no answer: format")


def breakdown(run_dir: Path) -> dict:
    records = [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines() if x.strip()]
    counts = Counter(classify(r) for r in records)
    tokens = sorted(r.get("tokens") or 0 for r in records)
    return {"run": run_dir.name, "samples": len(records), **{k: counts.get(k, 0) for k in CATEGORIES},
            "median_tokens": tokens[len(tokens) // 2] if tokens else 0,
            "budget": json.loads((run_dir / "config.json").read_text())["sampling"]["max_new_tokens"]}


def main(root: str) -> int:
    base = Path(root)
    rows = [breakdown(d) for d in sorted(base.iterdir()) if (d / "records.jsonl").is_file()]
    (base / "breakdown.json").write_text(json.dumps({"command": f"python -m benchmarks.vllm_baselines_breakdown {root}",
                                                     "runs": rows}, indent=2) + "\n")
    keys = ["run", "samples", *CATEGORIES, "median_tokens", "budget"]
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/vllm-baselines"))
