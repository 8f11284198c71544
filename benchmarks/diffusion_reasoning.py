"""MDLM vs ADLM vs TADM (anchor refreshed every K steps) on a reasoning task: held-out accuracy and tokens/s.

    # one process per seed, one thread each (a 2-core machine: two at a time)
    OMP_NUM_THREADS=1 python -m benchmarks.diffusion_reasoning run --seed 0 --workdir runs/diffusion_reasoning
    OMP_NUM_THREADS=1 python -m benchmarks.diffusion_reasoning run --seed 1 --workdir runs/diffusion_reasoning
    OMP_NUM_THREADS=1 python -m benchmarks.diffusion_reasoning run --seed 2 --workdir runs/diffusion_reasoning
    python -m benchmarks.diffusion_reasoning aggregate --workdir runs/diffusion_reasoning \\
        --out benchmarks/results/diffusion_reasoning.json

Per seed, ``run``:

1. builds two starts from ``logic-gpt2-shift`` with both shifts (its token shift copied; the output
   shift ``shift_logits``, so the AR-initialised head predicts position t from t-1's state as it was
   trained to): an **MDLM** (every weight copied) and an **ADLM** (the anchor network copied, the
   half-depth denoiser fresh, seeded) -- :func:`anchored_reasoning.models.ar_init.build_start`;
2. diffusion-SFTs both in the trained CoT format (derivation, then ``### answer``; a ``--window``-token
   EOS-padded response) on generated 1-hop ProsQA at the ladder size (8 nodes, the wrong option as deep
   as the right one), batch 32: the MDLM with the masked-diffusion loss, ``--sft-steps`` steps at
   ``--lr``; the ADLM with ANELBO (the path nodes as anchors), ``--adlm-steps`` at ``--adlm-lr`` (its
   denoiser starts fresh; at the MDLM's 300 steps it writes the format without it: 0.02-0.07);
3. post-trains two **TADMs**, each with its source frozen and only the fusion module trained (CE + KL to
   the source over stale-anchor rollouts; ``--post-steps`` steps on the same data): ``tadm`` from the
   ADLM (A = its anchor network, D = its denoiser) and ``tadm_m`` from the MDLM (S = its first
   ``--mdlm-shared-layers`` blocks, A = half the rest, D = the remainder: the paper's recipe for turning
   a trained model into a TADM, and the one whose source is above chance here);
4. evaluates every configuration on ``--n`` held-out problems (generator seed 4242, the same for every
   seed; questions seen in training removed) through the evaluation runner and the diffusion backend
   (low-confidence greedy, one model call per window token): MDLM; ADLM at K = 1; both TADMs at every K;
   each source reusing a stale anchor at every K > 1 with no fusion trained (``adlm_stale``,
   ``mdlm_stale``: what the fusion repairs). Passes are interleaved ``--repeats`` times so machine load
   hits every configuration alike; tokens/s is the median. A second group times block sampling
   (``--block`` tokens a block) without a KV cache and with Fast-dLLM's ``prefix`` and ``dual`` caches,
   for the MDLM and for ``tadm_m`` at K = 3 (both caches composed). A forced choice reads the lookup
   without decoding: only the first step's object masked, the two options' scores compared
   (:func:`anchored_reasoning.eval.choice.masked_choice`). A group already in ``result.json`` is not
   measured again (rerun the command to add a missing one).

A variant shares the trained stages and keeps its own results: ``--tag _a3 --mdlm-shared-layers 0
--mdlm-anchor-layers 3 --only mdlm: tadm_m: mdlm_stale:`` trains only the TADM with a 3-block A from the
same MDLM and measures that slice (``aggregate --tag _a3``).

``aggregate`` pools the seeds (the configurations every seed measured): per configuration the
seed-averaged accuracy with a bootstrap 95% interval over problems, per-seed accuracies, tokens/s and
the speed-up over ADLM at K = 1; paired tests (seed-averaged per-problem correctness, bootstrap; exact
McNemar per seed) for ADLM - MDLM, each TADM and stale source at K - its source at K = 1, each KV cache
- the same block sampler uncached (with its speed-up); and the issue's goal check for both TADMs (K = 3:
>= 1.5x the tokens/s of the source at K = 1 with accuracy within 1 point). Chance is 0.5 (two options;
an answer naming neither is wrong).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np
import torch

from anchored_reasoning.machine import machine_info
from benchmarks.common import timed_pass

logger = logging.getLogger("diffusion_reasoning")
CHANCE = 0.5
KS = (1, 2, 3, 4, 8)
EVAL_SEED = 4242  # the held-out problems' generator seed; SFT draws from the run seed (0, 1, 2)


def train_seed(args) -> dict[str, Path]:
    """Starts, SFT (MDLM, ADLM) and TADM post-training for one seed; every stage reused when present."""
    from anchored_reasoning.generators.prosqa import ladder_size
    from anchored_reasoning.models.ar_init import build_start
    from anchored_reasoning.models.zoo import resolve_model
    from anchored_reasoning.train.pipelines import diffusion as dtrain
    from anchored_reasoning.train.pipelines import tadm as ttrain

    work = Path(args.workdir) / f"seed{args.seed}"
    size = "{" + ", ".join(f"{k}: {v}" for k, v in ladder_size(args.hops).items()) + "}"
    data = [f"data.train.n={args.train_n}", f"data.train.seed={args.seed}", f"data.train.params={size}", "method.name=cot",
            f"training.response_length={args.window}", f"seed={args.seed}"]
    dirs = {}
    for arch in ("mdlm", "adlm"):
        start = work / f"start_{arch}"
        if not (start / "config.json").is_file():
            model, tok, copied = build_start(arch, "ar", init_from=resolve_model(args.init_from), shift_logits=True,
                                             seed=args.seed)
            model.save_pretrained(start)
            tok.save_pretrained(start)
            logger.info("%s start: %d tensors copied from %s", arch, copied, args.init_from)
        steps, lr = (args.sft_steps, args.lr) if arch == "mdlm" else (args.adlm_steps, args.adlm_lr)
        dirs[arch] = work / f"sft_{arch}_{steps}steps_lr{lr:g}"
        dtrain.run("diffusion_sft_prosqa_small_adlm", [  # resumes, or returns at once when finished
            f"output_dir={dirs[arch]}", f"model.arch={arch}", f"model.name={start}", f"model.tokenizer={start}",
            "model.preset=null", "model.config=null", "data.max_length=512", f"training.anchored={str(arch == 'adlm').lower()}",
            f"training.max_steps={steps}", f"training.learning_rate={lr}", *data])
    a_m = args.mdlm_anchor_layers
    for name, base, shared, a in (("tadm", "adlm", 0, None), ("tadm_m", "mdlm", args.mdlm_shared_layers, a_m)):
        dirs[name] = work / (f"tadm_from_{dirs[base].name}" + (f"_shared{shared}" if shared else "")
                             + (f"_anchor{a}" if a else ""))
        ttrain.run("tadm_posttrain_prosqa_small", [
            f"output_dir={dirs[name]}", f"model.base={dirs[base]}", f"model.shared_layers={shared}",
            *([f"model.anchor_layers={a}"] if a else []),
            f"training.max_steps={args.post_steps}", f"training.stale_sampling_steps={args.window}", "data.max_length=512", *data])
    return dirs


def held_out(args) -> list:
    from anchored_reasoning.generators.prosqa import generate_dataset, ladder_size

    # the same problems for every seed (paired across seeds), minus any question this seed trained on
    seen = {ex.question for ex in generate_dataset(args.train_n, seed=args.seed, **ladder_size(args.hops))}
    pool = generate_dataset(args.n * 2, seed=EVAL_SEED, split="held", **ladder_size(args.hops))
    held = [ex for ex in pool if ex.question not in seen][: args.n]
    if len(held) < args.n:
        raise RuntimeError(f"only {len(held)} held-out problems unseen in training; lower --n")
    return held


def evaluate(model, tok, method, examples, sampler: dict, out_dir: Path, args) -> tuple[dict, list[bool], float]:
    """:func:`timed_pass` with these sampler options (``anchor_refresh_every``, ``block_length``,
    ``kv_cache``); (summary, per-problem correctness in order, wall seconds)."""
    from anchored_reasoning.eval.records import load_records

    summary, secs = timed_pass(model, tok, method, examples, out_dir, gen_length=args.window,
                               batch_size=args.eval_batch, **sampler)
    by_id = {r["id"]: bool(r.get("correct")) for r in load_records(out_dir / "records.jsonl")}
    return summary, [by_id[ex.id] for ex in examples], secs


def groups(block: int) -> dict[str, dict[str, tuple[str, dict]]]:
    """The configurations, in groups timed side by side: name -> (model, sampler options).

    ``anchor``: MDLM, ADLM, TADM at every K, the stale ADLM at every K > 1 (one block, no KV cache).
    ``kv``: block sampling (``block`` tokens a block) without a KV cache, with Fast-dLLM's prefix and
    dual caches, for MDLM and for TADM at K = 3 (the two caches composed)."""
    anchor = {"mdlm:1": ("mdlm", {}), "adlm:1": ("adlm", {})}
    anchor.update({f"tadm:{k}": ("tadm", {"anchor_refresh_every": k}) for k in KS})
    anchor.update({f"adlm_stale:{k}": ("adlm", {"anchor_refresh_every": k}) for k in KS[1:]})
    anchor.update({f"tadm_m:{k}": ("tadm_m", {"anchor_refresh_every": k}) for k in KS})
    anchor.update({f"mdlm_stale:{k}": ("mdlm_split", {"anchor_refresh_every": k}) for k in KS[1:]})
    kv = {}
    for cache in ("none", "prefix", "dual"):
        kv[f"mdlm_block{block}:{cache}"] = ("mdlm", {"block_length": block, "kv_cache": cache})
        kv[f"tadm_m3_block{block}:{cache}"] = ("tadm_m", {"block_length": block, "kv_cache": cache, "anchor_refresh_every": 3})
    return {"anchor": anchor, "kv": kv}


def run_main(args) -> int:
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from anchored_reasoning.eval.choice import masked_choice
    from anchored_reasoning.eval.methods import build_method
    from anchored_reasoning.models import TADM

    torch.set_num_threads(args.threads)
    t0 = time.monotonic()
    dirs = train_seed(args)
    train_seconds = time.monotonic() - t0
    tok = AutoTokenizer.from_pretrained(dirs["adlm"])
    models = {name: AutoModelForMaskedLM.from_pretrained(d).eval() for name, d in dirs.items()}
    # the SFT'd MDLM split as its TADM is (S, A, D) with the fusion untrained (exactly the identity): reusing a
    # stale A with nothing to repair it, the contrast to the post-trained TADM
    models["mdlm_split"] = TADM.from_diffusion_model(models["mdlm"], shared_layers=args.mdlm_shared_layers,
                                                     anchor_layers=args.mdlm_anchor_layers).eval()
    method = build_method(None, str(dirs["adlm"]))
    held = held_out(args)
    out = Path(args.workdir) / f"seed{args.seed}" / f"result{args.tag}.json"
    result = json.loads(out.read_text()) if out.is_file() else {"rows": {}}
    if result.get("held_out_ids", [ex.id for ex in held]) != [ex.id for ex in held]:
        raise RuntimeError(f"{out} was measured on other problems; move it away to start over")
    evals = Path(args.workdir) / f"seed{args.seed}" / f"evals{args.tag}"
    positions = len(held) * args.window
    with torch.no_grad():
        for group, runs in groups(args.block).items():
            if args.only:  # a slice of the configurations (names starting with one of these)
                runs = {n: v for n, v in runs.items() if n.startswith(tuple(args.only))}
            if not runs or all(name in result["rows"] for name in runs):
                continue  # measured by an earlier run of this command
            rows: dict[str, dict] = {}
            times: dict[str, list[float]] = {name: [] for name in runs}
            for rep in range(args.repeats):  # interleaved, so load changes hit every configuration alike
                for name, (m, sampler) in runs.items():
                    summary, correct, secs = evaluate(models[m], tok, method, held, sampler,
                                                      evals / name.replace(":", "_"), args)
                    times[name].append(secs)
                    if name in rows and rows[name]["correct"] != correct:
                        raise RuntimeError(f"{name}: greedy answers changed between passes; generation is not deterministic")
                    rows[name] = {"group": group, "sampler": sampler, "accuracy": summary["accuracy"]["mean"],
                                  "ci95": [summary["accuracy"]["ci_low"], summary["accuracy"]["ci_high"]],
                                  "no_answer": summary["counts"]["no_answer"], "correct": correct}
                    logger.info("seed %d %s pass %d: accuracy %.3f, %.1fs", args.seed, name, rep + 1, rows[name]["accuracy"], secs)
            for name, row in rows.items():
                med = sorted(times[name])[len(times[name]) // 2]
                row.update({"seconds_median": round(med, 3), "tokens_per_s": positions / med})
            result["rows"].update(rows)
            out.write_text(json.dumps(result, indent=1) + "\n")  # a group measured is kept if a later one is killed
        if "forced_choice" not in result:
            result["forced_choice"] = {m: masked_choice(models[m], tok, held) for m in ("mdlm", "adlm")}
    summaries = {name: json.loads((d / "train_summary.json").read_text()) for name, d in dirs.items()}
    result.update({
        "seed": args.seed, "held_out_ids": [ex.id for ex in held],
        "budget": {name: {"steps": s["global_steps"], "train_seconds": s["train_seconds"]} for name, s in summaries.items()},
        "train_and_load_seconds": round(train_seconds, 1), "settings": vars(args), "command": "python -m benchmarks.diffusion_reasoning " + " ".join(sys.argv[1:]),
        "date": dt.date.today().isoformat(), "machine": machine_info(), "torch_threads": torch.get_num_threads(),
    })
    out.write_text(json.dumps(result, indent=1) + "\n")
    logger.info("wrote %s", out)
    return 0


def pooled(per_seed: list[list[bool]]) -> np.ndarray:
    """Per-problem correctness averaged over seeds (the unit a paired test resamples)."""
    return np.mean(np.asarray(per_seed, dtype=float), axis=0)


def speedup_of(results: list[dict], name: str, ref: str) -> float:
    """tokens/s of ``name`` over ``ref``'s, per seed (side by side in one process), then averaged."""
    return float(np.mean([r["rows"][name]["tokens_per_s"] / r["rows"][ref]["tokens_per_s"] for r in results]))


