"""TADM's refresh-interval sweep at small sampling budgets (issue 51 item 5; the paper's Table 4 shape).

    OMP_NUM_THREADS=1 python -m benchmarks.tadm_budget_sweep --workdir runs/tadm_budget \\
        --out benchmarks/results/tadm_budget_sweep.json

The paper sees staleness at *small* budgets: 1,024 tokens generated in T = 128 or 256 steps (8 or 4
tokens revealed per step), where MAUVE falls 0.135 -> 0.040 from K = 1 to K = 4 at T = 128, while at
T >= 2048 Gen PPL hardly moves. The earlier "flat over K" here (``tadm_stale_contrast``) generated
20 tokens in 20 steps. This benchmark keeps the paper's lengths: unconditional generation of 1,024
tokens at T = 128 and 256 with the anchor refreshed every K = 1, 2, 4, 8 steps.

* **Data**: small generated ProsQA documents (facts of a 7-node graph, newline, a 1-2 hop derivation
  that copies names from the facts; logic-gpt2's tokenizer) packed EOS-separated into sequences of
  1,024 tokens after a leading EOS (the clean one-token prompt).
* **Model**: the small TADM of the other TADM benchmarks (width ``--hidden``, S 1 block, A 2, D 1),
  with the paper's pretraining fusion (``fusion_variant="published"``) and anchor (h = A(S(z)), hidden
  states; gamma = 0, TADM-dagger), trained from scratch with T-ANELBO as published: K ~ {1, 2, 4, 8},
  cache age ~ U{0..K-1}, T ~ {128, ..., 4096}, t' = min(1, t + age/T).
* **Sampler**: MDLM ancestral on the linear schedule (the time grid T-ANELBO's t' is built on), nucleus
  p = 0.9 as in the paper, one block of 1,024, ``--samples`` sequences per setting, the same seed for every K.
* **Per (T, K)**: the share of *valid* documents (complete, well-formed, every derivation sentence a fact or
  following from the two before it and a rule of the facts; 95% interval by a bootstrap over sequences,
  and the paired difference to K = 1), the generative perplexity of the documents under the logic-gpt2
  judge (AR, pretrained on this text), token entropy, the stale-anchor NELBO bound on held-out sequences
  at this T and K, tokens/s, model calls and transformer-layer calls (``T (L_S + L_D) + ceil(T/K) L_A``).

The trained model is saved under ``--workdir`` and reused by a rerun.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch

from anchored_reasoning.machine import machine_info
from benchmarks.common import write_result

logger = logging.getLogger("tadm_budget_sweep")
SENT = re.compile(r"^(?:(Every) )?(\w+) is a (\w+)\.$")


def packed_sequences(tok, n_seq: int, length: int, seed: int) -> torch.Tensor:
    """``n_seq`` rows of ``length + 1`` tokens: EOS, then documents each followed by EOS (the last cut)."""
    from anchored_reasoning import generators
    from anchored_reasoning.train.data.logic_text import document, encode

    eos = tok.eos_token_id
    per_doc = 48  # about the tokens of one document with its EOS; draw enough documents, then pack
    docs = generators.generate_dataset("prosqa", n_seq * (length // per_doc + 4), seed=seed, split=f"budget{seed}",
                                       num_nodes=7, min_hops=1, max_hops=2, neg_depth="any")
    stream = iter(encode(tok, document(ex, "prosqa"))[0] for ex in docs)  # each document ends with EOS
    rows = []
    for _ in range(n_seq):
        row = [eos]
        while len(row) < length + 1:
            row += next(stream)
        rows.append(row[:length + 1])
    return torch.tensor(rows)


def valid_document(text: str) -> bool:
    """Facts, one newline, a derivation: every sentence ``X is a Y.`` or ``Every Y is a Z.``; each
    derivation sentence is a fact, or ``X is a Z`` right after ``X is a Y. Every Y is a Z.`` with that rule a fact."""
    parts = text.strip(" ").split("\n")
    if len(parts) != 2:
        return False
    parsed = []
    for part in parts:
        matches = [SENT.match(s) for s in re.split(r"(?<=\.) ", part.strip())] if part.strip() else [None]
        if any(m is None for m in matches):
            return False
        parsed.append([(bool(e), a, b) for e, a, b in (m.groups() for m in matches)])
    facts, derivation = set(parsed[0]), parsed[1]
    for i, (rule, a, b) in enumerate(derivation):
        if (rule, a, b) in facts:
            continue
        if (not rule and i >= 2 and derivation[i - 1][0] and derivation[i - 1][2] == b and derivation[i - 1] in facts
                and derivation[i - 2] == (False, a, derivation[i - 1][1])):
            continue
        return False
    return True


def documents(row: list[int], eos: int) -> list[list[int]]:
    """The complete documents of a generated row (between two EOS; the first after the prompt's EOS)."""
    ends = [i for i, t in enumerate(row) if t == eos]
    return [row[a + 1:b] for a, b in zip([-1, *ends], ends) if b > a + 1]


@torch.no_grad()
def score_rows(gen: torch.Tensor, tok, judge) -> list[dict[str, float]]:
    """Per generated row: documents, valid ones, judge NLL and token count, unigram entropy."""
    eos = tok.eos_token_id
    limit = int(getattr(judge.config, "n_positions", None) or judge.config.max_position_embeddings) - 2
    out = []
    for row in gen.tolist():
        docs = documents(row, eos)
        nll, n = 0.0, 0
        for d in docs:  # a document longer than the judge's context (never a valid one) is judged on its start
            x = torch.tensor([[eos, *d[:limit], *([eos] if len(d) <= limit else [])]])
            logp = judge(input_ids=x).logits[0, :-1].float().log_softmax(-1)
            nll -= float(logp.gather(-1, x[0, 1:].unsqueeze(-1)).sum())
            n += x.shape[1] - 1
        counts = torch.bincount(torch.tensor(row), minlength=1).float()
        p = counts[counts > 0] / counts.sum()
        out.append({"docs": len(docs), "valid": sum(valid_document(tok.decode(d)) for d in docs), "nll": nll,
                    "judged_tokens": n, "entropy": float(-(p * p.log()).sum())})
    return out


def bootstrap(per_row: list[dict[str, float]], ref: list[dict[str, float]] | None, reps: int = 2000,
              seed: int = 0) -> dict[str, Any]:
    """Valid share and generative perplexity with 95% intervals by resampling rows (and, with ``ref``, the
    paired difference of the valid share to ``ref``'s rows)."""
    g = torch.Generator().manual_seed(seed)
    n = len(per_row)
    col = {k: torch.tensor([r[k] for r in per_row], dtype=torch.float64) for k in ("docs", "valid", "nll", "judged_tokens")}
    valid_share = lambda idx, c: float(c["valid"][idx].sum() / c["docs"][idx].sum().clamp(min=1))  # noqa: E731
    ppl = lambda idx, c: math.exp(float(c["nll"][idx].sum() / c["judged_tokens"][idx].sum().clamp(min=1)))  # noqa: E731
    full = torch.arange(n)
    draws = [torch.randint(n, (n,), generator=g) for _ in range(reps)]

    def ci(fn, c):
        vals = sorted(fn(idx, c) for idx in draws)
        return [vals[int(0.025 * reps)], vals[int(0.975 * reps) - 1]]

    out = {"valid_share": valid_share(full, col), "valid_share_ci95": ci(valid_share, col),
           "gen_ppl": ppl(full, col), "gen_ppl_ci95": ci(ppl, col), "documents": int(col["docs"].sum()),
           "valid_documents": int(col["valid"].sum()),
           "entropy": sum(r["entropy"] for r in per_row) / n}
    if ref is not None:
        rc = {k: torch.tensor([r[k] for r in ref], dtype=torch.float64) for k in ("docs", "valid")}
        diffs = sorted(valid_share(idx, col) - valid_share(idx, rc) for idx in draws)
        out["valid_share_minus_k1"] = valid_share(full, col) - valid_share(full, rc)
        out["valid_share_minus_k1_ci95"] = [diffs[int(0.025 * reps)], diffs[int(0.975 * reps) - 1]]
    return out


def train(args, tok, max_len: int):
    """The TADM (published fusion, hidden anchor, gamma = 0) trained with T-ANELBO as published, or reused."""
    from transformers import AutoModelForMaskedLM

    import anchored_reasoning.models  # noqa: F401  (Auto registration)
    from anchored_reasoning.models import TADM, TADMConfig
    from anchored_reasoning.objectives_tadm import BUDGET_CHOICES, K_CHOICES, t_anelbo

    out = Path(args.workdir) / f"tadm_h{args.hidden}_s{args.train_steps}"
    if (out / "config.json").is_file():
        return AutoModelForMaskedLM.from_pretrained(out).eval(), json.loads((out / "training.json").read_text())
    torch.manual_seed(0)
    model = TADM(TADMConfig(vocab_size=len(tok), mask_token_id=tok.mask_token_id, pad_token_id=tok.pad_token_id,
                            eos_token_id=tok.eos_token_id, hidden_size=args.hidden, num_attention_heads=4,
                            intermediate_size=4 * args.hidden, max_position_embeddings=max_len, dropout=0.0,
                            shared_layers=1, num_hidden_layers=2, denoiser_layers=1, fusion_variant="published",
                            anchor_bottleneck="hidden"))
    data = packed_sequences(tok, args.train_sequences, args.length, seed=0)
    prompt_mask = torch.zeros_like(data, dtype=torch.bool)
    prompt_mask[:, 0] = True  # the leading EOS stays clean, as the sampler's prompt
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)
    model.train()
    t0, log, step = time.perf_counter(), [], 0
    while step < args.train_steps and time.perf_counter() - t0 < 60 * args.train_minutes:
        for g in opt.param_groups:
            g["lr"] = args.lr * min(1.0, (step + 1) / 20)
        pick = torch.randint(len(data), (args.batch,), generator=gen)
        loss = t_anelbo(model, data[pick], prompt_mask=prompt_mask[pick], gamma=0.0, k_choices=K_CHOICES,
                        budget_choices=BUDGET_CHOICES, generator=gen)
        opt.zero_grad(set_to_none=True)
        loss.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 25 == 0:
            log.append({"step": step, "nelbo": round(float(loss.nelbo), 4), "seconds": round(time.perf_counter() - t0, 1)})
            logger.info("step %d nelbo %.3f (%.0f s)", step, float(loss.nelbo), time.perf_counter() - t0)
    model.eval()
    budget = {"steps": step, "steps_asked": args.train_steps, "seconds": round(time.perf_counter() - t0, 1),
              "batch": args.batch, "lr": args.lr, "nelbo_curve": log,
              "fusion_parameters": sum(p.numel() for p in model.fusion.parameters()),
              "parameters": sum(p.numel() for p in model.parameters())}
    model.save_pretrained(out)
    (out / "training.json").write_text(json.dumps(budget, indent=1))
    return model, budget


