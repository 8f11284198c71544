"""The stale-anchor contrast (issue 13, item 3): plain ADLM reusing a stale anchor vs T-ANELBO TADM, per K.

    OMP_NUM_THREADS=1 python -m benchmarks.tadm_stale_contrast --workdir runs/tadm_bench \\
        --out benchmarks/results/tadm_stale_contrast.json

Does the anchor cache matter, and does TADM's training make staleness cheap? On WikiText at 300
steps it cannot show: those models hardly use context (the T-ANELBO TADM's bound is the same with
every input token masked), so no anchor, fresh or stale, carries information. Here the models
learn a corpus where context decides the next tokens: small generated ProsQA documents (the facts
of a 7-node graph, a newline, then a 1-2 hop derivation that copies names from the facts), with the
logic-gpt2 tokenizer so that ``logic-gpt2`` (an AR model pretrained on this kind of text) can judge
the samples.

Three models of the same size (width ``--hidden``, 4 blocks in all, the same steps, batch, data and
seed), trained on the derivation window (the facts stay clean, as at generation):

* ``adlm``: ADLM (anchor 3 blocks, denoiser 1), ANELBO, never trained for stale anchors; sampled
  with its anchor reused for K model calls it is "plain ADLM with a stale anchor";
* ``tadm``: TADM (S 1 block, A 2, D 1) trained with T-ANELBO (K from {1, 2, 4, 8}, cache age
  uniform in 0..K-1, on the sampler's time grid of T = window steps), the default fusion;
* ``tadm_relative``: the same TADM with ``fusion_scale="relative"`` (a correction scaled by |h|).

Per K it reports the stale-anchor NELBO perplexity bound on held-out derivations
(:func:`~anchored_reasoning.objectives_tadm.stale_perplexity_bound` with the facts as clean prompt)
and the generative perplexity of greedy low-confidence samples (T = window steps, one token per
step) under the logic-gpt2 judge, given the facts; plus agreement with the model's own K = 1
samples, and the fusion's gate and correction size. The three models are saved under ``--workdir`` and
reused by a rerun and by ``benchmarks.diffusion_cache`` (the same checkpoints, sampled with the KV cache).
(Until the benchmarks became modules this ran as ``tadm_speed.py --stale-contrast``, with the same options.)
"""
from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
import time
from typing import Any

import torch

from anchored_reasoning.machine import machine_info
from benchmarks.common import judge_ppl, logic_rows, trained_stale_model, window_batch, write_result

logger = logging.getLogger("tadm_stale_contrast")


@torch.no_grad()
def context_use(model, ids, am, lm, steps: int, blind_last: int | None = None) -> dict[str, float]:
    """The diagnosis: the NELBO bound with a fresh anchor, against the same bound when the anchor
    network (or everything the model reads) sees the last ``blind_last`` positions (default the
    window, ``steps``; the facts stay clean) fully masked. A model whose bound does not move uses
    none of those tokens, so no anchor, fresh or stale, can matter to it."""
    from anchored_reasoning.models.blocks import subs_log_probs
    from anchored_reasoning.objectives_tadm import stale_perplexity_bound

    mid = model.config.mask_token_id
    n_blind = blind_last or steps

    def blind(z):
        z = z.clone()
        z[:, -n_blind:] = mid
        return z

    class Blind(torch.nn.Module):
        def __init__(self, everything: bool):
            super().__init__()
            self.m, self.everything, self.config = model, everything, model.config

        def anchor_forward(self, z, mask=None):
            return self.m.anchor_forward(blind(z), mask)

        def denoise(self, anchor, z, mask=None):
            if not (self.everything and hasattr(self.m, "fusion")):  # ADLM's denoiser reads only the anchor
                return self.m.denoise(anchor, z, mask)
            c = self.m.shared_forward(blind(z), mask)
            out = self.m.denoiser(self.m.fusion(c, anchor.hidden), mask)
            return subs_log_probs(self.m.lm_head(out), z, mid)

    def bound(m):
        return stale_perplexity_bound(m, ids, am, refresh_every=1, sampling_steps=steps, num_t_samples=4, batch_size=32,
                                      seed=0, loss_mask=lm).perplexity

    return {"fresh": bound(model), "anchor_reads_masked_window": bound(Blind(False)),
            "everything_reads_masked_window": bound(Blind(True))}


@torch.no_grad()
def fusion_stats(model, ids, am) -> dict[str, float] | None:
    if not hasattr(model, "fusion"):
        return None
    f = model.fusion
    z = ids.clone()
    z[:, -8:] = model.config.mask_token_id
    anchor = model.anchor_forward(z, am)
    c = anchor.shared
    u = torch.cat([f.norm_c(c), f.norm_h(anchor.hidden)], -1)
    fused = f(c, anchor.hidden)
    corr = (fused - anchor.hidden).norm(dim=-1).mean() / anchor.hidden.norm(dim=-1).mean()
    return {"gate_mean": float(torch.sigmoid(f.gate(u)).mean()), "gate_bias_mean": float(f.gate.bias.mean()),
            "correction_over_h": float(corr)}


