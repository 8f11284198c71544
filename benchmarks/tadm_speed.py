"""TADM speed/quality benchmark: ADLM (K = 1) against TADM with the anchor refreshed every K steps.

    ANCHORED_REASONING_DATA=/work/shared/data OMP_NUM_THREADS=1 \\
        python benchmarks/tadm_speed.py --workdir runs/tadm_bench --out benchmarks/results/tadm_speed.json

In one process on one machine it

1. trains (or reuses, if ``WORKDIR/adlm`` exists) a small ADLM on WikiText-2 (valid split) with
   the ``diffusion`` trainer (recipe ``diffusion_pretrain_tiny_adlm`` with the sizes below: a
   ``--anchor-layers``-block anchor network and a ``--denoiser-layers``-block denoiser);
2. post-trains (or reuses ``WORKDIR/tadm``) a TADM from it with the ``tadm`` trainer (recipe
   ``tadm_posttrain_tiny``: backbone frozen, only the fusion module trained, CE + KL to the ADLM,
   rollouts k in {0, 1, 2});
3. measures, for ADLM at K = 1 and TADM at each ``--ks``:

   * ``tokens_per_s``: generated tokens per second of the LLaDA low-confidence sampler (greedy,
     ``--steps`` steps for ``--gen-length`` tokens, so one model call per step; a batch of
     ``--batch`` continuations of the first ``--prompt-len`` tokens of held-out blocks; the median of
     ``--repeats`` timed runs after one warm-up, every configuration timed in turn so load changes on
     a shared machine hit all alike) and ``speedup_vs_k1`` against ADLM's;
   * ``layer_calls``: transformer-layer calls per generation counted with forward hooks, next to
     ``layer_calls_formula`` = T (L_S + L_D) + ceil(T/K) L_A;
   * ``ppl``: the NELBO perplexity bound on held-out WikiText-2 (test split, first ``--ppl-blocks``
     blocks) with the anchor as stale as the K-step cache makes it
     (:func:`anchored_reasoning.objectives_tadm.stale_perplexity_bound`; K = 1 is the usual bound);
     ``ppl_rel_change`` is relative to ADLM's;
   * ``agreement_with_k1``: the share of generated tokens equal to ADLM's greedy output (a cheap
     generation-quality proxy: 1.0 = identical text);
   * ``accuracy``: null, with the reason (no reasoning-tuned diffusion model fits this CPU budget).

   It also reports ``adlm_stale``: the *untrained* ADLM reusing stale anchors at each K (what the
   fusion module is there to repair), with its ppl and agreement; and, with ``--pretrain-steps N``,
   ``tadm_pretrained``: a TADM of the same total depth trained from scratch with T-ANELBO for N steps
   (S 1 block, A ``--anchor-layers`` - 1, D ``--denoiser-layers``), against the same ADLM.

Writes the JSON (``--out``) with per-K rows, the model sizes, the machine and the date.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch

logger = logging.getLogger("tadm_speed")
ACCURACY_REASON = ("not measured: a ProsQA-capable diffusion model needs SFT far beyond this run's CPU budget "
                   "(2 shared cores, ~25 min for training and measuring); the ppl bound and the agreement with K=1 "
                   "greedy output are the quality measures here")


def train_models(args) -> tuple[Path, Path]:
    from anchored_reasoning.train import diffusion as dtrain
    from anchored_reasoning.train import tadm as ttrain

    work = Path(args.workdir)
    adlm_dir, tadm_dir = work / "adlm", work / "tadm"
    if not (adlm_dir / "config.json").is_file():
        sizes = (f"{{hidden_size: {args.hidden}, num_attention_heads: 4, intermediate_size: {4 * args.hidden}, "
                 f"num_hidden_layers: {args.anchor_layers}, denoiser_layers: {args.denoiser_layers}, "
                 f"max_position_embeddings: {args.seq_len}}}")
        dtrain.run("diffusion_pretrain_tiny_adlm", [
            f"output_dir={adlm_dir}", f"model.config={sizes}", f"data.seq_len={args.seq_len}", "data.valid_text_file=null",
            f"training.max_steps={args.base_steps}", f"training.learning_rate={args.lr}"])
    if not (tadm_dir / "config.json").is_file():
        ttrain.run("tadm_posttrain_tiny", [
            f"output_dir={tadm_dir}", f"model.base={adlm_dir}", f"model.shared_layers={args.shared_layers}",
            f"data.seq_len={args.seq_len}", "data.valid_text_file=null", f"training.max_steps={args.post_steps}",
            f"training.stale_sampling_steps={args.steps}", f"training.learning_rate={args.lr}"])
    return adlm_dir, tadm_dir


def pretrain_tadm(args) -> Path:
    """A TADM trained from scratch with T-ANELBO, as deep in total as the ADLM (``--pretrain-steps``)."""
    from anchored_reasoning.train import tadm as ttrain

    out = Path(args.workdir) / "tadm_pretrained"
    if not (out / "config.json").is_file():
        shared = 1
        sizes = (f"{{hidden_size: {args.hidden}, num_attention_heads: 4, intermediate_size: {4 * args.hidden}, "
                 f"shared_layers: {shared}, num_hidden_layers: {args.anchor_layers - shared}, "
                 f"denoiser_layers: {args.denoiser_layers}, max_position_embeddings: {args.seq_len}}}")
        ttrain.run("tadm_pretrain_tiny", [
            f"output_dir={out}", f"model.config={sizes}", f"data.seq_len={args.seq_len}", "data.valid_text_file=null",
            f"training.max_steps={args.pretrain_steps}", f"training.learning_rate={args.lr}",
            f"training.stale_sampling_steps={args.steps}"])
    return out


class Counter:
    def __init__(self, blocks: dict[str, list[torch.nn.Module]]):
        self.calls = {k: 0 for k in blocks}
        self.handles = [b.register_forward_hook(lambda *_, k=k: self.calls.__setitem__(k, self.calls[k] + 1))
                        for k, bs in blocks.items() for b in bs]

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def adlm_blocks(model) -> dict[str, list[torch.nn.Module]]:
    return {"anchor": list(model.anchor.layers), "denoiser": list(model.denoiser.layers)}


def agreement(ids: torch.Tensor, ref: torch.Tensor, prompt_len: int) -> float:
    """Share of generated tokens (after the prompt) equal to the reference's."""
    return float((ids[:, prompt_len:] == ref[:, prompt_len:]).float().mean())


