"""HF backend: batched generation (batch 16) vs batch 1, tokens per second, side by side.

    OMP_NUM_THREADS=2 ANCHORED_REASONING_DATA=../shared/data python -m benchmarks.hf_batching

Same prompts for both (the first 16 GSM8K test questions in the CoT chat prompt), greedy,
64 new tokens, on the embedded SmolLM2-135M-Instruct (CPU, float32). Each setting runs
``--repeats`` times, interleaved so machine noise hits both alike; the best run of each is
compared. Writes benchmarks/results/hf_batching.json. Goal: >= 4x tokens/s at batch 16.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path


def gsm8k_questions(count: int) -> list[str]:
    data = os.environ.get("ANCHORED_REASONING_DATA")
    if data and (Path(data) / "gsm8k" / "test.jsonl").is_file():
        with open(Path(data) / "gsm8k" / "test.jsonl") as f:
            return [json.loads(line)["question"] for _, line in zip(range(count), f)]
    from anchored_reasoning.tasks import get_task  # the Hub copy, when there is no local data

    return [e.question for e in get_task("gsm8k").load("test", limit=count)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "hf_batching.json"))
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from anchored_reasoning.backends.hf import HFBackend
    from anchored_reasoning.types import Prompt, SamplingSpec

    template = "Solve the problem step by step, then give the final answer after ####.\n\n{q}"
    prompts = [
        Prompt(template.format(q=q), messages=[{"role": "user", "content": template.format(q=q)}])
        for q in gsm8k_questions(args.prompts)
    ]
    spec = SamplingSpec(max_new_tokens=args.max_new_tokens)
    backend = HFBackend(args.model, batch_size=args.batch_size, device="cpu")
    backend.generate(prompts[:2], SamplingSpec(max_new_tokens=4))  # warm-up

    load_before = os.getloadavg()
    runs: dict[int, list[dict]] = {1: [], args.batch_size: []}
    texts: dict[int, list[str]] = {}
    for _ in range(args.repeats):
        for bs in (1, args.batch_size):
            backend.batch_size = bs
            t0 = time.perf_counter()
            out = backend.generate(prompts, spec)
            wall = time.perf_counter() - t0
            tokens = sum(c[0].n_tokens for c in out)
            runs[bs].append({"wall_seconds": round(wall, 3), "tokens": tokens, "tokens_per_second": round(tokens / wall, 2)})
            texts[bs] = [c[0].text for c in out]
            print(f"batch {bs:>2}: {tokens} tokens in {wall:.1f} s = {tokens / wall:.1f} tokens/s", flush=True)
    best = {bs: max(r, key=lambda x: x["tokens_per_second"]) for bs, r in runs.items()}
    speedup = best[args.batch_size]["tokens_per_second"] / best[1]["tokens_per_second"]
    same = sum(a == b for a, b in zip(texts[1], texts[args.batch_size]))
    print(f"speedup at batch {args.batch_size}: {speedup:.2f}x (goal >= 4x); identical greedy texts: {same}/{len(prompts)}")
    result = {
        "benchmark": "hf_batching",
        "command": "OMP_NUM_THREADS=%d python -m benchmarks.hf_batching %s" % (args.threads, " ".join(sys.argv[1:])),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            # The machine is shared: 1-minute load averages before and after the runs, for context.
            "loadavg_1min_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        },
        "model": backend.describe(),
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "runs": {f"batch_{bs}": r for bs, r in runs.items()},
        "best_tokens_per_second": {f"batch_{bs}": b["tokens_per_second"] for bs, b in best.items()},
        "speedup": round(speedup, 2),
        "goal": ">= 4x tokens/s at batch 16",
        "goal_met": speedup >= 4.0,
        "identical_greedy_texts": f"{same}/{len(prompts)}",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