def sweep(args, save=None) -> dict[str, Any]:
    """The sweep's JSON body; ``save(body)`` (if given) gets the body so far after each budget."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anchored_reasoning.models.zoo import resolve_model
    from anchored_reasoning.objectives_tadm import stale_perplexity_bound
    from anchored_reasoning.sampling import SamplerConfig, sample

    tok = AutoTokenizer.from_pretrained(resolve_model("logic-gpt2"))
    judge = AutoModelForCausalLM.from_pretrained(resolve_model("logic-gpt2")).eval()
    model, training = train(args, tok, args.length + 1)
    cfg = model.config
    held = packed_sequences(tok, args.bound_sequences, args.length, seed=10_000)
    held_mask = torch.ones_like(held, dtype=torch.bool)
    held_mask[:, 0] = False
    gold = score_rows(held[:, 1:], tok, judge)
    prompts = torch.full((args.samples, 1), tok.eos_token_id)
    results: dict[str, Any] = {}

    def body() -> dict[str, Any]:
        return {
            "setup": {
                "corpus": "generated small ProsQA documents (7 nodes, 1-2 hops), EOS-separated, packed into "
                          f"{args.length}-token sequences after a leading EOS; logic-gpt2's tokenizer",
                "model": f"TADM width {args.hidden}, S 1 + A 2 + D 1 blocks, fusion_variant=published, anchor_bottleneck=hidden "
                         "(gamma = 0)",
                "training": f"T-ANELBO, K ~ {{1,2,4,8}}, age ~ U{{0..K-1}}, T ~ {{128..4096}}, t' = min(1, t + age/T); "
                            f"batch {args.batch} x {args.length}, AdamW lr {args.lr} (20 warm-up steps), no weight decay, seed 0",
                "sampler": f"ancestral (MDLM), nucleus p = 0.9, temperature 1, one block of {args.length}, {args.samples} "
                           f"sequences per setting, seed {args.seed}",
                "valid": "a complete document (between two EOS) whose every sentence parses and whose derivation follows "
                         "from its facts; intervals: bootstrap over the sequences (2,000 resamples)",
                "judge": "logic-gpt2 (AR, pretrained on logic text): perplexity of each complete document given EOS",
                "bound": f"stale-anchor NELBO perplexity bound on {args.bound_sequences} held-out sequences, "
                         f"{args.bound_t_samples} times each, at the row's T and K",
                "gold": bootstrap(gold, None), "layer_split": [cfg.shared_layers, cfg.num_hidden_layers, cfg.num_denoiser_layers],
            },
            "training": training,
            "results": results,
        }

    for T in args.budgets:
        rows, ref = {}, None
        for k in args.ks:
            sc = SamplerConfig(remasking="ancestral", steps=T, gen_length=args.length, temperature=1.0, top_p=0.9,
                               seed=args.seed, anchor_refresh_every=k)
            out, stats = sample(model, prompts, sc)
            per_row = score_rows(out[:, 1:], tok, judge)
            ref = per_row if k == 1 else ref
            bound = stale_perplexity_bound(model, held, refresh_every=k, sampling_steps=T, num_t_samples=args.bound_t_samples,
                                           batch_size=8, seed=0, loss_mask=held_mask)
            rows[str(k)] = {
                "K": k, **bootstrap(per_row, None if k == 1 else ref), "elbo_ppl": bound.perplexity,
                "tokens_per_second": stats.tokens_per_second, "seconds": round(stats.seconds, 2), "nfe": stats.nfe,
                "anchor_refresh_fraction": stats.anchor_refresh_fraction if k > 1 else 1.0,
                "layer_calls_per_sample": cfg.layer_calls(stats.nfe, k)}
            logger.info("T=%d K=%d: valid %.3f gen ppl %.2f elbo ppl %.3f %.1f tok/s", T, k, rows[str(k)]["valid_share"],
                        rows[str(k)]["gen_ppl"], bound.perplexity, stats.tokens_per_second)
        base = rows["1"]
        for r in rows.values():
            r["speedup_over_k1"] = r["tokens_per_second"] / base["tokens_per_second"]
            r["layer_calls_over_k1"] = r["layer_calls_per_sample"] / base["layer_calls_per_sample"]
        results[f"T={T}"] = rows
        if save is not None:
            save(body())
    return body()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", default="runs/tadm_budget", help="where the trained TADM is saved (and reused from)")
    p.add_argument("--out", default="benchmarks/results/tadm_budget_sweep.json")
    p.add_argument("--budgets", type=int, nargs="+", default=[128, 256], help="sampling budgets T")
    p.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8], help="anchor refresh periods (the first must be 1)")
    p.add_argument("--length", type=int, default=1024, help="generated tokens per sequence (the paper's 1,024)")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--train-steps", type=int, default=400)
    p.add_argument("--train-minutes", type=float, default=25.0, help="stop training here even before --train-steps")
    p.add_argument("--train-sequences", type=int, default=2000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--samples", type=int, default=16, help="generated sequences per (T, K)")
    p.add_argument("--bound-sequences", type=int, default=16)
    p.add_argument("--bound-t-samples", type=int, default=4)
    p.add_argument("--seed", type=int, default=0, help="sampler seed (the same for every K)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--machine-note", default=None, help="what else ran on the machine (recorded in the JSON)")
    args = p.parse_args(argv)
    for name in ("length", "hidden", "train_steps", "train_sequences", "batch", "samples", "bound_sequences",
                 "bound_t_samples", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.ks[0] != 1 or any(k < 1 for k in args.ks):
        p.error(f"--ks must start with 1 (the reference) and hold periods >= 1, got {args.ks}")
    if any(t < 1 for t in args.budgets):
        p.error(f"--budgets must be >= 1, got {args.budgets}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)
    command = "python -m benchmarks.tadm_budget_sweep " + " ".join(argv if argv is not None else sys.argv[1:])
    machine = machine_info(note=args.machine_note)
    t0 = time.monotonic()

    def save(body: dict[str, Any], finished: bool = False) -> None:  # after each budget, so a cut run keeps what it measured
        write_result(args.out, {
            "benchmark": "tadm_budget_sweep", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": {**machine, "load_average_at_end": list(os.getloadavg())}, "command": command, **body,
            "finished": finished, "wall_seconds": round(time.monotonic() - t0, 1)})

    save(sweep(args, save), finished=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
