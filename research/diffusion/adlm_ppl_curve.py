"""ADLM / MDLM perplexity ratio as a curve over training size, at equal tokens and at equal FLOPs.

    OMP_NUM_THREADS=1 ANCHORED_REASONING_DATA=../shared/data python -m research.diffusion.adlm_ppl_curve \\
        --sizes 0.5 1.25 2.5 5 10 --seeds 0 1 2 --threads 1 --work-dir runs/ppl_curve

The setup of ``adlm_vs_mdlm.py``'s perplexity part (same tokenizer, data, widths, loss, learning
rate, NELBO bound on WikiText-2 test with fixed noise draws), stretched into a curve. The learning
rate is constant after warm-up, so one run scored at several steps *is* a run of each of those
lengths: per seed, one ADLM run to the largest size, scored after ``--sizes`` million training
tokens, and one MDLM run to ``r`` x that (``r`` = ADLM's training FLOPs per token over MDLM's,
counted from the layer shapes), scored at every size (equal tokens) and at every size x ``r``
(equal FLOPs). The training file (WikiText-2 *valid*, ~0.4M tokens) is repeated: 10M tokens is ~24
epochs of it -- masked diffusion is known to keep improving over many epochs of repeated data, and
the test split is a different one, so the curve says when repetition stops paying.

The trend: least squares of log(ratio) on log(tokens) over every seed's points (slope and its 95%
interval), and -- only when that slope is negative beyond noise -- the training size where the
fitted line crosses 0.92 (the paper: 0.89-0.91 at 33B+ tokens), flagged as an extrapolation when it
lies beyond the largest size trained. Rerunning a finished command retrains nothing and rewrites
the summary and the plot.

Checkpoints are saved at every scored step; a killed run resumes from its last one with the scores
it had (rerun the same command). Writes ``research/diffusion/results/adlm_ppl_curve.json`` and ``.png``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import adlm_vs_mdlm as base  # (the shared setup: data, models, trainer arguments)
from anchored_reasoning.machine import machine_info

log = logging.getLogger("adlm_ppl_curve")
GOAL = 0.92


def steps_for(size_m: float, tokens_per_step: int) -> int:
    return max(1, int(round(size_m * 1e6 / tokens_per_step)))


def train_scored(arch: str, seed: int, max_steps: int, at: list[int], tok, rows, test_x, args, work: Path) -> dict[str, Any]:
    """Train one model to ``max_steps``, scoring (and checkpointing) at each step of ``at``; resumable."""
    from transformers import TrainerCallback

    from anchored_reasoning.train.checkpointing import newest_good_checkpoint
    from anchored_reasoning.train.trainers.diffusion_trainer import DiffusionCollator, DiffusionSFTTrainer

    run_dir = work / f"{arch}-{seed}"
    progress = run_dir / "scores.json"
    done = json.loads(progress.read_text()) if progress.is_file() else {"scores": {}, "seconds": {}}
    if all(str(s) in done["scores"] for s in at):
        return done
    model = base.build(arch, tok, args, seed, args.seq_len)
    cb = base.eval_callback(model, at, test_x, args.t_samples)
    cb.scores = {int(k): v for k, v in done["scores"].items()}

    class Keep(TrainerCallback):  # save the model with its score, so a rerun resumes from here
        def on_step_end(self, a, state, control, **kw):
            if state.global_step in cb.at:
                control.should_save = True
                done["scores"][str(state.global_step)] = cb.scores[state.global_step]
                done["seconds"][str(state.global_step)] = round(cb.seconds[state.global_step] + done.get("offset", 0.0), 2)
                run_dir.mkdir(parents=True, exist_ok=True)
                progress.write_text(json.dumps(done, indent=1))
            return control

    targs = base.make_args(run_dir, seed, max_steps, anchored=arch == "adlm", mode="pretrain", args=args, lr=args.lr,
                           batch=args.batch_size)
    targs.save_strategy, targs.save_total_limit = "steps", 1
    targs.save_steps = max_steps + 1  # saves happen only where Keep asks for them
    trainer = DiffusionSFTTrainer(model=model, args=targs, train_dataset=rows, data_collator=DiffusionCollator.for_tokenizer(tok),
                                  processing_class=tok, callbacks=[cb, Keep()])
    resume, skipped = newest_good_checkpoint(run_dir)  # a checkpoint half-written by a kill is moved aside
    for line in skipped:
        log.warning("%s seed %d: %s", arch, seed, line)
    if resume is not None:
        done["offset"] = max((v for v in done["seconds"].values()), default=0.0)
        log.info("%s seed %d: resuming from %s", arch, seed, resume.name)
    log.info("%s seed %d: training to step %d, scoring at %s", arch, seed, max_steps, at)
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    return done


def fit_trend(points: list[tuple[float, float]]) -> dict[str, Any]:
    """log(ratio) = a + b log(tokens) by least squares; b's 95% interval (t, n-2 dof); where it meets GOAL."""
    from scipy import stats

    xs, ys = [math.log(t) for t, _ in points], [math.log(r) for _, r in points]
    fit = stats.linregress(xs, ys)
    half = stats.t.ppf(0.975, len(xs) - 2) * fit.stderr if len(xs) > 2 else float("nan")
    falls, rises = fit.slope + half < 0, fit.slope - half > 0
    # a crossing is read off the line only when the line has a downward slope beyond noise
    cross = math.exp((math.log(GOAL) - fit.intercept) / fit.slope) if falls else None
    return {"intercept": fit.intercept, "slope_per_log_token": fit.slope, "slope_ci95": [fit.slope - half, fit.slope + half],
            "p_slope": fit.pvalue, "points": len(points), "tokens_at_goal": cross,
            "extrapolated": cross is not None and cross > max(t for t, _ in points),
            "reading": "the ratio falls with size" if falls else "the ratio rises with size" if rises else "no trend beyond noise"}