def generate(model, prompt, cfg, k: int):
    from anchored_reasoning.sampling import AnchorCacheModelFn, sample

    return sample(model, prompt, cfg, model_fn=AnchorCacheModelFn(model, k) if k > 1 else None)


def count_layers(model, prompt, cfg, k: int):
    blocks = model.stage_blocks() if hasattr(model, "stage_blocks") else adlm_blocks(model)
    counter = Counter(blocks)
    try:
        ids, stats = generate(model, prompt, cfg, k)
    finally:
        counter.close()
    return ids, counter.calls, stats.nfe


def round_robin_seconds(runs: dict[str, tuple], prompt, cfg, repeats: int) -> dict[str, float]:
    """Median wall seconds of ``repeats`` generations per (model, K), taken in turns so that load
    changes on a shared machine hit every configuration alike (one warm-up each first)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for name, (model, k) in runs.items():
        generate(model, prompt, cfg, k)
    for _ in range(repeats):
        for name, (model, k) in runs.items():
            times[name].append(generate(model, prompt, cfg, k)[1].seconds)
    return {name: sorted(v)[len(v) // 2] for name, v in times.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", default="runs/tadm_bench")
    p.add_argument("--out", default="benchmarks/results/tadm_speed.json")
    p.add_argument("--ks", type=int, nargs="+", default=[2, 3, 4, 8])
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--gen-length", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--ppl-blocks", type=int, default=100)
    p.add_argument("--ppl-t-samples", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--anchor-layers", type=int, default=4)
    p.add_argument("--denoiser-layers", type=int, default=1)
    p.add_argument("--shared-layers", type=int, default=0)
    p.add_argument("--base-steps", type=int, default=300)
    p.add_argument("--post-steps", type=int, default=150)
    p.add_argument("--pretrain-steps", type=int, default=0,
                   help="also train a TADM from scratch with T-ANELBO for this many steps and measure it (0: skip)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    import anchored_reasoning.models  # noqa: F401  (Auto registration)
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from anchored_reasoning.objectives_tadm import stale_perplexity_bound
    from anchored_reasoning.sampling import SamplerConfig
    from anchored_reasoning.train.diffusion import data_path
    from anchored_reasoning.train.tadm import text_blocks

    t_start = time.monotonic()
    adlm_dir, tadm_dir = train_models(args)
    pre_dir = pretrain_tadm(args) if args.pretrain_steps > 0 else None
    train_seconds = time.monotonic() - t_start
    tok = AutoTokenizer.from_pretrained(adlm_dir)
    adlm = AutoModelForMaskedLM.from_pretrained(adlm_dir).eval()
    tadm = AutoModelForMaskedLM.from_pretrained(tadm_dir).eval()
    held_out = text_blocks(tok, data_path("corpora/wikitext2_test.txt"), args.seq_len, args.ppl_blocks)
    if args.prompt_len + args.gen_length > args.seq_len or held_out.shape[0] < args.batch:
        raise SystemExit("--prompt-len + --gen-length must fit in --seq-len, and --ppl-blocks must be >= --batch")
    prompt = held_out[:args.batch, :args.prompt_len].clone()  # held-out text prefixes
    cfg = SamplerConfig(remasking="low_confidence", steps=args.steps, gen_length=args.gen_length, temperature=0.0)
    c = tadm.config

    def ppl(model, k):
        return stale_perplexity_bound(model, held_out, refresh_every=k, sampling_steps=args.steps,
                                      num_t_samples=args.ppl_t_samples, seed=0).perplexity

    with torch.no_grad():
        pre = AutoModelForMaskedLM.from_pretrained(pre_dir).eval() if pre_dir is not None else None
        runs = {"adlm:1": (adlm, 1)}
        for k in [1, *args.ks]:
            runs[f"tadm:{k}"] = (tadm, k)
            if k > 1:
                runs[f"adlm:{k}"] = (adlm, k)
            if pre is not None:
                runs[f"pre:{k}"] = (pre, k)
        seconds = round_robin_seconds(runs, prompt, cfg, args.repeats)
        n_tokens = args.batch * args.gen_length
        ref_tps = n_tokens / seconds["adlm:1"]
        ref_ids, ref_calls, nfe = count_layers(adlm, prompt, cfg, 1)
        ref_ppl = ppl(adlm, 1)
        a_l, a_d = adlm.config.num_hidden_layers, adlm.config.num_denoiser_layers
        plen = prompt.shape[1]

        def row(name, model, k, label):
            ids, calls, nfe_k = count_layers(model, prompt, cfg, k)
            p_k = ref_ppl if name == "adlm:1" else ppl(model, k)
            tps = n_tokens / seconds[name]
            formula = model.config.layer_calls(nfe_k, k) if hasattr(model, "stage_blocks") else \
                nfe_k * a_d + -(-nfe_k // k) * a_l
            out = {"model": label, "K": k, "tokens_per_s": tps, "speedup_vs_k1": tps / ref_tps, "ppl": p_k,
                   "ppl_rel_change": p_k / ref_ppl - 1, "agreement_with_k1": agreement(ids, ref_ids, plen),
                   "accuracy": None, "accuracy_reason": ACCURACY_REASON, "layer_calls": sum(calls.values()),
                   "layer_calls_by_stage": calls, "layer_calls_formula": formula, "nfe": nfe_k}
            logger.info("%s K=%d: %.0f tok/s (x%.2f), ppl %.2f (ADLM %.2f), agreement %.3f", label, k, tps,
                        tps / ref_tps, p_k, ref_ppl, out["agreement_with_k1"])
            return out

        adlm_row = row("adlm:1", adlm, 1, "ADLM")
        tadm_rows = {str(k): row(f"tadm:{k}", tadm, k, "TADM (post-trained fusion)") for k in [1, *args.ks]}
        stale_rows = {str(k): row(f"adlm:{k}", adlm, k, "ADLM (stale anchor, no fusion)") for k in args.ks}
        pre_rows = {str(k): {**row(f"pre:{k}", pre, k, "TADM (T-ANELBO pretraining)"), "train_steps": args.pretrain_steps}
                    for k in [1, *args.ks]} if pre is not None else {}
    post = json.loads((tadm_dir / "train_summary.json").read_text()) if (tadm_dir / "train_summary.json").is_file() else {}
    result = {
        "benchmark": "tadm_speed",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "python": sys.version.split()[0], "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "cpu_count": os.cpu_count(), "cuda": torch.cuda.is_available(),
                    "note": "shared 2-core CPU; other jobs may run at the same time, so absolute tokens/s are noisy"},
        "command": "python benchmarks/tadm_speed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "setup": {"sampler": "low_confidence greedy", "prompt": f"first {args.prompt_len} tokens of held-out blocks",
                  "timing": "median of --repeats runs per configuration, configurations interleaved", "steps_T": args.steps, "gen_length": args.gen_length,
                  "batch": args.batch, "repeats": args.repeats, "ppl_heldout": f"wikitext2_test, {held_out.shape[0]} blocks "
                  f"of {args.seq_len} tokens, {args.ppl_t_samples} t-samples", "vocab_size": adlm.config.vocab_size,
                  "hidden_size": adlm.config.hidden_size, "adlm_layers": {"anchor": a_l, "denoiser": a_d},
                  "tadm_layers": {"shared": c.shared_layers, "anchor": c.num_hidden_layers, "denoiser": c.num_denoiser_layers},
                  "fusion_parameters": sum(p.numel() for p in tadm.fusion.parameters()),
                  "base_train_steps": args.base_steps, "posttrain_steps": post.get("global_steps", args.post_steps),
                  "train_and_load_seconds": round(train_seconds, 1),
                  "cost_formula": "T (L_S + L_D) + ceil(T/K) L_A layer calls per generation"},
        "results": {"adlm_k1": adlm_row, "tadm": tadm_rows, "adlm_stale": stale_rows,
                    "tadm_pretrained": pre_rows or None},
        "goal": "speedup >= 1.5 at K=3 with at most 2% relative quality (ppl) loss",
    }
    k3 = tadm_rows.get("3")
    if k3:
        result["goal_met_at_k3"] = bool(k3["speedup_vs_k1"] >= 1.5 and k3["ppl_rel_change"] <= 0.02)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    logger.info("wrote %s", out)
    print(json.dumps({k: {kk: (round(vv, 3) if isinstance(vv, float) else vv) for kk, vv in v.items()
                          if kk in ("tokens_per_s", "speedup_vs_k1", "ppl", "ppl_rel_change", "agreement_with_k1",
                                    "layer_calls", "layer_calls_formula")} for k, v in tadm_rows.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
