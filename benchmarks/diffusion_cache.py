"""Fast-dLLM's approximate KV cache for block sampling: tokens/s and agreement with uncached outputs.

    OMP_NUM_THREADS=1 python -m benchmarks.diffusion_cache --workdir runs/tadm_bench \\
        --out benchmarks/results/diffusion_cache.json

Models: the logic-text ADLM and T-ANELBO TADM of ``benchmarks.tadm_stale_contrast``
(reused from ``WORKDIR`` when that ran, trained here the same way otherwise): width 128, 4 blocks,
trained on small generated ProsQA documents (facts -> 1-2 hop derivation), logic-gpt2 tokenizer.

Prompts: the facts of ``--n`` held-out documents (a seed neither model trained on), one left-padded
batch. Sampling: greedy low-confidence, ``--gen-length`` tokens in blocks of ``--block-length``,
one token per step. For each model, anchor refresh K (``--ks``; TADM only for K > 1) and cache mode
(``none``, ``prefix``, ``dual``; see ``anchored_reasoning/sampling/kv_cache.py``):

* ``tokens_per_s``: generated tokens per second (median of ``--repeats`` runs, every configuration
  timed in turn), and ``speedup`` against the same model and K without the cache;
* ``agreement_with_uncached``: share of generated tokens equal to the uncached output (same model, K);
* ``query_positions_ratio``: transformer-layer positions computed, relative to the same calls
  without the KV cache (same K, so the anchor cache's saving is in both);
* ``gen_ppl_judge``: generative perplexity of the samples under logic-gpt2 given the facts (quality).
"""
from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
import types

import torch

from anchored_reasoning.machine import machine_info
from benchmarks.common import judge_ppl, logic_rows, trained_stale_model, window_batch, write_result

logger = logging.getLogger("diffusion_cache")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", default="runs/tadm_bench")
    p.add_argument("--out", default="benchmarks/results/diffusion_cache.json")
    p.add_argument("--n", type=int, default=64, help="held-out prompts (one batch)")
    p.add_argument("--gen-length", type=int, default=20, help="the models' trained window")
    p.add_argument("--block-length", type=int, default=4)
    p.add_argument("--ks", type=int, nargs="+", default=[1, 3])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--train-steps", type=int, default=400, help="as tadm_stale_contrast --stale-steps (finds its checkpoints)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anchored_reasoning.models.zoo import resolve_model
    from anchored_reasoning.sampling import SamplerConfig, sample
    from anchored_reasoning.sampling.kv_cache import KVCacheModelFn

    command = "python -m benchmarks.diffusion_cache " + " ".join(argv if argv is not None else sys.argv[1:])
    window = args.gen_length
    tok = AutoTokenizer.from_pretrained(resolve_model("logic-gpt2"))
    judge = AutoModelForCausalLM.from_pretrained(resolve_model("logic-gpt2")).eval()
    train_args = types.SimpleNamespace(stale_steps=args.train_steps, stale_batch=32, stale_lr=1.5e-3, hidden=args.hidden,
                                       workdir=args.workdir)
    train_rows = logic_rows(tok, 20000, 0, window)
    contrast_held = logic_rows(tok, 64, 10_000, window)  # only for the same max length as the contrast run
    max_len = max(len(f) for f, _ in train_rows + contrast_held) + window
    held = logic_rows(tok, args.n, 20_000, window)
    ids, am, _ = window_batch(held, tok.pad_token_id)
    width = ids.shape[1] - window
    prompts, prompt_am = ids[:, :width], am[:, :width]
    models = {kind: trained_stale_model(kind, tok, train_rows, train_args, window, max_len + 8)[0] for kind in ("adlm", "tadm")}
    base = SamplerConfig(remasking="low_confidence", steps=window, gen_length=window, block_length=args.block_length,
                         temperature=0.0)
    runs = {}
    for kind, model in models.items():
        for k in args.ks:
            if k > 1 and kind != "tadm":
                continue
            for mode in ("none", "prefix", "dual"):
                runs[(kind, k, mode)] = base.replace(anchor_refresh_every=k, kv_cache=mode)
    times: dict = {key: [] for key in runs}
    outputs: dict = {}
    with torch.no_grad():
        for key, cfg in runs.items():  # warm-up, and the outputs
            outputs[key] = sample(models[key[0]], prompts, cfg, attention_mask=prompt_am)[0][:, width:]
        for _ in range(args.repeats):
            for key, cfg in runs.items():
                times[key].append(sample(models[key[0]], prompts, cfg, attention_mask=prompt_am)[1].seconds)
        rows = {}
        for (kind, k, mode), cfg in runs.items():
            model = models[kind]
            full = torch.cat([prompt_am, torch.ones(prompt_am.shape[0], window, dtype=prompt_am.dtype)], 1)
            ratio = None
            if mode != "none":  # count the positions the cached calls compute against full passes
                counter = KVCacheModelFn(model, mode, k, full)
                sample(model, prompts, cfg.replace(kv_cache="none", anchor_refresh_every=1), attention_mask=prompt_am,
                       model_fn=counter)
                per_call = {"shared": 1, "encoder": 1, "denoiser": 1, "anchor": counter.anchor_calls / counter.calls}
                n_layers = sum(len(getattr(model, s).layers) * w for s, w in per_call.items() if hasattr(model, s))
                ratio = counter.query_positions / (n_layers * ids.shape[1] * counter.calls)
            med = sorted(times[(kind, k, mode)])[len(times[(kind, k, mode)]) // 2]
            ref = outputs[(kind, k, "none")]
            rows[f"{kind}:K{k}:{mode}"] = {
                "model": kind, "K": k, "kv_cache": mode, "seconds_median": med,
                "tokens_per_s": prompts.shape[0] * window / med,
                "agreement_with_uncached": float((outputs[(kind, k, mode)] == ref).float().mean()),
                "query_positions_ratio": ratio,
                "gen_ppl_judge": judge_ppl(judge, prompts, prompt_am, outputs[(kind, k, mode)], tok.eos_token_id),
            }
        for key, row in rows.items():
            ref = rows[f"{row['model']}:K{row['K']}:none"]
            row["speedup"] = row["tokens_per_s"] / ref["tokens_per_s"]
            logger.info("%s: %.0f tok/s (x%.2f), agreement %.3f, gen ppl %.3f", key, row["tokens_per_s"], row["speedup"],
                        row["agreement_with_uncached"], row["gen_ppl_judge"])
    result = {
        "benchmark": "diffusion_cache",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(note="configurations timed in turn"),
        "command": command,
        "setup": {"models": f"logic-text ADLM / T-ANELBO TADM of tadm_stale_contrast ({args.workdir})",
                  "prompts": f"facts of {args.n} held-out small ProsQA documents (seed 20000), one left-padded batch",
                  "sampler": f"low_confidence greedy, {window} tokens in blocks of {args.block_length}, one token per step",
                  "timing": f"median of {args.repeats} runs per configuration, configurations interleaved",
                  "judge": "logic-gpt2 generative perplexity given the facts"},
        "results": rows,
    }
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
