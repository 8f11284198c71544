"""vLLM (in-process and served) vs the hf backend vs ``transformers serve``, on the same prompts and budget.

    OMP_NUM_THREADS=1 python -m benchmarks.vllm_vs_hf                    # writes benchmarks/results/vllm_vs_hf.json
    OMP_NUM_THREADS=1 python -m benchmarks.vllm_vs_hf --engines hf,vllm   # a subset

The embedded SmolLM2-135M-Instruct, greedy, on GSM8K CoT chat prompts (the test split's first
``--prompts``; every engine applies the same chat template). For each engine:

* ``ttft_s``: time to first token, the median latency of ``--ttft-repeats`` one-token generations
  of one prompt (prompt pass + first token; for a server, one HTTP request);
* ``batch1_tokens_per_s``: generated tokens / wall time, prompts one at a time (``--batch1-prompts``);
* ``batch16_tokens_per_s``: the same with all ``--prompts`` prompts handed over at once (a batch of 16
  for hf, 16 concurrent requests for a server, one ``generate`` call for in-process vLLM);
* ``load_s``: model load or server start-up until healthy.

Engines: ``hf`` (float32, the backend's CPU default), ``vllm`` (in-process, bfloat16 and float32),
``vllm-serve`` (bfloat16, through the openai backend), ``transformers-serve`` (float32). vLLM's
engine runs in a spawned process: this script's entry point is guarded for that.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("hf", "vllm-bf16", "vllm-fp32", "vllm-serve", "transformers-serve")


def prompts_for(n: int):
    from anchored_reasoning.eval.methods import build_method
    from anchored_reasoning.tasks import get_task

    task, method = get_task("gsm8k"), build_method("cot")
    return [method.prompt(e, task) for e in task.load("test", limit=n)]


def measure(backend, prompts, args) -> dict:
    from anchored_reasoning.types import SamplingSpec

    spec = SamplingSpec(max_new_tokens=args.max_new_tokens)
    backend.generate(prompts[:1], SamplingSpec(max_new_tokens=4))  # warm-up (first-call costs)
    ttft = []
    for _ in range(args.ttft_repeats):
        t0 = time.perf_counter()
        backend.generate(prompts[:1], SamplingSpec(max_new_tokens=1))
        ttft.append(time.perf_counter() - t0)
    t0, tokens1 = time.perf_counter(), 0
    texts = []
    for p in prompts[: args.batch1_prompts]:
        out = backend.generate([p], spec)
        tokens1 += out[0][0].n_tokens
        texts.append(out[0][0].text)
    wall1 = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = backend.generate(prompts, spec)
    wall16 = time.perf_counter() - t0
    tokens16 = sum(r[0].n_tokens for r in out)
    return {"ttft_s": round(statistics.median(ttft), 3), "batch1_tokens": tokens1, "batch1_s": round(wall1, 2),
            "batch1_tokens_per_s": round(tokens1 / wall1, 1), "batch16_tokens": tokens16, "batch16_s": round(wall16, 2),
            "batch16_tokens_per_s": round(tokens16 / wall16, 1), "texts": [r[0].text for r in out]}


def run_engine(name: str, model: str, prompts, args) -> dict:
    from anchored_reasoning.backends.openai_compat import OpenAIBackend
    from anchored_reasoning.serving import serve_model

    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    if name == "hf":
        from anchored_reasoning.backends.hf import HFBackend

        backend = HFBackend(model, dtype="float32", batch_size=len(prompts))
        return {"dtype": "float32", "load_s": round(time.perf_counter() - t0, 1), **measure(backend, prompts, args)}
    if name.startswith("vllm-") and name != "vllm-serve":
        from anchored_reasoning.backends.vllm_backend import VLLMBackend

        dtype = {"vllm-bf16": "bfloat16", "vllm-fp32": "float32"}[name]
        backend = VLLMBackend(model, dtype=dtype, max_model_len=1024, kv_cache_memory_bytes=256 << 20)
        result = {"dtype": dtype, "load_s": round(time.perf_counter() - t0, 1), **measure(backend, prompts, args)}
        backend.close()
        return result
    engine, opts = ("vllm", {"dtype": "bfloat16", "max_model_len": 1024,
                             "extra_args": ["--kv-cache-memory-bytes", str(256 << 20)]}) if name == "vllm-serve" else \
        ("transformers", {"device": "cpu", "dtype": "float32"})
    with serve_model(model, engine=engine, env=env, startup_timeout=600, **opts) as srv:
        load_s = time.perf_counter() - t0
        backend = OpenAIBackend(model, base_url=srv.base_url, concurrency=len(prompts), timeout=600)
        return {"dtype": opts["dtype"], "load_s": round(load_s, 1), **measure(backend, prompts, args)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated subset of {','.join(ENGINES)}")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--batch1-prompts", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--ttft-repeats", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "vllm_vs_hf.json"))
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engines = [e for e in args.engines.split(",") if e]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        p.error(f"unknown engine(s) {unknown}; choose from {', '.join(ENGINES)}")
    from anchored_reasoning.models.zoo import resolve_model

    model = str(resolve_model("smollm2-135m"))
    load_start = os.getloadavg()[0]
    prompts = prompts_for(args.prompts)
    results = {}
    for name in engines:
        logging.info("measuring %s", name)
        try:
            results[name] = run_engine(name, model, prompts, args)
        except Exception as exc:  # record and go on: one engine failing must not lose the others
            logging.exception("%s failed", name)
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        logging.info("%s: %s", name, {k: v for k, v in results[name].items() if k != "texts"})
    ref = results.get("hf", {}).get("texts")
    for name, r in results.items():
        if ref and "texts" in r:
            r["same_text_as_hf"] = sum(a == b for a, b in zip(r["texts"], ref))
        r.pop("texts", None)
    out = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end",
        "threads": int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or None,
        "command": "OMP_NUM_THREADS={} python -m benchmarks.vllm_vs_hf {}".format(os.environ.get("OMP_NUM_THREADS", ""), " ".join(sys.argv[1:])).strip(),
        "model": "SmolLM2-135M-Instruct (embedded smollm2-135m)",
        "prompts": f"{len(prompts)} GSM8K test CoT chat prompts, greedy, {args.max_new_tokens} new tokens",
        "engines": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":  # vLLM starts its engine in a spawned process: this guard is required
    sys.exit(main())
