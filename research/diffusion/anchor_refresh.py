"""Which steps deserve a fresh anchor: TADM's K-periodic refresh against the confidence-triggered one.

    # per seed, after benchmarks/diffusion_reasoning.py trained it (the same options pick the same models)
    OMP_NUM_THREADS=1 python -m research.diffusion.anchor_refresh run --seed 0 --workdir runs/diffusion_reasoning \\
        --tag _a3 --mdlm-shared-layers 0 --mdlm-anchor-layers 3
    python -m research.diffusion.anchor_refresh aggregate --workdir runs/diffusion_reasoning --tag _a3 \\
        --out research/diffusion/results/anchor_refresh_a3.json

Low-confidence decoding reveals the easy tokens of a response (format, padding) first and the decisive
ones (the looked-up entity, the answer) last, so a refresh every K steps spends most fresh anchors on
easy steps. ``anchor_refresh_below=tau`` (see ``anchored_reasoning/sampling/cache.py``) refreshes a row
when its next token's predicted probability is below tau, K staying the maximum staleness, and only
that row. Per seed, ``run``:

1. loads the TADM built from the MDLM (``tadm_m``) and its source, as trained by
   ``diffusion_reasoning.py run`` with the same options (nothing is trained again);
2. **chooses tau on validation problems** (generator seed 4343, none seen in training or among the
   held-out ones): every K-periodic refresh in ``--ks`` and every (K_max, tau) of ``--kmax`` x ``--taus``,
   one greedy pass each (accuracy and the share of rows x calls that ran the anchor network); the pick is
   the most accurate confidence setting whose share is at most K = ``--match-k``'s (ties: the cheaper);
3. **tests on the held-out problems** of diffusion_reasoning (generator seed 4242): the source MDLM, the
   TADM at K = 1 and K = ``--match-k``, and the pick, timed side by side over ``--repeats`` interleaved
   passes (median tokens/s).

``aggregate`` pools the seeds: accuracy with a bootstrap 95% interval over problems (seed-averaged
per-problem correctness), tokens/s ratios per seed, paired tests (bootstrap, exact McNemar per seed) of
the pick against TADM K = 1 and against K = ``--match-k``, and the issue-13 goal (>= 1.5x the tokens/s of
K = 1, accuracy within 1 point) for both. Chance is 0.5.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
from pathlib import Path

import torch

from benchmarks import diffusion_reasoning as dr
from anchored_reasoning.machine import machine_info

logger = logging.getLogger("anchor_refresh")
VALID_SEED = 4343


def validation(args, held: list) -> list:
    """``--n-valid`` problems of the same size, none seen in this seed's training or among the held-out ones."""
    from anchored_reasoning.generators.prosqa import generate_dataset, ladder_size

    size = ladder_size(args.hops)
    skip = {ex.question for ex in generate_dataset(args.train_n, seed=args.seed, **size)} | {ex.question for ex in held}
    pool = generate_dataset(args.n_valid * 2, seed=VALID_SEED, split="valid", **size)
    valid = [ex for ex in pool if ex.question not in skip][: args.n_valid]
    if len(valid) < args.n_valid:
        raise RuntimeError(f"only {len(valid)} validation problems unseen elsewhere; lower --n-valid")
    return valid


def share(summary: dict, model: str) -> float | None:
    """The anchor network's share of rows x calls: the cache's count, 1 for the TADM without a cache (it
    runs A at every call), None for the MDLM (no anchor network)."""
    frac = summary["anchor_refresh_fraction"]
    return frac if frac is not None else (1.0 if model == "tadm_m" else None)


def sweep_configs(args) -> dict[str, dict]:
    configs = {f"k{k}": {"anchor_refresh_every": k} for k in args.ks}
    configs.update({f"conf_k{k}_tau{t:g}": {"anchor_refresh_every": k, "anchor_refresh_below": t}
                    for k in args.kmax for t in args.taus})
    return configs


def pick(sweep: dict[str, dict], match: str) -> str:
    """The most accurate confidence setting at most as costly as ``match`` (ties: the cheaper, then the name)."""
    budget = sweep[match]["refresh_fraction"]
    fits = [(n, r) for n, r in sweep.items() if n.startswith("conf_") and r["refresh_fraction"] <= budget + 1e-9]
    if not fits:
        raise RuntimeError(f"no confidence setting is as cheap as {match} ({budget:.3f}); add larger K_max or smaller tau")
    return min(fits, key=lambda nr: (-nr[1]["accuracy"], nr[1]["refresh_fraction"], nr[0]))[0]