def paired_of(results: list[dict], a: str, b: str) -> dict:
    """a - b: bootstrap over problems of the seed-averaged correctness, and an exact McNemar per seed."""
    from anchored_reasoning.eval.compare import mcnemar_exact
    from anchored_reasoning.eval.metrics import paired_bootstrap_diff

    boot = paired_bootstrap_diff(pooled([r["rows"][a]["correct"] for r in results]),
                                 pooled([r["rows"][b]["correct"] for r in results]))
    mc = []
    for r in results:
        x, y = r["rows"][a]["correct"], r["rows"][b]["correct"]
        mc.append(mcnemar_exact(sum(p and not q for p, q in zip(x, y)), sum(q and not p for p, q in zip(x, y))))
    return {"a": a, "b": b, "diff": boot["diff"], "ci95": [boot["ci_low"], boot["ci_high"]], "mcnemar_p_per_seed": mc}


def aggregate(results: list[dict]) -> dict:
    from anchored_reasoning.eval.metrics import mean_ci

    ids = results[0]["held_out_ids"]
    if any(r["held_out_ids"] != ids for r in results):
        raise ValueError("seeds were evaluated on different problems; the paired tests need the same ones")
    names = [n for n in results[0]["rows"] if all(n in r["rows"] for r in results)]
    table = {}
    for name in names:
        per = [r["rows"][name] for r in results]
        acc = mean_ci(pooled([p["correct"] for p in per]))
        table[name] = {"accuracy": acc["mean"], "accuracy_ci95": [acc["ci_low"], acc["ci_high"]],
                       "per_seed": [p["accuracy"] for p in per], "no_answer_per_seed": [p["no_answer"] for p in per],
                       "tokens_per_s": float(np.mean([p["tokens_per_s"] for p in per])),
                       "vs_chance": "above" if acc["ci_low"] > CHANCE else "below" if acc["ci_high"] < CHANCE else "at"}

    for name, row in table.items():
        if "adlm:1" in table:  # (absent from a slice run with --only)
            row["speedup_vs_adlm_k1"] = speedup_of(results, name, "adlm:1")
        row["speedup_vs_mdlm_k1"] = speedup_of(results, name, "mdlm:1")  # the TADM from the MDLM: against its own source

    pairs = [("adlm:1", "mdlm:1"), ("tadm:1", "adlm:1")] + [(f"tadm:{k}", "adlm:1") for k in KS[1:]]
    pairs += [(f"adlm_stale:{k}", "adlm:1") for k in KS[1:]] + [(f"tadm_m:{k}", "mdlm:1") for k in KS]
    pairs += [(f"mdlm_stale:{k}", "mdlm:1") for k in KS[1:]]
    tests = [paired_of(results, a, b) for a, b in pairs if a in table and b in table]
    kv_names = [n for n in names if n.endswith(":none")]
    for base in kv_names:  # the KV-cache group: each cache against the same block sampler uncached
        stem = base[: -len(":none")]
        for cache in ("prefix", "dual"):
            if f"{stem}:{cache}" in table:
                tests.append(paired_of(results, f"{stem}:{cache}", base))
                table[f"{stem}:{cache}"]["speedup_vs_uncached"] = speedup_of(results, f"{stem}:{cache}", base)

    def goal_of(tadm: str, ref: str, speed_key: str) -> dict:
        t3 = next(t for t in tests if t["a"] == tadm and t["b"] == ref)
        speed3 = table[tadm][speed_key]
        return {"tadm": tadm, "reference": ref, "speedup": speed3, "accuracy_diff": t3["diff"], "accuracy_diff_ci95": t3["ci95"],
                "speed_met": speed3 >= 1.5, "accuracy_within_1_point": abs(t3["diff"]) <= 0.01,
                "reference_accuracy": table[ref]["accuracy"], "reference_vs_chance": table[ref]["vs_chance"]}

    goal = {"note": "the accuracy goal is a point estimate; its interval says what the data can rule out. A reference "
                    "at chance makes the accuracy part vacuous"}
    if "tadm:3" in table and "adlm:1" in table:
        goal["adlm_tadm"] = goal_of("tadm:3", "adlm:1", "speedup_vs_adlm_k1")
    if "tadm_m:3" in table:
        goal["mdlm_tadm"] = goal_of("tadm_m:3", "mdlm:1", "speedup_vs_mdlm_k1")
    blocks = [n for n in table if n.startswith("tadm_m3_block") and n.endswith(":none")]
    for name in blocks:  # the same with block sampling: the anchor is refreshed at each block's first call too
        ref = name.replace("tadm_m3_", "mdlm_")
        table[name]["speedup_vs_source"] = speedup_of(results, name, ref)
        tests.append(paired_of(results, name, ref))
        goal["mdlm_tadm_blocks"] = goal_of(name, ref, "speedup_vs_source")
    forced = {m: {"per_seed": [r["forced_choice"][m] for r in results],
                  "mean": float(np.mean([r["forced_choice"][m] for r in results]))} for m in ("mdlm", "adlm")}
    first = results[0]
    return {"what": __doc__.split("\n\n")[0], "seeds": [r["seed"] for r in results], "n_problems": len(ids),
            "chance": CHANCE, "table": table, "paired_tests": tests, "goal_check": goal, "forced_choice": forced,
            "budget_per_seed": [r["budget"] for r in results], "settings": first["settings"],
            "commands": [r["command"] for r in results], "dates": sorted({r["date"] for r in results}),
            "machine": first["machine"], "threads": "one 1-thread process per seed, two at a time on 2 cores"}


