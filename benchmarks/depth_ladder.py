"""The depth ladder: accuracy vs reasoning depth for every method, on problems without shortcuts.

    python -m benchmarks.depth_ladder --hops 1 2 3 4 --seeds 0 1 2 --train-steps 1500 --threads 1
    python -m benchmarks.depth_ladder --methods cot nocot --seeds 0 --train-steps 300    # a slice
    python -m benchmarks.depth_ladder --trace dfs --backbone logic-gpt2-search --lr 3e-4 --train-steps 600 \
        --seeds 0 --out benchmarks/results/depth_ladder_search.json        # on the written search

Each run fine-tunes the backbone (default: the shipped ``logic-gpt2-shift``) with one method on an equal
mixture of generated ProsQA problems at every depth of ``--hops`` (the ladder sizes of
:func:`anchored_reasoning.generators.prosqa.ladder_size`: exactly h hops, the wrong option as deep
as the right one, every surface rule <= 0.55), then evaluates it greedily through the evaluation
runner on held-out problems per depth and under the binding probe (the same problems asked about
the other entity), and reads each derivation back against the problem's graph (``chains``: the
right chain, a made-up step -- the lookup failed --, or real steps down a wrong branch -- the
search failed; :func:`anchored_reasoning.eval.probes.chain_check`). Methods (the paper's and its
hidden ablations):

    nocot             question -> answer
    cot               question -> steps -> answer
    pause             k [PAUSE] slots, then the answer (no curriculum: pause tokens)
    pause_as_thought  pause with ACoT's exact curriculum (a slot more and a step fewer per stage)
    acot              [ANT] slots with the anchor loss + ACoT's curriculum (steps removed: the ProsQA schedule)
    acot_keep         ACoT without step removal (slots grow, the steps stay)
    stepwise          stepwise CoT removal (iCoT-style), no slots
    coconut           Coconut's continuous thoughts: stage s replaces s steps by s thoughts (the last hidden state
                      fed back), one thought per step up to k, on the same fraction schedule as ACoT
    anchor_chain      the anchors decoded as a terse chain ("Tom terpus lempus"), then the answer (not the
                      paper's ACoT: its slots are never decoded; research/ladder/acot_slots.py says why it matters)
    anchor_walk       anchor_chain with the node each step arrives at, so a written search's back-ups stay
                      ("Rex rempus impus rempus lempus"): with ``--trace dfs``, the search in anchors only
    anchor_walk_back  anchor_walk with each back-up marked ("Rex rempus impus Back rempus lempus")
    anchor_walk_back_token
                      the same with the one added token [Back] ("Rex rempus impus[Back] rempus lempus")

``--trace dfs`` trains every method on the depth-first search from the asked entity instead of the proof
(``generators.traces``; steps joined by a space, as the search backbone was pretrained), and reads each
run's searches back step by step (``eval.search_probe``: legal to the answer, first error) instead of walks.
Every run has the same number of optimizer steps (``--train-steps``, equal examples); the training
loss curve of every run is kept in the JSON, so whether a run converged can be read off it.
Writes ``benchmarks/results/depth_ladder.json`` (merged under a lock: one process per core can run
disjoint slices at once) and ``depth_ladder.png``. Finished runs are reused and killed ones resume: rerun
the same command; a work folder holding a run with other settings is refused with the keys that differ,
and so is a JSON of another budget (steps, lr, batch, generation budget: a method trained longer goes to
its own ``--out``; ``research/ladder/ladder_pairs.py`` pairs it with this ladder's methods).
``goals`` holds the paired comparisons per depth (CoT - No-CoT, anchor_chain / anchor_walk - CoT, the paper's hidden
ablations: ACoT - pause_as_thought, ACoT - acot_keep, ACoT - stepwise, pause_as_thought - pause) and the
issue's goal check; ``--regoal`` recomputes them and the plot from the kept runs without training
(the held-out problems' hop counts are kept in the JSON as ``_held_out_hops``).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from anchored_reasoning.machine import machine_info

ROOT = Path(__file__).resolve().parents[1]

log = logging.getLogger("depth_ladder")

K = 4  # slots: one per step of the deepest default rung
#: label -> (method name, options, curriculum)
METHODS: dict[str, tuple[str, dict[str, Any], bool]] = {
    "nocot": ("nocot", {}, False),
    "cot": ("cot", {}, False),
    "pause": ("pause", {"k": K, "remove_steps_per_stage": 1}, False),
    "pause_as_thought": ("pause", {"k": K, "remove_steps_per_stage": 1}, True),
    "acot": ("acot", {"k": K, "remove_steps_per_stage": 1}, True),
    "acot_keep": ("acot", {"k": K}, True),
    "stepwise": ("stepwise", {"stages": K, "remove_steps_per_stage": 1}, True),
    "anchor_chain": ("anchor_chain", {}, False),
    "coconut": ("coconut", {"max_latent_stage": K, "c": 1}, True),
    # the chain with a search's back-ups kept (one node per step): the written search's anchors
    "anchor_walk": ("anchor_chain", {"revisits": True}, False),
    # the same walk with each back-up marked by the word the dfs trace backs up with
    "anchor_walk_back": ("anchor_chain", {"revisits": True, "mark_backups": True}, False),
    # ... or by one added token, one token a back-up on any tokenizer
    "anchor_walk_back_token": ("anchor_chain", {"revisits": True, "mark_backups": True, "backup_marker": "token"}, False),
}
#: (a, b) pairs compared per depth in ``goals["ablations"]``
ABLATIONS = (("acot", "pause_as_thought"), ("acot", "acot_keep"), ("acot", "stepwise"), ("pause_as_thought", "pause"),
             ("coconut", "acot"), ("coconut", "pause"), ("coconut", "pause_as_thought"), ("coconut", "stepwise"),
             ("coconut", "nocot"), ("anchor_chain", "coconut"))
#: generation budget by trace: the longest 4-hop proof is ~60 tokens in the backbone's tokenizer; a written
#: depth-first search with its back-ups runs to ~150 at 4 hops
MAX_NEW_TOKENS = {"forward": 96, "dfs": 192}
#: what joins a trace's steps by default: the committed forward ladders put steps on lines; the search is
#: written as in ``logic-gpt2-search``'s pretraining documents (and the demo), steps joined by a space
STEP_SEPARATOR = {"forward": "\n", "dfs": " "}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hops", nargs="+", type=int, default=[1, 2, 3, 4])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--train-steps", type=int, default=1500)
    p.add_argument("--train-n", type=int, default=24000, help="generated training problems (equal shares per depth)")
    p.add_argument("--eval-n", type=int, default=100, help="held-out problems per depth")
    p.add_argument("--backbone", default="logic-gpt2-shift")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tokens-per-anchor", type=int, default=1,
                   help="slot tokens per anchor for the slot methods (pause*, acot*): 1 is the paper's GPT-2 setting; "
                        "on a tokenizer that splits the anchors (SmolLM2: up to 4 tokens) give their longest length")
    p.add_argument("--min-steps-per-stage", type=int, default=None,
                   help="curriculum floor per stage (default: the trainer's); a run too short for it is refused")
    p.add_argument("--trace", default="forward", choices=sorted(MAX_NEW_TOKENS),
                   help="how the training problems' reasoning is written: the dataset's proof (forward, the committed "
                        "ladders) or the depth-first search from the asked entity (dfs, with --backbone logic-gpt2-search)")
    p.add_argument("--step-separator", default=None, choices=["newline", "space"],
                   help="what joins the trace's steps (default: newline for forward, space for dfs)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="generation budget (default: 96 forward, 192 dfs)")
    p.add_argument("--work", default="runs/depth_ladder")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "depth_ladder.json"))
    p.add_argument("--machine-note", default=None)
    p.add_argument("--regoal", action="store_true",
                   help="train nothing: recompute the goals and the plot of --out from its kept runs (its setup's problems)")
    args = p.parse_args(argv)
    args.step_separator = ({"newline": "\n", "space": " "}[args.step_separator] if args.step_separator
                           else STEP_SEPARATOR[args.trace])
    args.max_new_tokens = args.max_new_tokens or MAX_NEW_TOKENS[args.trace]
    return args


def run_one(label: str, seed: int, train: list, held: list, swapped: list, hops: dict[str, int], args) -> dict[str, Any]:
    from anchored_reasoning import demo
    from anchored_reasoning.eval.probes import chain_summary
    from anchored_reasoning.eval.records import load_records
    from anchored_reasoning.train.pipelines import ar

    name, options, curriculum = METHODS[label]
    run_dir = Path(args.work) / label / f"seed{seed}"
    ckpt = run_dir / "model"
    settings = demo.DemoSettings(seed=seed, backbone=demo.parse_backbone(args.backbone), learning_rate=args.lr,
                                 batch_size=args.batch_size, trace=args.trace, step_separator=args.step_separator)
    if "k" in options and args.tokens_per_anchor != 1:  # the slot methods: whole anchors, equal slots
        options = {**options, "tokens_per_anchor": args.tokens_per_anchor}
    recipe = demo.method_recipe(name, settings, None, ckpt, 0.0, options=options)
    recipe["training"].update(max_steps=args.train_steps, max_train_seconds=None, curriculum=curriculum,
                              max_length=512)
    if args.min_steps_per_stage is not None:
        recipe["training"]["curriculum_min_steps_per_stage"] = args.min_steps_per_stage
    # Always through the trainer: a finished run with this recipe returns at once, a killed one resumes,
    # and a folder holding a run with other settings is refused with the keys that differ.
    ar.run_with_examples(recipe, train, [])
    summary = json.loads((ckpt / "train_summary.json").read_text())
    ev = demo.evaluate(str(ckpt), held, run_dir / "eval_generated", args.max_new_tokens, hops=hops)
    pr = demo.probe(str(ckpt), swapped, run_dir, args.max_new_tokens, hops)
    records = load_records(ev["records"])
    # the written steps read back against each graph: a proof as a walk, a search replayed step by step (a
    # chain with revisits node by node, as prosqa_real reads one)
    if args.trace == "dfs":
        read_back = {"search": searches(records, held, hops, "walk" if options.get("revisits") else "dfs")}
    else:
        read_back = {"chains": chain_summary(records, held, hops)}
    return {
        "seed": seed, "steps": summary["global_steps"], "train_seconds": summary["train_seconds"],
        "stages": [summary["final_stage"], summary["stages_planned"]],
        "loss_curve": [[h["step"], round(h["lm_loss"], 4)] for h in summary["log_history"] if "lm_loss" in h],
        "accuracy": ev["accuracy"], "by_hops": ev["by_hops"], "tokens": ev["mean_generated_tokens"],
        "tokens_by_hops": _tokens_by_hops(records, hops), "no_answer": ev["no_answer"],
        "flip_rate": pr["flip_rate"]["mean"], "swap_accuracy": pr["swap_accuracy"]["mean"],
        "probe_by_hops": {h: {"flip_rate": v["flip_rate"]["mean"]} for h, v in pr["by_hops"].items()},
        **read_back,
        "_correct": {r["id"]: bool(r["correct"]) for r in records},
    }


def searches(records: list[dict[str, Any]], held: list, hops: dict[str, int], form: str = "dfs") -> dict[str, Any]:
    """A dfs run's searches (written in ``form``: ``eval.search_probe.FORMS``) replayed per depth: the share
    that reached the answer by legal steps, that were exact, and whose answer names where the search ended."""
    from anchored_reasoning.eval.search_probe import search_summary

    out = {}
    for h in sorted({hops[ex.id] for ex in held}):
        s = search_summary(records, [ex for ex in held if hops[ex.id] == h], form)
        n = max(1, s["n"])
        out[str(h)] = {"n": s["n"], "legal_to_answer": s["reached_answer"] / n, "exact": s["exact"] / n,
                       "answer_follows_search": s["answer_follows_search"] / max(1, s["reached_answer"]),
                       "first_error": s["first_error"]}
    return out


def _tokens_by_hops(records: list[dict[str, Any]], hops: dict[str, int]) -> dict[str, float]:
    from collections import defaultdict

    acc: dict[int, list[int]] = defaultdict(list)
    for r in records:
        if r["id"] in hops:
            acc[hops[r["id"]]].append(r["tokens"])
    return {str(h): sum(v) / len(v) for h, v in sorted(acc.items())}


def aggregate(runs: list[dict[str, Any]], hops: dict[str, int]) -> dict[str, Any]:
    """Mean over seeds; 95% bootstrap interval over problems of the per-problem accuracy averaged over seeds."""
    from anchored_reasoning.eval.metrics import mean_ci, per_problem_over_seeds
    from anchored_reasoning.eval.probes import CHAIN_KINDS

    per_problem = per_problem_over_seeds([r["_correct"] for r in runs])
    ids = list(per_problem)
    by_hops = {}
    for h in sorted({hops[i] for i in ids}):
        ci = mean_ci([per_problem[i] for i in ids if hops[i] == h])
        by_hops[str(h)] = {"accuracy": ci["mean"], "ci95": [ci["ci_low"], ci["ci_high"]], "n": ci["n"],
                           "tokens": sum(r["tokens_by_hops"].get(str(h), 0) for r in runs) / len(runs),
                           "flip_rate": sum(r["probe_by_hops"].get(str(h), {}).get("flip_rate", 0) for r in runs) / len(runs),
                           # derivations read back against the graph: right chain / made-up step / wrong branch
                           "chains": {k: sum(r["chains"]["by_hops"][str(h)][k] for r in runs) / len(runs)
                                      for k in CHAIN_KINDS} if all("chains" in r for r in runs) else None,
                           **({"search_legal_to_answer": sum(r["search"][str(h)]["legal_to_answer"] for r in runs) / len(runs)}
                              if all("search" in r for r in runs) else {})}
    ci = mean_ci(list(per_problem.values()))
    return {"accuracy": ci["mean"], "ci95": [ci["ci_low"], ci["ci_high"]], "by_hops": by_hops,
            "tokens": sum(r["tokens"] for r in runs) / len(runs),
            "flip_rate": sum(r["flip_rate"] for r in runs) / len(runs),
            "seeds": [r["seed"] for r in runs],
            "per_seed": [{k: v for k, v in r.items() if k != "_correct"} for r in runs],
            "_per_problem": per_problem}


def paired(a: dict[str, Any], b: dict[str, Any], hops: dict[str, int], h: str) -> dict[str, Any]:
    """Paired bootstrap of the per-problem accuracy difference a - b on the problems of depth h."""
    from anchored_reasoning.eval.metrics import paired_bootstrap_diff

    ids = [i for i in a["_per_problem"] if str(hops.get(i)) == h and i in b["_per_problem"]]
    res = paired_bootstrap_diff([a["_per_problem"][i] for i in ids], [b["_per_problem"][i] for i in ids])
    return {"n": len(ids), **res}


def goals(results: dict[str, Any], hops: dict[str, int]) -> dict[str, Any]:
    """The issue's goal at the deepest depth any method learns (its CI above chance)."""
    depths = sorted({h for r in results.values() for h in r["by_hops"]}, key=int)
    learned = [h for h in depths if any(r["by_hops"].get(h, {}).get("ci95", [0])[0] > 0.5 for r in results.values())]
    # does emitting the steps pay where one pass is not enough? paired, per depth
    extra = {"cot_minus_nocot": {h: paired(results["cot"], results["nocot"], hops, h) for h in depths}} \
        if {"cot", "nocot"} <= set(results) else {}
    # the anchors decoded (anchor_chain, anchor_walk) against the full chain and against one pass, with the
    # token ratio
    for chain in (label for label, (method, _, _) in METHODS.items() if method == "anchor_chain"):
        for base in ("cot", "nocot"):
            if {chain, base} <= set(results):
                extra[f"{chain}_minus_{base}"] = {
                    h: {**paired(results[chain], results[base], hops, h),
                        "token_ratio": results[chain]["by_hops"][h]["tokens"] / results[base]["by_hops"][h]["tokens"]}
                    for h in depths}
    # the paper's hidden ablations, per depth: the anchors under ACoT's own curriculum (pause_as_thought),
    # step removal (acot_keep keeps the steps), slots at all (stepwise removes steps without them), and
    # ACoT's curriculum for plain pause tokens
    ablations = {f"{a}_minus_{b}": {h: paired(results[a], results[b], hops, h) for h in depths}
                 for a, b in ABLATIONS if {a, b} <= set(results)}
    if ablations:
        extra["ablations"] = ablations
    if not learned or not {"acot", "cot", "pause"} <= set(results):
        return {"deepest_learned": learned[-1] if learned else None, "checked": False, **extra}
    h = learned[-1]
    a, c, p = (results[m]["by_hops"][h] for m in ("acot", "cot", "pause"))
    return {
        "deepest_learned": h,
        "acot_ge_cot": a["accuracy"] >= c["accuracy"], "acot_tokens_le_third_of_cot": a["tokens"] <= c["tokens"] / 3,
        "acot_gt_pause": a["accuracy"] > p["accuracy"],
        "acot_minus_cot": paired(results["acot"], results["cot"], hops, h),
        "acot_minus_pause": paired(results["acot"], results["pause"], hops, h),
        "checked": True, **extra,
    }


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    for label, r in results.items():
        hs = sorted(r["by_hops"], key=int)
        xs = [int(h) for h in hs]
        ys = [r["by_hops"][h]["accuracy"] for h in hs]
        err = [[max(0, y - r["by_hops"][h]["ci95"][0]) for h, y in zip(hs, ys)],
               [max(0, r["by_hops"][h]["ci95"][1] - y) for h, y in zip(hs, ys)]]
        ax1.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label)
        ax2.plot(xs, [r["by_hops"][h]["tokens"] for h in hs], marker="o", label=label)
    ticks = sorted({int(h) for r in results.values() for h in r["by_hops"]})
    for ax in (ax1, ax2):
        ax.set_xticks(ticks)
    ax1.axhline(0.5, color="grey", linestyle="--", linewidth=1)
    ax1.set(xlabel="hops", ylabel="accuracy (95% CI)", ylim=(0, 1.05), title="held-out accuracy by depth")
    ax2.set(xlabel="hops", ylabel="mean generated tokens", title="tokens generated")
    ax1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ladder_problems(hops: list[int], eval_n: int, train_n: int, trace: str = "forward") -> tuple[list, list, dict[str, int]]:
    """(training problems, held-out problems, hops by held-out id): the same problems for every run and
    seed of the ladder (and for research/ladder/acot_slots.py, which reads the ladder's models); ``trace``
    writes the training problems' reasoning (the held-out problems are the same for every trace)."""
    from anchored_reasoning import demo
    from anchored_reasoning.eval.probes import hops_of

    # depth_ladder.json trains on the dataset's proof (the demo's default trace changed later)
    settings = demo.DemoSettings(seed=0, train_n=train_n, eval_n=eval_n * len(hops), hops=hops, trace=trace)
    train, held = demo.make_data(settings)
    return train, held, {ex.id: hops_of(ex) for ex in held}


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    import torch

    from anchored_reasoning.eval.probes import binding_probe_examples

    torch.set_num_threads(args.threads)
    t0 = time.monotonic()
    if args.regoal:
        old = json.loads(Path(args.out).read_text())
        hops = old.get("_held_out_hops")
        if not hops:  # a JSON from before 2026-12-03 (session 16): regenerate the problems to learn them
            setup = old["setup"]
            _, _, hops = ladder_problems(setup["hops"], setup["held_out_per_depth"], setup["train_problems"],
                                         setup.get("trace", "forward"))
        _write(Path(args.out), {}, {i: int(h) for i, h in hops.items()}, args, t0)
        return 0
    check_mergeable(Path(args.out), args.methods, args.seeds, args)  # before any training
    train, held, hops = ladder_problems(args.hops, args.eval_n, args.train_n, args.trace)
    swapped = binding_probe_examples(held)
    runs: dict[str, list] = {}
    for label in args.methods:
        for seed in args.seeds:
            r = run_one(label, seed, train, held, swapped, hops, args)
            log.info("%s seed %d: accuracy %.3f by hops %s, %.1f tokens, flips %.2f", label, seed, r["accuracy"],
                     {h: round(v["accuracy"], 2) for h, v in r["by_hops"].items()}, r["tokens"], r["flip_rate"])
            runs.setdefault(label, []).append(r)
        _write(Path(args.out), runs, hops, args, t0)
    return 0


