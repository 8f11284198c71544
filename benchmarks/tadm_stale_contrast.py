"""The stale-anchor contrast of ``benchmarks/tadm_speed.py --stale-contrast`` (issue 13, item 3).

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
samples, and the fusion's gate and correction size.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any

import torch

logger = logging.getLogger("tadm_speed.stale")


def make_rows(tok, n: int, seed: int, window: int) -> list[tuple[list[int], list[int]]]:
    """(facts + newline ids, derivation + EOS padded to ``window``) for ``n`` small ProsQA documents."""
    from anchored_reasoning import generators
    from anchored_reasoning.train.backbone import document, encode

    rows = []
    for ex in generators.generate_dataset("prosqa", n, seed=seed, split=f"stale{seed}", num_nodes=7, min_hops=1, max_hops=2):
        ids, head = encode(tok, document(ex, "prosqa"))
        resp = ids[head:][:window]
        rows.append((ids[:head], resp + [tok.eos_token_id] * (window - len(resp))))
    return rows


def batch(rows, pad_id: int):
    """Left-padded facts, then the window: ids, attention mask, window mask (B, P + window)."""
    width = max(len(f) for f, _ in rows)
    ids, am, lm = [], [], []
    for facts, resp in rows:
        pad = width - len(facts)
        ids.append([pad_id] * pad + facts + resp)
        am.append([0] * pad + [1] * (len(facts) + len(resp)))
        lm.append([False] * (pad + len(facts)) + [True] * len(resp))
    return torch.tensor(ids), torch.tensor(am), torch.tensor(lm)


def build(kind: str, tok, hidden: int, max_len: int):
    from anchored_reasoning.models import ADLM, ADLMConfig, TADM, TADMConfig

    common = dict(vocab_size=len(tok), mask_token_id=tok.mask_token_id, pad_token_id=tok.pad_token_id,
                  eos_token_id=tok.eos_token_id, hidden_size=hidden, num_attention_heads=4, intermediate_size=4 * hidden,
                  max_position_embeddings=max_len, dropout=0.0)
    torch.manual_seed(0)
    if kind == "adlm":
        return ADLM(ADLMConfig(**common, num_hidden_layers=3, denoiser_layers=1))
    scale = "relative" if kind == "tadm_relative" else "absolute"
    return TADM(TADMConfig(**common, shared_layers=1, num_hidden_layers=2, denoiser_layers=1, fusion_scale=scale))


def train(model, rows, args, window: int, pad_id: int) -> dict[str, Any]:
    from anchored_reasoning.objectives import diffusion_loss, gamma_schedule
    from anchored_reasoning.objectives_tadm import t_anelbo

    opt = torch.optim.AdamW(model.parameters(), lr=args.stale_lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)
    model.train()
    t0, log = time.perf_counter(), []
    for step in range(args.stale_steps):
        for g in opt.param_groups:
            g["lr"] = args.stale_lr * min(1.0, (step + 1) / 20)
        pick = torch.randint(len(rows), (args.stale_batch,), generator=gen).tolist()
        ids, am, lm = batch([rows[i] for i in pick], pad_id)
        gamma = gamma_schedule(step, args.stale_steps)
        common = dict(attention_mask=am, loss_mask=lm, gamma=gamma, anchor_ignore_ids=[pad_id], generator=gen)
        if hasattr(model, "fusion"):
            out = t_anelbo(model, ids, k_choices=(1, 2, 4, 8), sampling_steps=window, **common)
        else:
            out = diffusion_loss(model, ids, **common)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % 100 == 0:
            log.append({"step": step + 1, "nelbo": round(float(out.nelbo), 4)})
            logger.info("%s step %d nelbo %.3f", type(model).__name__, step + 1, float(out.nelbo))
    model.eval()
    return {"steps": args.stale_steps, "seconds": round(time.perf_counter() - t0, 1), "nelbo_curve": log}


def trained(kind: str, tok, rows, args, window: int, max_len: int):
    """The ``kind`` model trained on ``rows``, saved under ``WORKDIR/stale_<kind>`` and reused from there
    (``benchmarks/diffusion_cache.py`` samples these same checkpoints)."""
    import json
    from pathlib import Path

    from transformers import AutoModelForMaskedLM

    import anchored_reasoning.models  # noqa: F401  (Auto registration)

    out = Path(args.workdir) / f"stale_{kind}_h{args.hidden}_s{args.stale_steps}"
    if (out / "config.json").is_file():
        return AutoModelForMaskedLM.from_pretrained(out).eval(), json.loads((out / "training.json").read_text())
    model = build(kind, tok, args.hidden, max_len)
    budget = train(model, rows, args, window, tok.pad_token_id)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "training.json").write_text(json.dumps({**budget, "window": window}, indent=1))
    return model, budget


@torch.no_grad()
def judge_ppl(judge, prompts: torch.Tensor, prompt_am: torch.Tensor, gen: torch.Tensor, eos: int) -> float:
    """Generative perplexity: exp(mean NLL) of the generated tokens (up to and including the first
    EOS) under the AR judge, given the facts."""
    total, count = 0.0, 0
    for r in range(prompts.shape[0]):
        facts = prompts[r][prompt_am[r].bool()].tolist()
        toks = gen[r].tolist()
        toks = toks[:toks.index(eos) + 1] if eos in toks else toks
        x = torch.tensor([facts + toks])
        logp = judge(input_ids=x).logits[0, len(facts) - 1:-1].float().log_softmax(-1)
        total -= float(logp.gather(-1, torch.tensor(toks).unsqueeze(-1)).sum())
        count += len(toks)
    return math.exp(total / max(count, 1))


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
    train_rows = make_rows(tok, args.stale_train_n, 0, window)
    held = make_rows(tok, args.stale_eval_n, 10_000, window)
    max_len = max(len(f) for f, _ in train_rows + held) + window
    ids, am, lm = batch(held, tok.pad_token_id)
    width = ids.shape[1] - window
    prompts, prompt_am = ids[:, :width], am[:, :width]
    cfg = SamplerConfig(remasking="low_confidence", steps=window, gen_length=window, temperature=0.0)
    ks = [1, *args.ks]
    results: dict[str, Any] = {}
    for kind in ("adlm", "tadm", "tadm_relative"):
        model, budget = trained(kind, tok, train_rows, args, window, max_len + 8)
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


def diagnose(args, train_models, pretrain_tadm) -> dict[str, Any]:
    """``tadm_speed.py --diagnose``: the WikiText models of the main benchmark (trained or reused in
    ``--workdir``), probed with :func:`context_use` over whole blocks (every input token masked),
    the stale bounds at K = 1, 8, 64 and the fusion's gate and correction size."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from anchored_reasoning.objectives_tadm import stale_perplexity_bound
    from anchored_reasoning.train.diffusion import data_path
    from anchored_reasoning.train.tadm import text_blocks

    adlm_dir, tadm_dir = train_models(args)
    dirs = {"adlm": adlm_dir, "tadm_posttrained": tadm_dir, "tadm_pretrained": pretrain_tadm(args)}
    tok = AutoTokenizer.from_pretrained(adlm_dir)
    x = text_blocks(tok, data_path("corpora/wikitext2_test.txt"), args.seq_len, args.diagnose_blocks)
    am, lm = torch.ones_like(x), torch.ones_like(x, dtype=torch.bool)
    out = {}
    for name, d in dirs.items():
        model = AutoModelForMaskedLM.from_pretrained(d).eval()
        row = {"checkpoint": str(d), "context_use_ppl": context_use(model, x, am, lm, args.steps, blind_last=x.shape[1]),
               "fusion": fusion_stats(model, x[:16], am[:16])}
        row["stale_ppl"] = {str(k): stale_perplexity_bound(model, x, refresh_every=k, sampling_steps=args.steps,
                                                           num_t_samples=4, seed=0).perplexity for k in (1, 8, 64)}
        logger.info("%s: %s", name, row["context_use_ppl"])
        out[name] = row
    return {"setup": {"data": f"wikitext2_test, {x.shape[0]} blocks of {x.shape[1]} tokens, 4 t-samples",
                      "probe": "context_use_ppl: the bound with a fresh anchor, with the anchor network reading all-mask "
                               "tokens, and with every part reading all-mask tokens",
                      "pretrain_steps": args.pretrain_steps, "base_steps": args.base_steps, "post_steps": args.post_steps},
            "results": out}
