"""TADM speed/quality benchmark: ADLM (K = 1) against TADM with the anchor refreshed every K steps.

Longer than ~400 lines on purpose: one benchmark script with two recorded phases (WikiText, ProsQA) that
share their model building and timing.

    ANCHORED_REASONING_DATA=/work/shared/data OMP_NUM_THREADS=1 \\
        python -m benchmarks.tadm_speed --workdir runs/tadm_bench --out benchmarks/results/tadm_speed.json

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
   * ``accuracy``: with ``--prosqa``, the ProsQA accuracy of the *reasoning-tuned* pair below at the
     same K (0-1, with its 95% bootstrap interval, n, no-answer count and training budget next to it);
     without ``--prosqa``, null with the reason.

   It also reports ``adlm_stale``: the *untrained* ADLM reusing stale anchors at each K (what the
   fusion module is there to repair), with its ppl and agreement; and, with ``--pretrain-steps N``,
   ``tadm_pretrained``: a TADM of the same total depth trained from scratch with T-ANELBO for N steps
   (S 1 block, A ``--anchor-layers`` - 1, D ``--denoiser-layers``), against the same ADLM.

4. with ``--prosqa`` (the accuracy phase; ``--skip-wikitext`` runs it alone and merges it into the
   JSON already at ``--out``):

   * diffusion SFT of an ADLM (recipe ``diffusion_sft_prosqa_small_adlm``: ``--prosqa-sft-steps`` steps)
     on ``--prosqa-train-n`` *small* generated ProsQA problems (the demo's size: 7 nodes drawn, 1-2
     hops) in the answer-only ``nocot`` format ("### <entity> is a <concept>.", an 8-token window);
   * TADM post-training from it (recipe ``tadm_posttrain_prosqa_small``: backbone frozen, fusion only,
     ``--prosqa-post-steps`` steps on the same SFT data);
   * greedy low-confidence sampling (``--prosqa-gen-length`` steps for as many tokens) of
     ``--prosqa-eval-n`` held-out problems (other seeds, questions seen in training removed, as the
     demo does) through the evaluation runner with the diffusion backend and
     ``anchor_refresh_every=K``, graded by the ProsQA task grader: ADLM at K = 1, TADM at K = 1 and
     each ``--ks``, the stale ADLM at each ``--ks``; accuracy with a 95% bootstrap interval, the
     no-answer count and the generation's tokens/s (median of ``--prosqa-repeats`` interleaved runs);
   * the same on the first ``--prosqa-real-n`` real ProsQA test problems when
     ``$ANCHORED_REASONING_DATA`` holds them (full-size graphs: far outside the training distribution).

   Chance is 0.5 (two options; a completion without either option is graded wrong). ``notes`` says
   for each row whether its interval is above, at or below chance.

The stale-anchor contrast on logic text (plain ADLM reusing a stale anchor vs T-ANELBO TADM per K, ELBO
bound and generative perplexity under logic-gpt2) is its own benchmark, ``python -m benchmarks.tadm_stale_contrast``
(formerly ``--stale-contrast`` here); the probe of why the WikiText models' bounds are flat in K (formerly
``--diagnose``) is archived as ``research/diffusion/tadm_diagnosis.py``.

Writes the JSON (``--out``) with per-K rows, the model sizes, the machine and the date.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
import time
from pathlib import Path

import torch

from anchored_reasoning.machine import machine_info
from benchmarks.common import timed_pass

logger = logging.getLogger("tadm_speed")
ACCURACY_REASON = "not measured in this run: pass --prosqa for the ProsQA accuracy phase"
CHANCE = 0.5  # ProsQA asks "<A> or <B>?"


def train_models(args) -> tuple[Path, Path]:
    from anchored_reasoning.train.pipelines import diffusion as dtrain
    from anchored_reasoning.train.pipelines import tadm as ttrain

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
    from anchored_reasoning.train.pipelines import tadm as ttrain

    out = Path(args.workdir) / "tadm_pretrained"
    if not (out / "config.json").is_file():
        shared = 1
        sizes = (f"{{hidden_size: {args.hidden}, num_attention_heads: 4, intermediate_size: {4 * args.hidden}, "
                 f"shared_layers: {shared}, num_hidden_layers: {args.anchor_layers - shared}, "
                 f"denoiser_layers: {args.denoiser_layers}, max_position_embeddings: {args.seq_len}, "
                 "fusion_variant: residual}")  # the fusion and fixed T its tadm_speed.json row was measured with
        ttrain.run("tadm_pretrain_tiny", [
            f"output_dir={out}", f"model.config={sizes}", f"data.seq_len={args.seq_len}", "data.valid_text_file=null",
            f"training.max_steps={args.pretrain_steps}", f"training.learning_rate={args.lr}",
            f"training.stale_sampling_steps={args.steps}", "training.stale_budget_choices=null"])
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


# ---------------------------------------------------------------------------------------------
# accuracy phase: a reasoning-tuned ADLM and its TADM on small ProsQA


def train_prosqa_models(args, train_n: int) -> tuple[Path, Path]:
    """SFT an ADLM on small generated ProsQA, then post-train a TADM from it (reused when present)."""
    from anchored_reasoning.demo import DEMO_SIZE
    from anchored_reasoning.train.pipelines import diffusion as dtrain
    from anchored_reasoning.train.pipelines import tadm as ttrain

    work = Path(args.workdir)
    tag = f"s{args.prosqa_seed}_n{train_n}_sft{args.prosqa_sft_steps}" + \
        (f"_{args.prosqa_sft_minutes:g}min" if args.prosqa_sft_minutes else "") + \
        (f"_from-{Path(args.prosqa_init).name}" if args.prosqa_init else "") + \
        (f"_layers{args.prosqa_layers[0]}-{args.prosqa_layers[1]}" if args.prosqa_layers else "")
    adlm_dir = work / f"prosqa_adlm_{tag}"
    tadm_dir = work / f"prosqa_tadm_{tag}_post{args.prosqa_post_steps}"
    size = "{" + ", ".join(f"{k}: {v}" for k, v in DEMO_SIZE.items()) + "}"
    data = [f"data.train.n={train_n}", f"data.train.seed={args.prosqa_seed}", f"data.train.params={size}",
            f"method.name={args.prosqa_method}", f"training.response_length={args.prosqa_gen_length}",
            f"training.per_device_train_batch_size={args.prosqa_batch}", f"seed={args.prosqa_seed}"]
    init: list[str] = []
    if args.prosqa_init:  # a pretrained ADLM (e.g. the shipped logic-adlm) with its tokenizer; it has 512 positions
        init = [f"model.name={args.prosqa_init}", f"model.tokenizer={args.prosqa_init}", "model.preset=null", "model.config=null"]
        data.append("data.max_length=512")
    elif args.prosqa_layers:  # a fresh ADLM of another depth (e.g. logic-adlm's 4 + 2, for a like-for-like start)
        init = [f"model.config.num_hidden_layers={args.prosqa_layers[0]}", f"model.config.denoiser_layers={args.prosqa_layers[1]}"]
    if not (adlm_dir / "config.json").is_file():
        curve = ["training.save_strategy=steps", f"training.save_steps={args.prosqa_curve_every}",
                 "training.save_only_model=true"] if args.prosqa_curve_every > 0 else []
        dtrain.run("diffusion_sft_prosqa_small_adlm", [
            f"output_dir={adlm_dir}", f"training.max_steps={args.prosqa_sft_steps}",
            f"training.max_train_seconds={args.prosqa_sft_minutes * 60 if args.prosqa_sft_minutes else 'null'}",
            f"training.learning_rate={args.prosqa_lr}", *curve, *data, *init])
    if not (tadm_dir / "config.json").is_file():
        ttrain.run("tadm_posttrain_prosqa_small", [
            f"output_dir={tadm_dir}", f"model.base={adlm_dir}", f"training.max_steps={args.prosqa_post_steps}",
            f"training.stale_sampling_steps={args.prosqa_gen_length}", *data])
    return adlm_dir, tadm_dir


def prosqa_eval(model, tok, method, examples, k: int, out_dir: Path, args) -> tuple[dict, float]:
    """One greedy pass of the evaluation runner (diffusion backend, anchor refreshed every K model
    calls) over ``examples``, from scratch (``common.timed_pass``); (runner summary, wall seconds)."""
    return timed_pass(model, tok, method, examples, out_dir, gen_length=args.prosqa_gen_length,
                      batch_size=args.prosqa_eval_batch, anchor_refresh_every=k)


def accuracy_curve(adlm_dir: Path, tok, method, examples, args) -> list[dict]:
    """Held-out accuracy (ADLM, K = 1) at the checkpoints SFT saved every ``--prosqa-curve-every`` steps."""
    from transformers import AutoModelForMaskedLM

    from anchored_reasoning.train.checkpointing import list_checkpoints

    curve = []
    for ckpt in list_checkpoints(adlm_dir):
        model = AutoModelForMaskedLM.from_pretrained(ckpt).eval()
        with torch.no_grad():
            summary, _ = prosqa_eval(model, tok, method, examples, 1, Path(args.workdir) / "prosqa_evals" / "curve", args)
        curve.append({"step": int(ckpt.name.split("-")[1]), **accuracy_entry(summary)})
        logger.info("SFT step %d: held-out accuracy %.3f", curve[-1]["step"], curve[-1]["accuracy"])
    return curve


def accuracy_entry(summary: dict) -> dict:
    acc = summary["accuracy"]
    lo, hi = acc["ci_low"], acc["ci_high"]
    verdict = "above chance" if lo > CHANCE else "below chance" if hi < CHANCE else "at chance"
    return {"accuracy": acc["mean"], "accuracy_ci95": [lo, hi], "n": acc["n"],
            "no_answer": summary["counts"]["no_answer"], "mean_answer_tokens": summary["tokens"]["mean"],
            "vs_chance": verdict}


def prosqa_phase(args) -> dict:
    """Train the reasoning-tuned ADLM/TADM pair and measure accuracy and tokens/s per K (see the module doc)."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from anchored_reasoning.demo import DEMO_SIZE, DemoSettings, make_data, real_test
    from anchored_reasoning.eval.methods import build_method

    settings = DemoSettings(seed=args.prosqa_seed, train_n=args.prosqa_train_n, eval_n=args.prosqa_eval_n,
                            real_n=args.prosqa_real_n, trace="forward")
    # The trainers draw the same training problems (same generator, seed and size); make_data draws
    # the held-out ones from other seeds and drops any question that also occurs in training.
    train, held = make_data(settings)
    real = real_test(settings)
    t0 = time.monotonic()
    adlm_dir, tadm_dir = train_prosqa_models(args, len(train))
    train_seconds = time.monotonic() - t0
    tok = AutoTokenizer.from_pretrained(adlm_dir)
    adlm = AutoModelForMaskedLM.from_pretrained(adlm_dir).eval()
    tadm = AutoModelForMaskedLM.from_pretrained(tadm_dir).eval()
    method = build_method(None, str(adlm_dir))  # the trained-style format the checkpoint records
    runs = {"adlm:1": (adlm, 1)}
    for k in [1, *args.ks]:
        runs[f"tadm:{k}"] = (tadm, k)
        if k > 1:
            runs[f"adlm:{k}"] = (adlm, k)
    evals = Path(args.workdir) / "prosqa_evals" / adlm_dir.name  # per trained pair: runs sharing a workdir never share records
    summaries: dict[str, dict] = {}
    times: dict[str, list[float]] = {name: [] for name in runs}
    with torch.no_grad():
        for rep in range(max(1, args.prosqa_repeats)):  # interleaved, so load changes hit every configuration alike
            for name, (model, k) in runs.items():
                summary, secs = prosqa_eval(model, tok, method, held, k, evals / name.replace(":", "_k"), args)
                times[name].append(secs)
                if name in summaries and summaries[name]["accuracy"]["mean"] != summary["accuracy"]["mean"]:
                    raise RuntimeError(f"{name}: greedy accuracy changed between repeats; generation is not deterministic")
                summaries[name] = summary
                logger.info("prosqa %s (pass %d): accuracy %.3f, %.1fs", name, rep + 1, summary["accuracy"]["mean"], secs)
        real_rows = {}
        for name, (model, k) in runs.items() if real else ():
            summary, secs = prosqa_eval(model, tok, method, real, k, evals / ("real_" + name.replace(":", "_k")), args)
            real_rows[name] = {**accuracy_entry(summary), "seconds": round(secs, 2)}
            logger.info("real ProsQA %s: accuracy %.3f", name, summary["accuracy"]["mean"])
    curve = accuracy_curve(adlm_dir, tok, method, held, args)
    n_positions = len(held) * args.prosqa_gen_length
    median = {name: sorted(v)[len(v) // 2] for name, v in times.items()}
    ref_tps = n_positions / median["adlm:1"]
    rows = {}
    for name, summary in summaries.items():
        tps = n_positions / median[name]
        rows[name] = {**accuracy_entry(summary), "tokens_per_s": tps, "speedup_vs_k1": tps / ref_tps,
                      "seconds_median": round(median[name], 3), "real_prosqa": real_rows.get(name)}
    sft = json.loads((adlm_dir / "train_summary.json").read_text())
    post = json.loads((tadm_dir / "train_summary.json").read_text())
    c = tadm.config
    budget = {"sft_steps": sft["global_steps"], "sft_seconds": sft["train_seconds"],
              "posttrain_steps": post["global_steps"], "posttrain_seconds": post["train_seconds"],
              "batch_size": args.prosqa_batch, "train_problems": len(train)}
    setup = {
        "data": f"generated ProsQA at the demo's size {DEMO_SIZE}: {len(train)} training problems (seed "
                f"{args.prosqa_seed}); {len(held)} held-out problems from seeds {args.prosqa_seed + 10_000}+, "
                "questions seen in training removed",
        "format": f"trained-style {method.name} (answer only), responses EOS-padded to {args.prosqa_gen_length} tokens",
        "adlm": {"checkpoint": str(adlm_dir), "recipe": "diffusion_sft_prosqa_small_adlm", "hidden_size": adlm.config.hidden_size,
                 "anchor_layers": adlm.config.num_hidden_layers, "denoiser_layers": adlm.config.num_denoiser_layers,
                 "parameters": sum(p.numel() for p in adlm.parameters()), "learning_rate": args.prosqa_lr,
                 "init": args.prosqa_init or "fresh"},
        "tadm": {"checkpoint": str(tadm_dir), "recipe": "tadm_posttrain_prosqa_small",
                 "layers": {"shared": c.shared_layers, "anchor": c.num_hidden_layers, "denoiser": c.num_denoiser_layers},
                 "fusion_parameters": sum(p.numel() for p in tadm.fusion.parameters())},
        "budget": budget, "train_and_load_seconds": round(train_seconds, 1),
        "sampler": f"low_confidence greedy, {args.prosqa_gen_length} steps for {args.prosqa_gen_length} tokens, "
                   "through run_eval + the diffusion backend with anchor_refresh_every=K",
        "tokens_per_s": f"generated window positions ({len(held)} problems x {args.prosqa_gen_length}) per wall second "
                        f"of the whole runner pass (prompt encoding and grading included), median of {args.prosqa_repeats}",
        "chance": CHANCE, "real_test_n": len(real),
    }
    return {"setup": setup, "rows": rows, "sft_accuracy_curve": curve}


def merge_accuracy(result: dict, prosqa: dict) -> None:
    """Put the ProsQA accuracy of each (model, K) into the WikiText rows with the same model kind and K."""
    rows, budget = prosqa["rows"], prosqa["setup"]["budget"]
    res = result["results"]

    def fill(row: dict, name: str) -> None:
        if not row:
            return
        a = rows.get(name)
        row.pop("accuracy_reason", None)
        if a is None:
            row["accuracy"] = None
            row["accuracy_reason"] = "no reasoning-tuned model of this kind was trained"
            return
        row.update({"accuracy": a["accuracy"], "accuracy_ci95": a["accuracy_ci95"], "accuracy_n": a["n"],
                    "accuracy_no_answer": a["no_answer"], "accuracy_vs_chance": a["vs_chance"],
                    "accuracy_tokens_per_s": a["tokens_per_s"], "accuracy_speedup_vs_k1": a["speedup_vs_k1"],
                    "accuracy_budget": budget,
                    "accuracy_model": f"ProsQA-SFT {'ADLM' if name.startswith('adlm') else 'TADM'} (small problems), "
                                      "not the WikiText model of this row's ppl"})

    fill(res["adlm_k1"], "adlm:1")
    for k, row in res["tadm"].items():
        fill(row, f"tadm:{k}")
    for k, row in res["adlm_stale"].items():
        fill(row, f"adlm:{k}")
    for row in (res.get("tadm_pretrained") or {}).values():
        fill(row, "pretrained")
    result["prosqa"] = prosqa
    notes = [f"ProsQA chance is {CHANCE} (two options); accuracy was measured after {budget['sft_steps']} SFT steps "
             f"({budget['sft_seconds']:.0f} s) and {budget['posttrain_steps']} fusion steps on a shared 2-core CPU."]
    for name, a in rows.items():
        lo, hi = a["accuracy_ci95"]
        line = f"{name}: {a['accuracy']:.3f} [{lo:.3f}, {hi:.3f}], {a['vs_chance']}"
        if a["vs_chance"] != "above chance":
            line += (f" -- a finding about this training budget, not about TADM ({a['no_answer']}/{a['n']} "
                     "completions name neither option)")
        notes.append(line)
    result["notes"] = notes


def build_parser() -> argparse.ArgumentParser:
    """The options (also read by research/diffusion/tadm_diagnosis.py, which probes the same models)."""
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
    p.add_argument("--prosqa", action="store_true", help="also run the ProsQA accuracy phase (see the module doc)")
    p.add_argument("--skip-wikitext", action="store_true",
                   help="run only the ProsQA phase and merge it into the JSON already at --out")
    p.add_argument("--prosqa-sft-steps", type=int, default=2000, help="diffusion SFT steps of the ProsQA ADLM")
    p.add_argument("--prosqa-sft-minutes", type=float, default=0,
                   help="also stop SFT after this many minutes of training (0: steps only); the steps reached are reported")
    p.add_argument("--prosqa-curve-every", type=int, default=0,
                   help="save an SFT checkpoint every N steps and report held-out accuracy (ADLM, K=1) at each (0: off)")
    p.add_argument("--prosqa-post-steps", type=int, default=200, help="fusion post-training steps of the ProsQA TADM")
    p.add_argument("--prosqa-lr", type=float, default=3e-3, help="SFT learning rate")
    p.add_argument("--prosqa-init", default=None,
                   help="SFT from this pretrained ADLM (alias or folder, e.g. logic-adlm) instead of a fresh one")
    p.add_argument("--prosqa-layers", type=int, nargs=2, default=None, metavar=("ANCHOR", "DENOISER"),
                   help="depths of the fresh ADLM (default: the recipe's 2 + 1)")
    p.add_argument("--prosqa-batch", type=int, default=32)
    p.add_argument("--prosqa-train-n", type=int, default=20000, help="generated training problems")
    p.add_argument("--prosqa-eval-n", type=int, default=200, help="held-out generated problems")
    p.add_argument("--prosqa-real-n", type=int, default=100,
                   help="real ProsQA test problems when $ANCHORED_REASONING_DATA has them (0: skip)")
    p.add_argument("--prosqa-method", default="nocot", help="trained-style format: nocot (answer only) or cot")
    p.add_argument("--prosqa-gen-length", type=int, default=8, help="response window = sampler steps")
    p.add_argument("--prosqa-eval-batch", type=int, default=64)
    p.add_argument("--prosqa-repeats", type=int, default=3, help="interleaved timed evaluation passes")
    p.add_argument("--prosqa-seed", type=int, default=0)
    return p


def parse_args(argv=None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.prosqa_init and args.prosqa_layers:
        p.error("--prosqa-layers shapes a fresh ADLM; --prosqa-init loads one with its own shape: give one of them")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    import anchored_reasoning.models  # noqa: F401  (Auto registration)

    out = Path(args.out)
    command = "python -m benchmarks.tadm_speed " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.skip_wikitext:
        if not args.prosqa:
            raise SystemExit("--skip-wikitext leaves nothing to do without --prosqa")
        if not out.is_file():
            raise SystemExit(f"--skip-wikitext merges into an existing result, but {out} does not exist; "
                             "run once without --skip-wikitext")
        result = json.loads(out.read_text())
    else:
        result = wikitext_phase(args, command)
    if args.prosqa:
        merge_accuracy(result, prosqa_phase(args))
        result["prosqa"]["command"] = command
        result["prosqa"]["date"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    logger.info("wrote %s", out)
    rows = {"1 (ADLM)": result["results"]["adlm_k1"], **result["results"]["tadm"]}
    print(json.dumps({k: {kk: (round(vv, 3) if isinstance(vv, float) else vv) for kk, vv in v.items()
                          if kk in ("tokens_per_s", "speedup_vs_k1", "ppl", "ppl_rel_change", "agreement_with_k1",
                                    "layer_calls", "layer_calls_formula", "accuracy", "accuracy_ci95")}
                      for k, v in rows.items()}, indent=1))
    return 0


def wikitext_phase(args, command: str) -> dict:
    """Train (or reuse) the WikiText ADLM/TADM and measure speed, layer calls and ppl per K."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from anchored_reasoning.objectives_tadm import stale_perplexity_bound
    from anchored_reasoning.sampling import SamplerConfig
    from anchored_reasoning.train.pipelines.diffusion import data_path
    from anchored_reasoning.train.pipelines.tadm import text_blocks

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
        "machine": machine_info(note="shared 2-core CPU; other jobs may run at the same time, so absolute tokens/s are noisy"),
        "command": command,
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
    return result


if __name__ == "__main__":
    raise SystemExit(main())