def t_interval(xs: list[float]) -> list[float] | None:
    """95% t-interval of the mean over seeds (None for a single seed)."""
    from scipy import stats

    if len(xs) < 2:
        return None
    m, se = sum(xs) / len(xs), stats.sem(xs)
    half = stats.t.ppf(0.975, len(xs) - 1) * se
    return [m - half, m + half]


def summarize(result: dict[str, Any]) -> None:
    sizes = result["setup"]["sizes_million_tokens"]
    rows, eq_tok, eq_flops = [], [], []
    for i, size in enumerate(sizes):
        per = [s["points"][i] for s in result["per_seed"] if len(s["points"]) > i]
        if not per:
            continue
        ratio = [p["ratio"] for p in per]
        ratio_f = [p["ratio_equal_flops"] for p in per]
        eq_tok += [(size * 1e6, r) for r in ratio]
        eq_flops += [(size * 1e6, r) for r in ratio_f]
        rows.append({"million_tokens": size, "seeds": len(per),
                     "ppl_mdlm": base.mean([p["ppl_mdlm"] for p in per]), "ppl_adlm": base.mean([p["ppl_adlm"] for p in per]),
                     "ppl_mdlm_equal_flops": base.mean([p["ppl_mdlm_equal_flops"] for p in per]),
                     "ratio": base.mean(ratio), "ratio_ci95": t_interval(ratio),
                     "ratio_equal_flops": base.mean(ratio_f),
                     "ratio_equal_flops_ci95": t_interval(ratio_f)})
    result["curve"] = rows
    result["trend"] = {"equal_tokens": fit_trend(eq_tok) if len({t for t, _ in eq_tok}) > 2 else None,
                       "equal_flops": fit_trend(eq_flops) if len({t for t, _ in eq_flops}) > 2 else None}
    result["goal"] = {"target": f"ratio <= {GOAL} (paper: 0.89-0.91 at 33B+ tokens)",
                      "met_at_any_size": any(r["ratio"] <= GOAL for r in rows)}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["curve"]
    xs = [r["million_tokens"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(xs, [r["ppl_mdlm"] for r in rows], marker="o", label="MDLM (equal tokens)")
    ax1.plot(xs, [r["ppl_mdlm_equal_flops"] for r in rows], marker="s", linestyle=":", label="MDLM (equal FLOPs)")
    ax1.plot(xs, [r["ppl_adlm"] for r in rows], marker="o", label="ADLM")
    ax1.set(xscale="log", xlabel="ADLM training tokens (millions)", ylabel="test perplexity bound", title="WikiText-2 test")
    ax1.legend(fontsize=8)
    for key, label, marker in (("ratio", "equal tokens", "o"), ("ratio_equal_flops", "equal FLOPs", "s")):
        ys = [r[key] for r in rows]
        lo = [r[key] - r[key + "_ci95"][0] if r[key + "_ci95"] else 0 for r in rows]
        hi = [r[key + "_ci95"][1] - r[key] if r[key + "_ci95"] else 0 for r in rows]
        ax2.errorbar(xs, ys, yerr=[lo, hi], marker=marker, capsize=3, label=label)
    for e in result["per_seed"]:  # each seed's own curve: where its loss drops shows here
        ax2.plot([q["million_tokens"] for q in e["points"]], [q["ratio"] for q in e["points"]], color="C0", alpha=0.3,
                 linewidth=0.8, label=f"seed {e['seed']} (equal tokens)" if e is result["per_seed"][0] else None)
    for name, trend in (result.get("trend") or {}).items():
        if trend:
            fx = [min(xs), max(xs)]
            ax2.plot(fx, [math.exp(trend["intercept"] + trend["slope_per_log_token"] * math.log(x * 1e6)) for x in fx],
                     linestyle="--", linewidth=1, color="grey")
    ax2.axhline(GOAL, color="red", linestyle="--", linewidth=1, label=f"goal {GOAL}")
    ax2.axhline(1.0, color="black", linewidth=0.5)
    ax2.set(xscale="log", xlabel="ADLM training tokens (millions)", ylabel="ADLM / MDLM perplexity (95% CI over seeds)",
            title="ratio and fitted trend")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=float, nargs="+", default=[0.5, 1.25, 2.5, 5.0, 10.0], help="million training tokens")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    base.add_ppl_arguments(ap, t_samples=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work-dir", default="runs/ppl_curve")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "adlm_ppl_curve.json"))
    args = ap.parse_args(argv)
    if args.layers < 2:
        ap.error("--layers must be >= 2 (ADLM's denoiser has half the depth)")
    if sorted(args.sizes) != args.sizes or len(set(args.sizes)) != len(args.sizes):
        ap.error(f"--sizes must be increasing and distinct, got {args.sizes}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("transformers", "datasets", "anchored_reasoning.train.data.diffusion_data"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    import torch

    torch.set_num_threads(args.threads)
    work, out, t0 = Path(args.work_dir), Path(args.out), time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    tok, rows, test_x, n_train, _ = base.ppl_data(args, work)
    r = base.flops_ratio(base.build("mdlm", tok, args, 0, args.seq_len), base.build("adlm", tok, args, 0, args.seq_len),
                         args.seq_len)
    tps = args.batch_size * args.seq_len
    steps = [steps_for(s, tps) for s in args.sizes]
    flops_steps = [int(round(s * r)) for s in steps]
    result: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine_info(),
        "command": "python -m research.diffusion.adlm_ppl_curve " + " ".join(sys.argv[1:] if argv is None else argv),
        "setup": {"sizes_million_tokens": args.sizes, "adlm_steps": steps, "mdlm_steps_equal_flops": flops_steps,
                  "flops_ratio_adlm_over_mdlm": r, "tokens_per_step": tps, "train_tokens_available": n_train,
                  "epochs_at_largest": steps[-1] * tps / n_train, "width": args.width, "layers": args.layers,
                  "learning_rate": args.lr, "schedule": "constant after warm-up", "t_samples": args.t_samples,
                  "test_tokens_scored": int(test_x.numel()), "train_file": args.train_file, "test_file": args.test_file,
                  "threads": args.threads},
        "per_seed": [],
    }
    for seed in args.seeds:
        m = train_scored("mdlm", seed, flops_steps[-1], sorted(set(steps + flops_steps)), tok, rows, test_x, args, work)
        a = train_scored("adlm", seed, steps[-1], steps, tok, rows, test_x, args, work)
        ms, as_ = m["scores"], a["scores"]
        points = [{"million_tokens": size, "ppl_mdlm": ms[str(s)], "ppl_adlm": as_[str(s)], "ppl_mdlm_equal_flops": ms[str(f)],
                   "ratio": as_[str(s)] / ms[str(s)], "ratio_equal_flops": as_[str(s)] / ms[str(f)],
                   "train_seconds_mdlm": m["seconds"][str(s)], "train_seconds_adlm": a["seconds"][str(s)]}
                  for size, s, f in zip(args.sizes, steps, flops_steps)]
        result["per_seed"].append({"seed": seed, "points": points, "train_seconds": {
            "mdlm": m["seconds"][str(flops_steps[-1])], "adlm": a["seconds"][str(steps[-1])]}})
        summarize(result)
        result["train_seconds_total"] = round(sum(sum(e["train_seconds"].values()) for e in result["per_seed"]), 1)
        result["wall_seconds_this_invocation"] = round(time.perf_counter() - t0, 1)  # a rerun that trains nothing: seconds
        base.write(out, result)
        plot(result, out.with_suffix(".png"))
        log.info("seed %d: %s", seed, [(p["million_tokens"], round(p["ratio"], 3), round(p["ratio_equal_flops"], 3)) for p in points])
    print(json.dumps({"curve": result["curve"], "trend": result["trend"]}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
