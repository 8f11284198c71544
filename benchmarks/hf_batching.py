"""HF backend batching against raw ``model.generate``: tokens/s at batch 16 over batch 1, both sides interleaved.

    OMP_NUM_THREADS=1 ANCHORED_REASONING_DATA=../shared/data python -m benchmarks.hf_batching

Same prompts for every setting (the first 16 GSM8K test questions in the CoT chat prompt, tokenized once by the
backend), greedy, 64 new tokens, the embedded SmolLM2-135M-Instruct (CPU, float32). Per repeat, in one process:
the backend at batch 1, raw ``model.generate`` at batch 1 (the same left-padded ids, the same
``GenerationConfig``), then both at batch 16, and the backend at batch 16 without its length-bucketed prompt pass
(``backend_unbucketed``: one padded pass, as before backends/hf_prefill.py). The best run of each is compared; texts
must be identical.

What bounds the speed-up is measured too: one profiled backend batch-16 call (seconds in the backend's own
per-step Python work: the stop/EOS tracker, padding, decoding) and the prompt pass alone (``max_new_tokens=1``)
at batch 1 and 16 (bucketed and one padded pass), with the prompt tokens each pays. Writes benchmarks/results/hf_batching.json.
Goal: >= 6x tokens/s at batch 16 over batch 1.
"""
from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import json
import os
import pstats
import sys
import time
from pathlib import Path

from benchmarks.common import machine, write_result


def gsm8k_questions(count: int) -> list[str]:
    data = os.environ.get("ANCHORED_REASONING_DATA")
    if data and (Path(data) / "gsm8k" / "test.jsonl").is_file():
        with open(Path(data) / "gsm8k" / "test.jsonl") as f:
            return [json.loads(line)["question"] for _, line in zip(range(count), f)]
    from anchored_reasoning.tasks import get_task  # the Hub copy, when there is no local data

    return [e.question for e in get_task("gsm8k").load("test", limit=count)]


def raw_generate(backend, encoded: list[list[int]], batch_size: int, max_new_tokens: int) -> tuple[list[str], int]:
    """Plain ``model.generate`` over ``encoded`` in batches (left-padded, greedy, EOS-stopped): texts and tokens."""
    import torch
    from transformers import GenerationConfig

    from anchored_reasoning.backends import left_pad

    tok = backend.tokenizer
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id,
                              eos_token_id=backend.eos_ids or None, bos_token_id=tok.bos_token_id)
    texts, tokens = [], 0
    for start in range(0, len(encoded), batch_size):
        ids, mask = left_pad(encoded[start:start + batch_size], tok.pad_token_id)
        with torch.inference_mode():
            out = backend.model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        for row in out[:, ids.shape[1]:].tolist():
            ended = next((i for i, t in enumerate(row) if t in backend.eos_ids), len(row))
            tokens += ended
            texts.append(tok.decode([t for t in row[:ended] if t not in backend.strip_ids], skip_special_tokens=False))
    return texts, tokens