def run_main(args) -> int:
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from anchored_reasoning.eval.methods import build_method

    torch.set_num_threads(args.threads)
    dirs = dr.train_seed(args)  # every stage is present: this loads, it does not train
    tok = AutoTokenizer.from_pretrained(dirs["adlm"])
    models = {m: AutoModelForMaskedLM.from_pretrained(dirs[m]).eval() for m in ("mdlm", "tadm_m")}
    method = build_method(None, str(dirs["adlm"]))
    held = dr.held_out(args)
    valid = validation(args, held)
    work = Path(args.workdir) / f"seed{args.seed}"
    out = work / f"refresh{args.tag}.json"
    result = json.loads(out.read_text()) if out.is_file() else {}
    evals = work / f"refresh_evals{args.tag}"
    with torch.no_grad():
        sweep = result.get("sweep", {})
        for name, sampler in sweep_configs(args).items():
            if name in sweep:
                continue
            summary, correct, _ = dr.evaluate(models["tadm_m"], tok, method, valid, sampler, evals / f"valid_{name}", args)
            sweep[name] = {"sampler": sampler, "accuracy": summary["accuracy"]["mean"],
                           "refresh_fraction": share(summary, "tadm_m")}
            logger.info("seed %d valid %s: accuracy %.3f, anchor share %.3f", args.seed, name, sweep[name]["accuracy"],
                        sweep[name]["refresh_fraction"])
            result["sweep"] = sweep
            out.write_text(json.dumps(result, indent=1) + "\n")
        chosen = pick(sweep, f"k{args.match_k}")
        logger.info("seed %d: picked %s on validation", args.seed, chosen)
        tests = {"mdlm:1": ("mdlm", {}), "tadm_m:1": ("tadm_m", {}),
                 f"tadm_m:{args.match_k}": ("tadm_m", {"anchor_refresh_every": args.match_k}),
                 "tadm_m:picked": ("tadm_m", sweep[chosen]["sampler"])}
        if result.get("picked") != chosen or "rows" not in result:
            rows: dict[str, dict] = {}
            times: dict[str, list[float]] = {n: [] for n in tests}
            for rep in range(args.repeats):  # interleaved: machine load hits every configuration alike
                for name, (m, sampler) in tests.items():
                    summary, correct, secs = dr.evaluate(models[m], tok, method, held, sampler,
                                                         evals / name.replace(":", "_"), args)
                    times[name].append(secs)
                    if name in rows and rows[name]["correct"] != correct:
                        raise RuntimeError(f"{name}: greedy answers changed between passes")
                    rows[name] = {"sampler": sampler, "accuracy": summary["accuracy"]["mean"], "correct": correct,
                                  "no_answer": summary["counts"]["no_answer"],
                                  "refresh_fraction": share(summary, m)}
                    logger.info("seed %d test %s pass %d: accuracy %.3f, %.1fs", args.seed, name, rep + 1,
                                rows[name]["accuracy"], secs)
            for name, row in rows.items():
                med = sorted(times[name])[len(times[name]) // 2]
                row.update({"seconds_median": round(med, 3), "tokens_per_s": len(held) * args.window / med})
            result.update(rows=rows, picked=chosen)
    result.update(seed=args.seed, held_out_ids=[ex.id for ex in held], valid_ids=[ex.id for ex in valid],
                  models={m: str(dirs[m]) for m in ("mdlm", "tadm_m")}, settings=vars(args), command=" ".join(sys.argv),
                  date=dt.date.today().isoformat(), machine=machine_info())
    out.write_text(json.dumps(result, indent=1) + "\n")
    logger.info("wrote %s", out)
    return 0


def aggregate(results: list[dict], match_k: int, note: str | None = None) -> dict:
    from anchored_reasoning.eval.metrics import mean_ci

    ids = results[0]["held_out_ids"]
    if any(r["held_out_ids"] != ids for r in results):
        raise ValueError("seeds were tested on different problems; the paired tests need the same ones")
    names = list(results[0]["rows"])

    table = {}
    for name in names:
        per = [r["rows"][name] for r in results]
        acc = mean_ci(dr.pooled([p["correct"] for p in per]))
        table[name] = {"accuracy": acc["mean"], "accuracy_ci95": [acc["ci_low"], acc["ci_high"]],
                       "per_seed": [p["accuracy"] for p in per], "refresh_fraction_per_seed": [p["refresh_fraction"] for p in per],
                       "speedup_vs_tadm_k1": dr.speedup_of(results, name, "tadm_m:1"),
                       "speedup_vs_tadm_k1_per_seed": [dr.speedup_of([r], name, "tadm_m:1") for r in results],
                       "speedup_vs_mdlm": dr.speedup_of(results, name, "mdlm:1")}

    periodic = f"tadm_m:{match_k}"
    tests = [dr.paired_of(results, a, b) for a, b in
             (("tadm_m:picked", "tadm_m:1"), (periodic, "tadm_m:1"), ("tadm_m:picked", periodic), ("tadm_m:1", "mdlm:1"))]
    goal = {}
    for name in ("tadm_m:picked", periodic):
        t = next(t for t in tests if t["a"] == name and t["b"] == "tadm_m:1")
        goal[name] = {"speedup_vs_tadm_k1": table[name]["speedup_vs_tadm_k1"], "speedup_vs_mdlm": table[name]["speedup_vs_mdlm"],
                      "accuracy_diff": t["diff"], "accuracy_diff_ci95": t["ci95"],
                      "speed_met": table[name]["speedup_vs_tadm_k1"] >= 1.5, "accuracy_within_1_point": abs(t["diff"]) <= 0.01}
    sweep = {n: {"accuracy_per_seed": [r["sweep"][n]["accuracy"] for r in results],
                 "refresh_fraction_per_seed": [r["sweep"][n]["refresh_fraction"] for r in results]}
             for n in results[0]["sweep"] if all(n in r["sweep"] for r in results)}
    first = results[0]
    return {"what": __doc__.split("\n\n")[0], "seeds": [r["seed"] for r in results], "n_test": len(ids),
            "n_valid": len(first["valid_ids"]), "chance": dr.CHANCE, "picked_per_seed": [r["picked"] for r in results],
            "table": table, "paired_tests": tests, "goal_check": goal, "validation_sweep": sweep,
            "models_per_seed": [r["models"] for r in results], "settings": first["settings"],
            "commands": [r["command"] for r in results], "dates": sorted({r["date"] for r in results}),
            "machine": first["machine"], "threads": "one 1-thread process per seed", "timing_note": note}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="sweep on validation, then test, for one seed")
    dr.add_run_args(r)
    r.add_argument("--n-valid", type=int, default=200)
    r.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4], help="K-periodic settings swept (1: the reference)")
    r.add_argument("--kmax", type=int, nargs="+", default=[4, 8, 16], help="maximum staleness of the confidence policy")
    r.add_argument("--taus", type=float, nargs="+", default=[0.5, 0.7, 0.9, 0.95, 0.99])
    r.add_argument("--match-k", type=int, default=3, help="the pick may cost at most this K's anchor share")
    g = sub.add_parser("aggregate", help="pool finished seeds into one JSON")
    g.add_argument("--workdir", default="runs/diffusion_reasoning")
    g.add_argument("--tag", default="")
    g.add_argument("--match-k", type=int, default=3)
    g.add_argument("--out", default="research/diffusion/results/anchor_refresh.json")
    g.add_argument("--note", default=None, help="how the seeds were timed (what else ran), kept in the JSON")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if a.cmd == "run":
        return run_main(a)
    results = [json.loads(f.read_text()) for f in sorted(Path(a.workdir).glob(f"seed*/refresh{a.tag}.json"))]
    results = [r for r in results if "rows" in r]
    if not results:
        raise SystemExit(f"no finished seed under {a.workdir}")
    out = aggregate(results, a.match_k, a.note)
    dr.write_pooled(a.out, out, ("seeds", "picked_per_seed", "goal_check"), None, lambda name, row: (
        f"{name:16s} {row['accuracy']:.3f} [{row['accuracy_ci95'][0]:.3f}, {row['accuracy_ci95'][1]:.3f}]  "
        f"{row['speedup_vs_tadm_k1']:.2f}x vs TADM K=1  {row['speedup_vs_mdlm']:.2f}x vs MDLM  "
        f"anchor share {row['refresh_fraction_per_seed']}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