def add_run_args(r: argparse.ArgumentParser) -> None:
    """``run``'s options: what trains a seed's models and where (also read by anchor_refresh.py)."""
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--workdir", default="runs/diffusion_reasoning")
    r.add_argument("--init-from", default="logic-gpt2-shift")
    r.add_argument("--hops", type=int, default=1)
    r.add_argument("--train-n", type=int, default=20000)
    r.add_argument("--sft-steps", type=int, default=300, help="MDLM SFT steps")
    r.add_argument("--adlm-steps", type=int, default=1200,
                   help="ADLM SFT steps (its denoiser starts fresh: 300 steps leave it below chance)")
    r.add_argument("--adlm-lr", type=float, default=6e-4)
    r.add_argument("--post-steps", type=int, default=200)
    r.add_argument("--mdlm-shared-layers", type=int, default=1,
                   help="blocks S of the TADM built from the MDLM (A: half the rest, rounded up; D: the remainder)")
    r.add_argument("--mdlm-anchor-layers", type=int, default=None, help="blocks A of that TADM (default: half the rest)")
    r.add_argument("--tag", default="", help="a variant's suffix for result.json and evals/ (trained stages are shared)")
    r.add_argument("--only", nargs="+", default=None, metavar="PREFIX",
                   help="evaluate only the configurations whose names start with these (e.g. mdlm: tadm_m: mdlm_stale:)")
    r.add_argument("--lr", type=float, default=2e-4, help="MDLM SFT learning rate")
    r.add_argument("--window", type=int, default=16, help="response window = sampler steps")
    r.add_argument("--n", type=int, default=200, help="held-out problems")
    r.add_argument("--eval-batch", type=int, default=50)
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--block", type=int, default=4, help="block length of the KV-cache group")
    r.add_argument("--threads", type=int, default=1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    add_run_args(sub.add_parser("run", help="train and evaluate one seed"))
    g = sub.add_parser("aggregate", help="pool finished seeds into one JSON")
    g.add_argument("--workdir", default="runs/diffusion_reasoning")
    g.add_argument("--out", default="benchmarks/results/diffusion_reasoning.json")
    g.add_argument("--tag", default="", help="aggregate the seeds' result<TAG>.json")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if a.cmd == "run":
        return run_main(a)
    results = [json.loads(f.read_text()) for f in sorted(Path(a.workdir).glob(f"seed*/result{a.tag}.json"))]
    if not results:
        raise SystemExit(f"no finished seed under {a.workdir}")
    out = aggregate(results)
    header = f"{'configuration':22s} accuracy [95% CI]      speed-up vs ADLM / MDLM (K=1)  per seed"
    write_pooled(a.out, out, ("seeds", "goal_check"), header, lambda name, row: (
        f"{name:22s} {row['accuracy']:.3f} [{row['accuracy_ci95'][0]:.3f}, {row['accuracy_ci95'][1]:.3f}]  "
        f"{row.get('speedup_vs_adlm_k1', float('nan')):.2f}x / {row['speedup_vs_mdlm_k1']:.2f}x  {row['per_seed']}"))
    return 0


def write_pooled(path: str, out: dict, head: tuple[str, ...], header: str | None, line) -> None:
    """Write a pooled result, then print its ``head`` keys, ``header`` and one ``line(name, row)`` per table row."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in head}, indent=1))
    if header:
        print(header)
    for name, row in out["table"].items():
        print(line(name, row))


if __name__ == "__main__":
    raise SystemExit(main())