def stale_contrast(args) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anchored_reasoning.models.zoo import resolve_model
    from anchored_reasoning.objectives_tadm import stale_perplexity_bound
    from anchored_reasoning.sampling import SamplerConfig, sample

    window = args.stale_window
    tok = AutoTokenizer.from_pretrained(resolve_model("logic-gpt2"))
    judge = AutoModelForCausalLM.from_pretrained(resolve_model("logic-gpt2")).eval()
    train_rows = logic_rows(tok, args.stale_train_n, 0, window)
    held = logic_rows(tok, args.stale_eval_n, 10_000, window)
    max_len = max(len(f) for f, _ in train_rows + held) + window
    ids, am, lm = window_batch(held, tok.pad_token_id)
    width = ids.shape[1] - window
    prompts, prompt_am = ids[:, :width], am[:, :width]
    cfg = SamplerConfig(remasking="low_confidence", steps=window, gen_length=window, temperature=0.0)
    ks = [1, *args.ks]
    results: dict[str, Any] = {}
    for kind in ("adlm", "tadm", "tadm_relative"):
        model, budget = trained_stale_model(kind, tok, train_rows, args, window, max_len + 8)
        rows, ref = {}, None
        for k in ks:
            bound = stale_perplexity_bound(model, ids, am, refresh_every=k, sampling_steps=window, num_t_samples=4,
                                           batch_size=32, seed=0, loss_mask=lm)
            out, stats = sample(model, prompts, cfg.replace(anchor_refresh_every=k), attention_mask=prompt_am)
            gen = out[:, width:]
            ref = gen if k == 1 else ref
            rows[str(k)] = {"K": k, "elbo_ppl": bound.perplexity, "gen_ppl_judge": judge_ppl(judge, prompts, prompt_am, gen,
                                                                                               tok.eos_token_id),
                            "agreement_with_own_k1": float((gen == ref).float().mean()), "nfe": stats.nfe}
            logger.info("%s K=%d: ELBO ppl %.3f, gen ppl %.3f", kind, k, rows[str(k)]["elbo_ppl"], rows[str(k)]["gen_ppl_judge"])
        base = rows["1"]
        for r in rows.values():
            r["elbo_ppl_rel_change"] = r["elbo_ppl"] / base["elbo_ppl"] - 1
            r["gen_ppl_rel_change"] = r["gen_ppl_judge"] / base["gen_ppl_judge"] - 1
        results[kind] = {"rows": rows, "training": budget, "parameters": sum(p.numel() for p in model.parameters()),
                         "fusion": fusion_stats(model, ids[:32], am[:32]),
                         "context_use_elbo_ppl": context_use(model, ids, am, lm, window)}
    gold_ppl = judge_ppl(judge, prompts, prompt_am, ids[:, width:], tok.eos_token_id)
    return {
        "setup": {
            "corpus": f"generated small ProsQA documents (7 nodes, 1-2 hops): facts, newline, derivation; "
                      f"{args.stale_train_n} training, {args.stale_eval_n} held-out (other seed)",
            "tokenizer": "logic-gpt2's", "window": window, "sampler": f"low_confidence greedy, {window} steps for {window} tokens",
            "judge": "logic-gpt2 (AR, 0.9M, pretrained on logic text), NLL of the generated tokens given the facts",
            "judge_ppl_of_gold_derivations": gold_ppl, "hidden_size": args.hidden,
            "models": {"adlm": "ADLM anchor 3 + denoiser 1, ANELBO (gamma 3e-3)",
                       "tadm": "TADM S 1 + A 2 + D 1, T-ANELBO K in {1,2,4,8}, default (absolute) fusion",
                       "tadm_relative": "the same TADM with fusion_scale=relative (correction scaled by |h|)"},
            "training": f"{args.stale_steps} steps, batch {args.stale_batch}, AdamW lr {args.stale_lr}, seed 0",
        },
        "results": results,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", default="runs/tadm_bench", help="where the three models are saved (and reused from)")
    p.add_argument("--out", "--stale-out", dest="out", default="benchmarks/results/tadm_stale_contrast.json")
    p.add_argument("--ks", type=int, nargs="+", default=[2, 3, 4, 8], help="anchor refresh periods besides K = 1")
    p.add_argument("--hidden", type=int, default=128, help="width of every model")
    p.add_argument("--stale-steps", type=int, default=400, help="training steps of each contrast model")
    p.add_argument("--stale-batch", type=int, default=32)
    p.add_argument("--stale-lr", type=float, default=1.5e-3)
    p.add_argument("--stale-window", type=int, default=20, help="derivation window = sampler steps T")
    p.add_argument("--stale-train-n", type=int, default=20000, help="generated training documents")
    p.add_argument("--stale-eval-n", type=int, default=64, help="held-out documents (ELBO bound and samples)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--machine-note", default=None, help="what else ran on the machine (recorded in the JSON)")
    args = p.parse_args(argv)
    for name in ("hidden", "stale_steps", "stale_batch", "stale_window", "stale_train_n", "stale_eval_n", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if any(k < 2 for k in args.ks):
        p.error(f"--ks are refresh periods beside K = 1 (always measured): each at least 2, got {args.ks}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    command = "python -m benchmarks.tadm_stale_contrast " + " ".join(argv if argv is not None else sys.argv[1:])
    t0 = time.monotonic()
    body = stale_contrast(args)
    result = {"benchmark": "tadm_stale_contrast", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "machine": machine_info(note=args.machine_note),
              "command": command, **body, "wall_seconds": round(time.monotonic() - t0, 1)}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