def profile_batch(backend, prompts, spec) -> dict[str, float]:
    """Seconds of one backend call at its batch size, and the share spent in the backend's own Python."""
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.runcall(backend.generate, prompts, spec)
    wall = time.perf_counter() - t0
    stats = pstats.Stats(prof).stats
    own = {"tracker": "__call__", "left_pad": "left_pad", "fair_shares": "fair_shares", "encode": "encode",
           "bucketed_prefill": "bucketed_prefill"}
    out = {"wall_seconds": round(wall, 3)}
    for label, fn in own.items():
        cum = sum(v[3] for (path, _line, name), v in stats.items() if name == fn and "anchored_reasoning" in path)
        out[f"{label}_seconds"] = round(cum, 4)
    out["decode_seconds"] = round(sum(v[3] for (p, _l, n), v in stats.items() if n == "decode" and "tokenization" in p), 4)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "hf_batching.json"))
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from anchored_reasoning.backends.hf import HFBackend
    from anchored_reasoning.backends.hf_prefill import plan_buckets
    from anchored_reasoning.types import Prompt, SamplingSpec

    template = "Solve the problem step by step, then give the final answer after ####.\n\n{q}"
    prompts = [Prompt(template.format(q=q), messages=[{"role": "user", "content": template.format(q=q)}])
               for q in gsm8k_questions(args.prompts)]
    spec = SamplingSpec(max_new_tokens=args.max_new_tokens)
    backend = HFBackend(args.model, batch_size=args.batch_size, device="cpu")
    # the backend's own order (longest first), so raw generate batches exactly the same rows
    encoded = sorted((backend.encode(p) for p in prompts), key=lambda x: -len(x))
    backend.generate(prompts[:2], SamplingSpec(max_new_tokens=4))  # warm-up

    load_before = os.getloadavg()
    sizes = (1, args.batch_size)
    sides = {bs: ("backend", "raw") + (("backend_unbucketed",) if bs > 1 else ()) for bs in sizes}
    runs: dict[str, list[dict]] = {f"{side}_batch_{bs}": [] for bs in sizes for side in sides[bs]}
    texts: dict[str, list[str]] = {}
    for _ in range(args.repeats):
        for bs in sizes:
            for side in sides[bs]:
                t0 = time.perf_counter()
                if side.startswith("backend"):
                    backend.batch_size, backend.bucket_prefill = bs, side == "backend"
                    out = backend.generate(prompts, spec)
                    backend.bucket_prefill = True
                    got, tokens = [c[0].text for c in out], sum(c[0].n_tokens for c in out)
                else:
                    got, tokens = raw_generate(backend, encoded, bs, args.max_new_tokens)
                    order = {tuple(x): i for i, x in enumerate(encoded)}  # back to prompt order
                    got = [got[order[tuple(backend.encode(p))]] for p in prompts]
                wall = time.perf_counter() - t0
                key = f"{side}_batch_{bs}"
                runs[key].append({"wall_seconds": round(wall, 3), "tokens": tokens, "tokens_per_second": round(tokens / wall, 2)})
                texts[key] = got
                print(f"{key:>28}: {tokens} tokens in {wall:.1f} s = {tokens / wall:.1f} tokens/s", flush=True)
    best = {k: max(r, key=lambda x: x["tokens_per_second"])["tokens_per_second"] for k, r in runs.items()}
    big = args.batch_size
    speedup = {side: best[f"{side}_batch_{big}"] / best[f"{side}_batch_1"] for side in ("backend", "raw")}
    speedup["backend_unbucketed"] = best[f"backend_unbucketed_batch_{big}"] / best["backend_batch_1"]  # batch 1: one row
    vs_raw = {f"batch_{bs}": best[f"backend_batch_{bs}"] / best[f"raw_batch_{bs}"] for bs in sizes}
    same = {k: sum(a == b for a, b in zip(texts["backend_batch_1"], v)) for k, v in texts.items()}
    # what bounds it: the backend's own Python in a batch-16 call, and the padded prompt pass
    backend.batch_size = big
    profile = profile_batch(backend, prompts, spec)
    prefill = {}
    for bs, bucketed in ((1, True), (big, True), (big, False)):
        backend.batch_size, backend.bucket_prefill = bs, bucketed
        t0 = time.perf_counter()
        backend.generate(prompts, SamplingSpec(max_new_tokens=1))
        prefill[f"batch_{bs}" + ("" if bucketed else "_unbucketed")] = round(time.perf_counter() - t0, 3)
    backend.bucket_prefill = True
    real = sum(len(x) for x in encoded)
    padded = sum(len(encoded[s]) * len(encoded[s:s + big]) for s in range(0, len(encoded), big))
    batches = [encoded[s:s + big] for s in range(0, len(encoded), big)]  # all but each row's last token, bucketed
    bucketed_tokens = sum(len(g) * max(len(b[i]) - 1 for i in g) for b in batches
                          for g in plan_buckets([len(x) - 1 for x in b])) + len(encoded)
    print(f"batch {big} over batch 1: backend {speedup['backend']:.2f}x, raw generate {speedup['raw']:.2f}x (goal >= 6x); "
          f"backend / raw: batch 1 {vs_raw['batch_1']:.2f}x, batch {big} {vs_raw[f'batch_{big}']:.2f}x; "
          f"identical texts vs backend batch 1: {same}")
    print(f"profile of a backend batch-{big} call: {profile}; prompt pass alone: {prefill}; "
          f"prompt tokens {real}, padded {padded}, bucketed {bucketed_tokens}")
    result = {
        "benchmark": "hf_batching",
        "command": "OMP_NUM_THREADS=%d python -m benchmarks.hf_batching %s" % (args.threads, " ".join(sys.argv[1:])),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(load_before),
        "model": backend.describe(),
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "runs": runs,
        "best_tokens_per_second": best,
        "speedup_batch_%d_over_1" % big: {k: round(v, 2) for k, v in speedup.items()},
        # the decoding steps alone: each best run's wall time less its prompt pass (measured below)
        "decode_only_speedup_batch_%d_over_1" % big: round(
            (runs["backend_batch_1"][0]["tokens"] / best["backend_batch_1"] - prefill["batch_1"])
            / (runs[f"backend_batch_{big}"][0]["tokens"] / best[f"backend_batch_{big}"] - prefill[f"batch_{big}"]), 2),
        "backend_over_raw_generate": {k: round(v, 3) for k, v in vs_raw.items()},
        "identical_texts_vs_backend_batch_1": {k: f"{v}/{len(prompts)}" for k, v in same.items()},
        "bound": {"profile_backend_batch_%d" % big: profile, "prompt_pass_seconds": prefill,
                  "prompt_tokens": real, "padded_prompt_tokens": padded, "bucketed_prompt_tokens": bucketed_tokens},
        "goal": ">= 6x tokens/s at batch 16 over batch 1",
        "goal_met": speedup["backend"] >= 6.0,
    }
    write_result(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
