"""Batched diffusion sampling: tokens/s at batch 1, 8 and 32 with left-padded prompts of mixed length, and the
share of rows whose tokens equal the one-at-a-time run.

    OMP_NUM_THREADS=1 python -m benchmarks.diffusion_batching

Model: the shipped ``logic-mdlm`` (0.92M parameters, logic text). Prompts: ``--n`` generated ProsQA questions of
mixed size (4 to 9 nodes, so prompt lengths differ), each followed by its ``[BoR]`` answer cue; the rows are
cut into batches in prompt order (no length sorting, so every batch holds mixed lengths) and left-padded.
Samplers (greedy, ``--gen-length`` tokens in blocks of ``--block-length``): ``low_confidence`` (one token per
step), ``threshold`` (every position above 0.9, at least one per step), ``low_confidence`` with Fast-dLLM's
``prefix`` and ``dual`` KV caches, and ``threshold+untrimmed``: threshold decoding with every call over the full
padded width (the sampler's calls on the rows still running leave out the left-padding columns none of them
uses). Every (sampler, batch size) is timed in turn per repeat (interleaved, one process); the best repeat counts.
``tokens_per_second`` counts the window positions the model decoded (EOS fill excluded), ``model_calls`` the model
calls, ``model_rows`` the rows they ran (a row whose block is done is skipped), ``tokens_per_forward`` decoded
tokens over ``model_rows`` (per row, the dllm leaderboard's TPF), and ``positions_computed`` rows x padded
sequence length summed over calls (the KV-cached calls and the calls that leave out all-padding columns compute
fewer; counted as full), so the time per position shows what batching saves: the per-call overhead, not the
arithmetic, which on a CPU grows with rows x positions.
Writes benchmarks/results/diffusion_batching.json.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import time

import torch

from benchmarks.common import write_result

SAMPLERS = {
    "low_confidence": {"remasking": "low_confidence"},
    "threshold": {"remasking": "threshold", "threshold": 0.9},
    "low_confidence+prefix_cache": {"remasking": "low_confidence", "kv_cache": "prefix"},
    "low_confidence+dual_cache": {"remasking": "low_confidence", "kv_cache": "dual"},
    # the sampler's calls on the rows still running computed over the batch's full padded width, as before they
    # left out the leading all-padding columns: the same tokens, the cost of that padding
    "threshold+untrimmed": {"remasking": "threshold", "threshold": 0.9},
}
UNTRIMMED = {"threshold+untrimmed"}


def prompts(tok, n: int) -> list[list[int]]:
    from anchored_reasoning.train.data.data_sources import generate_examples

    out = []
    for i in range(n):  # sizes cycle so neighbouring rows (one batch) differ in length
        nodes = 4 + i % 6
        [ex] = generate_examples("prosqa", 1, 7_000 + i, {"num_nodes": nodes, "min_hops": 1, "max_hops": 2}, split="bench")
        out.append(list(tok(ex.question + "\n[BoR]")["input_ids"]))
    return out


def run(model, rows: list[list[int]], batch: int, cfg, pad_id: int, trim: bool = True) -> tuple[list[list[int]], dict]:
    """Sample every row in batches of ``batch``: the generated ids per row and the totals. ``trim=False``: every
    model call runs the batch's full padded width (``make_model_fn(trim_padding=False)``)."""
    from anchored_reasoning.backends import left_pad
    from anchored_reasoning.sampling import make_model_fn, sample

    out, decoded, calls, model_rows, positions = [], 0, 0, 0, 0
    t0 = time.perf_counter()
    for s in range(0, len(rows), batch):
        ids, mask = left_pad(rows[s:s + batch], pad_id)
        padded = not bool(mask.all())
        fn = None if trim or not padded else make_model_fn(
            model, torch.cat([mask, torch.ones(mask.shape[0], cfg.gen_length, dtype=mask.dtype)], 1), trim_padding=False)
        x, stats = sample(model, ids, cfg, attention_mask=mask if padded else None, model_fn=fn)
        out.extend(x[:, ids.shape[1]:].tolist())
        decoded += sum(cfg.gen_length - f for f in stats.filled_after_eos)
        calls += stats.nfe
        model_rows += stats.model_rows
        positions += stats.model_rows * x.shape[1]
    wall = time.perf_counter() - t0
    return out, {"wall_seconds": round(wall, 3), "decoded_tokens": decoded, "tokens_per_second": round(decoded / wall, 1),
                 "model_calls": calls, "tokens_per_forward": round(decoded / model_rows, 3),
                 "model_rows": model_rows, "positions_computed": positions,
                 "seconds_per_1k_positions": round(1000 * wall / positions, 4) if positions else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="logic-mdlm")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--gen-length", type=int, default=32)
    ap.add_argument("--block-length", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--samplers", nargs="+", default=list(SAMPLERS), choices=list(SAMPLERS))
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    ap.add_argument("--out", default="benchmarks/results/diffusion_batching.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    from anchored_reasoning.models.zoo import resolve_model
    from anchored_reasoning.sampling import SamplerConfig, load_masked_diffusion_model

    path = resolve_model(args.model)
    model = load_masked_diffusion_model(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    rows = prompts(tok, args.n)
    configs = {name: SamplerConfig(steps=args.gen_length, gen_length=args.gen_length, block_length=args.block_length,
                                   temperature=0.0, eos_token_id=tok.eos_token_id, **opts)
               for name, opts in SAMPLERS.items() if name in args.samplers}
    run(model, rows[:2], 2, next(iter(configs.values())), pad)  # warm-up
    load_before = os.getloadavg()
    best: dict[str, dict[int, dict]] = {name: {} for name in configs}
    texts: dict[str, dict[int, list[list[int]]]] = {name: {} for name in configs}
    for _ in range(args.repeats):
        for name, cfg in configs.items():
            for bs in args.batch_sizes:
                got, res = run(model, rows, bs, cfg, pad, trim=name not in UNTRIMMED)
                texts[name][bs] = got
                if bs not in best[name] or res["tokens_per_second"] > best[name][bs]["tokens_per_second"]:
                    best[name][bs] = res
                print(f"{name:>28} batch {bs:>2}: {res['tokens_per_second']:8.1f} tokens/s "
                      f"(TPF {res['tokens_per_forward']}, {res['model_calls']} calls, {res['model_rows']} rows, "
                      f"{res['positions_computed']} positions)", flush=True)
    results = {}
    one = min(args.batch_sizes)
    for name in configs:
        entry = {}
        for bs, res in best[name].items():
            same = sum(a == b for a, b in zip(texts[name][one], texts[name][bs]))
            entry[f"batch_{bs}"] = {**res, "speedup_over_batch_%d" % one: round(res["tokens_per_second"] / best[name][one]["tokens_per_second"], 2),
                                    "rows_identical_to_batch_%d" % one: f"{same}/{len(rows)}"}
        results[name] = entry
        print(name, {k: (v["speedup_over_batch_%d" % one], v["rows_identical_to_batch_%d" % one]) for k, v in entry.items()})
    trim = {}  # leaving out the all-padding columns: the same tokens, and the speed-up over the full width
    if {"threshold", "threshold+untrimmed"} <= set(configs):
        for bs in args.batch_sizes:
            a, b = texts["threshold"][bs], texts["threshold+untrimmed"][bs]
            trim[f"batch_{bs}"] = {"rows_identical": f"{sum(x == y for x, y in zip(a, b))}/{len(rows)}", "speedup": round(
                best["threshold"][bs]["tokens_per_second"] / best["threshold+untrimmed"][bs]["tokens_per_second"], 3)}
        print("threshold, trimmed over untrimmed:", trim)
    lengths = [len(r) for r in rows]
    write_result(args.out, {
        "benchmark": "diffusion_batching",
        "command": f"OMP_NUM_THREADS={args.threads} python -m benchmarks.diffusion_batching " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__,
                    "shared": "the machine is shared with other busy processes: 1-minute load averages before/after",
                    "loadavg_1min_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)]},
        "model": args.model, "prompts": len(rows), "prompt_tokens_min_max": [min(lengths), max(lengths)],
        "gen_length": args.gen_length, "block_length": args.block_length, "steps": args.gen_length,
        "samplers": {name: SAMPLERS[name] for name in configs}, "results": results,
        **({"threshold_trimmed_over_untrimmed": trim} if trim else {}),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