#: setup keys two invocations must share to merge into one JSON: the same problems, backbone and trace, and
#: the same training and generation budget (a ladder compares methods at equal steps; a longer run of one
#: method goes to its own --out, and research/ladder/ladder_pairs.py compares across the two)
SAME_EXPERIMENT = ("hops", "train_problems", "held_out_per_depth", "backbone", "trace", "step_separator",
                   "train_steps_per_run", "batch_size", "lr", "k", "tokens_per_anchor", "min_steps_per_stage",
                   "max_new_tokens")


def setup_of(args) -> dict[str, Any]:
    """The JSON's ``setup``: what an invocation trained and evaluated with."""
    return {"hops": args.hops, "train_problems": args.train_n, "held_out_per_depth": args.eval_n,
            "train_steps_per_run": args.train_steps, "batch_size": args.batch_size, "lr": args.lr,
            "backbone": args.backbone, "k": K, "tokens_per_anchor": args.tokens_per_anchor,
            "min_steps_per_stage": args.min_steps_per_stage, "trace": args.trace,
            "step_separator": args.step_separator, "max_new_tokens": args.max_new_tokens,
            "methods": {k: list(v) for k, v in METHODS.items()}}


def check_mergeable(out: Path, labels: list[str], seeds: list[int], args=None) -> None:
    """A run of some seeds merges into the JSON's other seeds of the same method; that needs their
    per-problem records (``_runs``, kept since 2026-12-02), and the same problems, trace and backbone.
    Refuses, naming what differs, otherwise."""
    if not out.is_file():
        return
    old = json.loads(out.read_text())
    if args is not None and old.get("setup"):
        setup = {"trace": "forward", "step_separator": "\n", **old["setup"]}  # keys added later: their defaults then
        setup.setdefault("max_new_tokens", MAX_NEW_TOKENS[setup["trace"]])
        mine = setup_of(args)
        differ = {k: (setup.get(k), mine[k]) for k in SAME_EXPERIMENT if setup.get(k) != mine[k]}
        if differ:
            raise SystemExit(f"{out} holds a ladder with other settings ({', '.join(f'{k}: {a!r} there, {b!r} here' for k, (a, b) in differ.items())}); "
                             "write to another --out")
    runs = kept_runs(old)
    for label in labels:
        had = set((old.get("methods", {}).get(label) or {}).get("seeds", []))
        kept = {int(s) for s in runs.get(label, {})}
        lost = sorted(had - kept - set(seeds))
        if lost:
            raise SystemExit(f"{out}: {label} has seeds {lost} without their per-problem records, so seeds {seeds} "
                             f"cannot be merged with them; add {lost} to --seeds (their finished runs in --work are "
                             "reused) or write to another --out")


