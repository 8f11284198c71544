"""Throughput of the openai backend against `transformers serve` vs the local hf backend, same model
and prompts, and the openai backend's overhead per request against raw HTTP calls.

    python -m benchmarks.openai_vs_hf --model smollm2-135m --prompts 16 --max-new-tokens 32 \
        --out benchmarks/results/openai_vs_hf.json

What it does, in one process, side by side (the machine is shared and noisy, so ratios measured
together mean more than absolute numbers):

1. renders the first N GSM8K test questions with the ``cot`` method (chat messages; both
   backends apply the model's chat template), greedy, ``--max-new-tokens`` each;
2. local hf backend: batched (``--batch-size``) and one prompt at a time;
3. starts ``transformers serve`` on loopback (same thread count) and runs the same prompts through
   the openai backend at each ``--concurrency``; checks the completions equal the hf ones;
4. overhead: the same /v1/completions requests (1 new token) sent by plain ``httpx`` calls and by
   the openai backend (concurrency 1), alternating request by request; the difference of the medians is
   what the backend adds per request (request building, pool, retries bookkeeping, parsing).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path


def machine_info() -> dict:
    import transformers

    from anchored_reasoning.machine import machine_info as base

    return base(transformers=transformers.__version__)


def load_prompts(n: int, data_dir: str | None):
    from anchored_reasoning.methods import get_method
    from anchored_reasoning.tasks import get_task
    from anchored_reasoning.types import Example

    task = get_task("gsm8k")
    try:
        examples = task.load("test", data_dir=data_dir, limit=n)
    except Exception as exc:  # no local data and no network: synthetic questions
        print(f"GSM8K not available ({exc}); using synthetic questions", file=sys.stderr)
        examples = [Example(id=str(i), question=f"Tom has {i} apples and buys {i + 3} more. How many apples does he have?",
                            answer=str(2 * i + 3)) for i in range(n)]
    method = get_method("cot")
    return [method.prompt(e, task) for e in examples]


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def throughput(outs, seconds: float) -> dict:
    tokens = sum(c.n_tokens for row in outs for c in row)
    return {"seconds": round(seconds, 3), "tokens": tokens, "tokens_per_second": round(tokens / seconds, 2),
            "prompts_per_second": round(len(outs) / seconds, 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--concurrency", default="1,4", help="comma-separated openai backend concurrencies")
    p.add_argument("--threads", type=int, default=2, help="torch threads for the hf backend and the server")
    p.add_argument("--overhead-requests", type=int, default=10, help="requests per round and side")
    p.add_argument("--overhead-rounds", type=int, default=3, help="rounds (total per side: rounds x requests)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default="benchmarks/results/openai_vs_hf.json")
    args = p.parse_args(argv)

    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import httpx
    import torch

    torch.set_num_threads(args.threads)
    from anchored_reasoning.backends.hf import HFBackend
    from anchored_reasoning.backends.openai_compat import OpenAIBackend
    from anchored_reasoning.serving import resolve_model_path, serve_model
    from anchored_reasoning.types import Prompt, SamplingSpec

    info = machine_info()
    path = resolve_model_path(args.model)
    prompts = load_prompts(args.prompts, args.data_dir)
    spec = SamplingSpec(max_new_tokens=args.max_new_tokens)
    result: dict = {
        "benchmark": "openai_vs_hf",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m benchmarks.openai_vs_hf " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": info,
        "settings": {"model": args.model, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                     "greedy": True, "batch_size": args.batch_size, "threads": args.threads,
                     "prompt_style": "gsm8k cot, chat template"},
    }

    hf = HFBackend(path, device="cpu", dtype="float32", batch_size=args.batch_size)
    hf.generate(prompts[:1], SamplingSpec(max_new_tokens=4))  # warm-up
    hf_out, secs = timed(lambda: hf.generate(prompts, spec))
    result["hf_batched"] = throughput(hf_out, secs)
    hf.batch_size = 1
    hf_seq, secs = timed(lambda: hf.generate(prompts, spec))
    result["hf_batch1"] = throughput(hf_seq, secs)
    print("hf batched", result["hf_batched"], "\nhf batch 1", result["hf_batch1"], flush=True)
    hf = None  # the weights go before the server loads its own copy

    env = {"OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    with serve_model(path, engine="transformers", device="cpu", dtype="float32", env=env, startup_timeout=600) as srv:
        result["openai"] = []
        for c in [int(x) for x in args.concurrency.split(",") if x]:
            backend = OpenAIBackend(path, base_url=srv.base_url, concurrency=c)
            backend.generate(prompts[:1], SamplingSpec(max_new_tokens=4))  # warm-up (model load, detection)
            out, secs = timed(lambda: backend.generate(prompts, spec))
            row = {"concurrency": c, **throughput(out, secs),
                   "identical_to_hf": sum(a[0].text == b[0].text for a, b in zip(out, hf_out)), "of": len(out)}
            result["openai"].append(row)
            print("openai", row, flush=True)
            backend.close()

        # Overhead per request: raw httpx vs the backend, same body, 1 new token, sequential.
        texts = [pr.text for pr in prompts]
        body = lambda t: {"model": path, "prompt": t, "max_tokens": 1, "seed": 0,  # noqa: E731
                          "generation_config": json.dumps({"max_new_tokens": 1, "do_sample": False})}
        raw_ms, harness_ms = [], []
        backend = OpenAIBackend(path, base_url=srv.base_url, concurrency=1, mode="completions")
        backend.generate([Prompt(texts[0])], SamplingSpec(max_new_tokens=1))
        with httpx.Client(timeout=60, trust_env=False) as client:
            client.post(srv.base_url + "/completions", json=body(texts[0])).raise_for_status()
            for r in range(args.overhead_rounds * args.overhead_requests):
                t = texts[r % len(texts)]
                # alternate which goes first, so drifts in machine load hit both sides alike
                for side in ((0, 1) if r % 2 == 0 else (1, 0)):
                    t0 = time.perf_counter()
                    if side == 0:
                        client.post(srv.base_url + "/completions", json=body(t)).raise_for_status()
                        raw_ms.append(1000 * (time.perf_counter() - t0))
                    else:
                        backend.generate([Prompt(t)], SamplingSpec(max_new_tokens=1))
                        harness_ms.append(1000 * (time.perf_counter() - t0))
        backend.close()
    raw_med, harness_med = statistics.median(raw_ms), statistics.median(harness_ms)
    result["overhead"] = {
        "requests_each": len(raw_ms),
        "raw_http_ms_median": round(raw_med, 2),
        "openai_backend_ms_median": round(harness_med, 2),
        "overhead_ms_per_request": round(harness_med - raw_med, 2),
        "overhead_share": round((harness_med - raw_med) / raw_med, 4),
    }
    best = max(result["openai"], key=lambda r: r["tokens_per_second"])
    result["ratios"] = {
        "hf_batched_over_best_openai": round(result["hf_batched"]["tokens_per_second"] / best["tokens_per_second"], 2),
        "hf_batch1_over_openai_concurrency1": round(
            result["hf_batch1"]["tokens_per_second"] / result["openai"][0]["tokens_per_second"], 2),
    }
    result["machine"]["loadavg_end"] = list(os.getloadavg())
    print("overhead", result["overhead"], "\nratios", result["ratios"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