def kept_runs(old: dict[str, Any]) -> dict[str, dict[str, dict]]:
    """The per-seed runs a JSON keeps (``_runs``). A JSON written before ``_runs`` existed still holds a
    single-seed method's per-problem record whole: its ``_per_problem`` is that seed's 0/1 correctness, so
    the run is rebuilt from it and ``per_seed``; a method of several seeds kept only their average."""
    runs = {label: dict(r) for label, r in old.get("_runs", {}).items()}
    for label, entry in old.get("methods", {}).items():
        per_problem = old.get("_per_problem", {}).get(label, {})
        if label in runs or len(entry.get("per_seed", [])) != 1 or not per_problem:
            continue
        if any(v not in (0, 1) for v in per_problem.values()):
            continue
        run = {**entry["per_seed"][0], "_correct": {i: bool(v) for i, v in per_problem.items()}}
        runs[label] = {str(run["seed"]): run}
    return runs


def merge_runs(old: dict[str, dict], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs of one method by seed: the JSON's earlier seeds, replaced by this invocation's where both have one."""
    by_seed = {int(s): r for s, r in old.items()}
    by_seed.update({int(r["seed"]): r for r in new})
    return [by_seed[s] for s in sorted(by_seed)]


def _write(out: Path, runs: dict[str, list[dict[str, Any]]], hops: dict[str, int], args, t0: float) -> None:
    """Merge this invocation's runs into ``out`` (other methods and other seeds kept) and re-aggregate."""
    import fcntl

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        merged = json.loads(out.read_text()) if out.is_file() else {}
        methods = merged.setdefault("methods", {})
        hidden = merged.setdefault("_per_problem", {})
        kept = merged["_runs"] = kept_runs(merged)
        for label, new in runs.items():
            all_runs = merge_runs(kept.get(label, {}), new)
            kept[label] = {str(r["seed"]): r for r in all_runs}
            r = aggregate(all_runs, hops)
            hidden[label] = r.pop("_per_problem")
            methods[label] = r
        full = {lbl: {**m, "_per_problem": hidden.get(lbl, {})} for lbl, m in methods.items()}
        merged["goals"] = goals(full, hops)
        merged["chance"] = 0.5
        merged["_held_out_hops"] = hops  # what --regoal reads instead of regenerating the problems
        if runs:  # --regoal passes none: the runs' own setup, machine, date and commands stay as they were
            merged["setup"] = setup_of(args)
            merged["machine"] = machine_info(torch_threads=args.threads,
                                             **({"note": args.machine_note} if args.machine_note else {}))
            merged["date"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            merged.setdefault("commands", {})[" ".join(args.methods)] = "python -m benchmarks.depth_ladder " + " ".join(sys.argv[1:])
            merged.setdefault("wall_seconds", {})[" ".join(args.methods)] = round(time.monotonic() - t0, 1)
        out.write_text(json.dumps(merged, indent=1, default=str) + "\n")
    plot(methods, out.with_suffix(".png"))


if __name__ == "__main__":
    raise SystemExit(main())
