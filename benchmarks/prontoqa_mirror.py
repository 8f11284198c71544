"""A method on ProntoQA problems without the one-look-up shortcut (``mirror_distractor``), at one depth.

    python -m benchmarks.prontoqa_mirror --method cot --hops 3 --train-steps 1000 --threads 1

The published ProntoQA construction (and the real split) is answered by "the property rule whose
concept is named elsewhere" (``generators/prontoqa_shortcuts.py``); mirrored problems are not, so
accuracy here above 0.5 needs the chain. Fine-tunes ``--backbone`` on ``--train-n`` generated mirrored
problems at ``--hops`` (seed 100), evaluates greedily on ``--eval-n`` held-out ones (seed 200, questions
seen in training dropped; the fine-tune and evaluation are ``benchmarks.common.run_one``'s, acot_vs_cot's protocol) and reads the written proofs
against the gold (``common.chain_report``; an ``anchor_chain`` model's bare chains with
``common.anchor_chain_report``).
The polarity probe asks each held-out problem again with its query negated (``eval.probes.
prontoqa_polarity_examples``: same facts and proof, answer flipped): ``polarity_probe.flip_rate`` is the share
of answers that follow (a model answering from the facts alone flips none).
``--eval-real N`` also grades the model on the real ProntoQA test (5 hops, shortcut open, ``real_test``);
``--train-hops 2 3 4 5`` trains on equal shares of several depths, evaluated at ``--hops``.
Writes ``benchmarks/results/prontoqa_mirror.json`` (one entry per method/hops/steps/seed; reruns resume), its
``summary``: per depth and budget, each method over its seeds and paired with CoT (``summarize``), and its
``curves``: one run graded after several budgets (``learning_curves``; ``--extend-from 1000 --train-steps 2000``
trains the finished 1,000-step run on, which with the constant learning rate is the 2,000-step run).
Two methods at the same depth are compared problem by problem (exact McNemar, paired bootstrap) from
their evaluation folders, e.g. ``anchored-reasoning compare <work>/h3_1000/prontoqa/cot/seed0/eval_test
<work>/h3_1000/prontoqa/nocot/seed0/eval_test`` (the held-out problems are the same for every method).
"""
from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import MAX_NEW_TOKENS, anchor_chain_report, chain_report, paired_with, run_one

ROOT = Path(__file__).resolve().parents[1]


def over_seeds(entries: list[dict[str, Any]], per_problem: dict[str, float]) -> dict[str, Any]:
    """One method's seeds: accuracy each, the seed-averaged per-problem accuracy with its 95% interval
    over problems, mean tokens."""
    from anchored_reasoning.eval.metrics import mean_ci

    ci = mean_ci(list(per_problem.values()))
    out = {"per_seed": [e["accuracy"] for e in entries], "accuracy": round(ci["mean"], 4),
           "ci95": [round(ci["ci_low"], 4), round(ci["ci_high"], 4)],
           "tokens": round(sum(e["tokens"] for e in entries) / len(entries), 2), "n": ci["n"]}
    return {"seeds": [e["seed"] for e in entries], **out}


def train_sources(hops: int, train_hops: list[int], train_n: int, standard: int = 0) -> list[dict[str, Any]]:
    """The training set as a recipe's ``data.train.mix`` (train/data/data_sources.py): ``train_n - standard``
    mirrored problems split evenly over ``train_hops`` (seed 100), then ``standard`` of the published
    construction at ``hops`` (seed 101; the real test's questions excluded). ``train/prontoqa_real_cpu.yaml``
    holds the same list. Each source is named as before mixes existed (ids ``mtrain-*`` at ``hops``,
    ``mtrain<h>-*`` at other depths, ``strain-*``), so work dirs made then still resume and extend."""
    mirrored = train_n - standard
    share = [mirrored // len(train_hops) + (i < mirrored % len(train_hops)) for i in range(len(train_hops))]
    sources: list[dict[str, Any]] = [{"generator": "prontoqa", "n": n, "seed": 100,
                                      "params": {"hops": h, "mirror_distractor": True},
                                      "name": "mtrain" if h == hops else f"mtrain{h}"}
                                     for h, n in zip(train_hops, share)]
    if standard:  # the published construction (the real split's), none of the real test's questions
        sources.append({"generator": "prontoqa", "n": standard, "seed": 101, "params": {"hops": hops},
                        "exclude_split": "test", "name": "strain"})
    return sources


def mix_suffix(hops: int, train_hops: list[int] | None, standard: int = 0) -> str:
    """``""`` when trained at the evaluated depth only, ``_train2-3-4-5`` when trained on a mix, ``_std1800``
    appended when 1,800 of the training problems were of the published construction (``--train-standard``)."""
    mix = train_hops or [hops]
    return ("" if mix == [hops] else "_train" + "-".join(map(str, mix))) + (f"_std{standard}" if standard else "")


def group_name(entry: dict[str, Any]) -> str:
    """``h5_1000`` (evaluated at 5 hops after 1,000 steps), ``h5_1000_train2-3-4-5`` when trained on a mix."""
    return f"h{entry['hops']}_{entry['train_steps']}" + mix_suffix(entry["hops"], entry.get("train_hops"), entry.get("train_standard", 0))


def read_chains(method: str, test: list, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The written proofs against the gold: an ``anchor_chain`` model's bare chains, otherwise forward proofs."""
    return (anchor_chain_report(test, records) if method == "anchor_chain"
            else chain_report(test, records, "forward"))


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per depth and step budget (``h2_1000``): each method's accuracy over its seeds (the per-problem
    accuracy averaged over seeds, 95% bootstrap interval over problems), tokens, and every method paired
    with CoT (``paired_with``). Entries graded on the real test too (``--eval-real``) get the same under
    ``real_test``. Entries without per-problem records (``_correct``) are left out."""
    from anchored_reasoning.eval.metrics import per_problem_over_seeds

    groups: dict[str, dict[str, dict[int, dict]]] = {}
    for e in results.values():
        if isinstance(e, dict) and e.get("_correct"):
            groups.setdefault(group_name(e), {}).setdefault(e["method"], {})[e["seed"]] = e
    out: dict[str, Any] = {}
    for group, methods in sorted(groups.items()):
        row = out[group] = {}
        for part in ("mirror", "real_test"):
            graded = {m: {s: (e if part == "mirror" else e["real_test"]) for s, e in seeds.items()
                          if part == "mirror" or e.get("real_test", {}).get("_correct")}
                      for m, seeds in methods.items()}
            for m, seeds in sorted(graded.items()):
                if not seeds:
                    continue
                entries = [{"seed": s, **seeds[s]} for s in sorted(seeds)]
                summary = over_seeds(entries, per_problem_over_seeds([e["_correct"] for e in entries]))
                if m != "cot" and graded.get("cot"):
                    pair = paired_with({s: e["_correct"] for s, e in seeds.items()},
                                       {s: e["_correct"] for s, e in graded["cot"].items()})
                    if pair:
                        summary["minus_cot"] = pair
                if part == "mirror":
                    row[m] = summary
                else:
                    row[m]["real_test"] = summary
    return out


def learning_curves(results: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Each method, depth (and training mix) and seed graded after several step budgets (``--extend-from``
    makes the longer ones continuations of the shorter): accuracy, exact chains, polarity flips and, where
    graded, the real test's accuracy, by steps (exact chains: an ``anchor_chain`` model's bare chains, a CoT
    model's written proofs). Keyed ``anchor_chain_h4_s0``; single budgets are left out."""
    curves: dict[str, list[dict[str, Any]]] = {}
    for e in results.values():
        if not (isinstance(e, dict) and e.get("_correct")):
            continue
        point = {"steps": e["train_steps"], "accuracy": e["accuracy"], "ci95": e.get("ci95"),
                 "exact_chains": (e.get("chains") or {}).get("exact_chains", (e.get("chains") or {}).get("exact_proofs")),
                 "flip_rate": (e.get("polarity_probe") or {}).get("flip_rate")}
        if e.get("real_test"):
            point["real_test"] = e["real_test"]["accuracy"]
        name = f"{e['method']}_h{e['hops']}{mix_suffix(e['hops'], e.get('train_hops'), e.get('train_standard', 0))}_s{e['seed']}"
        curves.setdefault(name, []).append(point)
    return {k: sorted(v, key=lambda p: p["steps"]) for k, v in sorted(curves.items()) if len(v) > 1}


def copy_shorter_run(shorter_work: Path, run_dir: Path) -> None:
    """Copy the shorter run's model folder (its checkpoints, optimizer state and ``run_config.json``) into
    ``run_dir`` unless ``run_dir`` already holds a run (a rerun resumes that one); the trainer then extends it
    (``training.extend_max_steps``) and refuses if anything but the step count differs."""
    import shutil

    source = shorter_work / run_dir.relative_to(run_dir.parents[2]) / "model"
    target = run_dir / "model"
    if (target / "run_config.json").is_file():
        return
    if not (source / "run_config.json").is_file():
        raise SystemExit(f"--extend-from: no finished run in {source}; train it first (same method, depth, seed)")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, target, dirs_exist_ok=True)


def real_test(run_dir: Path, n: int, method: str) -> dict[str, Any]:
    """The model of ``run_dir`` graded greedily on the real ProntoQA test (first ``n``), with the shortcut
    rule's accuracy on the same problems beside it and the written proofs read against the gold."""
    from anchored_reasoning import demo
    from anchored_reasoning.eval.records import load_records
    from anchored_reasoning.generators.prontoqa_shortcuts import rule_scores
    from anchored_reasoning.tasks import get_task

    test = get_task("prontoqa").load("test", limit=n)
    ev = demo.evaluate(str(run_dir / "model"), test, run_dir / "eval_real", MAX_NEW_TOKENS["prontoqa"], task="prontoqa")
    records = load_records(run_dir / "eval_real" / "records.jsonl")
    return {"n": ev["n"], "accuracy": round(ev["accuracy"], 4), "ci95": [round(x, 4) for x in ev["accuracy_ci95"]],
            "chance": 0.5, "tokens": ev["mean_generated_tokens"], "no_answer": ev["no_answer"],
            "best_surface_rule": max(rule_scores((e.question, e.answer) for e in test).items(), key=lambda kv: kv[1]),
            "chains": read_chains(method, test, records),
            "_correct": {r["id"]: int(bool(r["correct"])) for r in records}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", default="cot")
    p.add_argument("--hops", type=int, default=3)
    p.add_argument("--train-steps", type=int, default=1000)
    p.add_argument("--train-n", type=int, default=9000)
    p.add_argument("--train-hops", type=int, nargs="+", default=None, metavar="H",
                   help="train on equal shares of these depths (default: --hops only); evaluation stays at --hops")
    p.add_argument("--eval-n", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backbone", default="logic-gpt2-shift")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work", default="runs/prontoqa_mirror")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "prontoqa_mirror.json"))
    p.add_argument("--machine-note", default=None, help="what else ran on the machine (recorded in the JSON)")
    p.add_argument("--eval-real", type=int, default=0, metavar="N",
                   help="also grade the fine-tuned model on the first N problems of the real ProntoQA test "
                        "(800, 5 hops; 0: skip): the shortcut answers those, but a model trained on mirrored "
                        "problems never saw it pay")
    p.add_argument("--extend-from", type=int, default=None, metavar="STEPS",
                   help="start from the finished --train-steps STEPS run of the same method, depth and seed (copied, "
                        "then trained on to --train-steps): with the constant learning rate its first STEPS steps "
                        "are this run's, so a learning curve costs only the steps it adds")
    p.add_argument("--train-standard", type=int, default=0, metavar="N",
                   help="draw N of the --train-n problems from the published construction at --hops (its shortcut "
                        "open, like the real split's; the rest mirrored): does the model then read the real test's "
                        "proofs as it reads the mirrored ones? The mirrored grades and the polarity probe stay "
                        "shortcut-free")
    args = p.parse_args(argv)
    if not 0 <= args.train_standard < args.train_n:
        p.error(f"--train-standard {args.train_standard} must be between 0 and --train-n {args.train_n}")
    if args.extend_from is not None and not 0 < args.extend_from < args.train_steps:
        p.error(f"--extend-from {args.extend_from} must be between 0 and --train-steps {args.train_steps}")
    import torch

    torch.set_num_threads(args.threads)
    from anchored_reasoning import demo
    from anchored_reasoning.eval.probes import probe_summary, prontoqa_polarity_examples
    from anchored_reasoning.eval.records import load_records
    from anchored_reasoning.generators.prontoqa import generate_dataset
    from anchored_reasoning.machine import machine_info
    from anchored_reasoning.train.data.data_sources import load_split

    size = {"hops": args.hops, "mirror_distractor": True}
    train_hops = sorted(set(args.train_hops or [args.hops]))
    train = load_split({"mix": train_sources(args.hops, train_hops, args.train_n, args.train_standard)}, "prontoqa", 0)
    seen = {e.question for e in train}
    test = [e for e in generate_dataset(args.eval_n, seed=200, split="mtest", **size) if e.question not in seen]
    mix = mix_suffix(args.hops, train_hops, args.train_standard)
    key = f"{args.method}_h{args.hops}_{args.train_steps}{mix}_s{args.seed}"
    # acot_vs_cot's fine-tune + greedy evaluation, in <work>/h<hops>_<steps>/prontoqa/<method>/seed<seed>/
    work = Path(args.work) / f"h{args.hops}_{args.train_steps}{mix}"
    run_dir = work / "prontoqa" / args.method / f"seed{args.seed}"
    if args.extend_from is not None:
        copy_shorter_run(Path(args.work) / f"h{args.hops}_{args.extend_from}{mix}", run_dir)
    run = run_one("prontoqa", args.method, args.seed, train, test, None, argparse.Namespace(
        work=str(work), backbone=args.backbone, preset=None, lr=args.lr, batch_size=args.batch_size,
        train_seconds=0.0, train_steps=args.train_steps, extend=args.extend_from is not None))
    records = load_records(run_dir / "eval_test" / "records.jsonl")
    # the same problems with the query negated (answer flipped): does the answer follow the question?
    demo.evaluate(str(run_dir / "model"), prontoqa_polarity_examples(test), run_dir / "eval_polarity",
                  MAX_NEW_TOKENS["prontoqa"], task="prontoqa")
    polarity = probe_summary(records, load_records(run_dir / "eval_polarity" / "records.jsonl"))
    chains = read_chains(args.method, test, records)
    entry = {"method": args.method, "hops": args.hops, "train_hops": train_hops, "train_steps": run["steps"],
             **({"train_standard": args.train_standard} if args.train_standard else {}),
             "train_seconds": run["train_seconds"], "train_seconds_all_sessions": run["train_seconds_all_sessions"],
             "seed": args.seed, "backbone": args.backbone,
             "train_n": len(train), "eval_n": len(test), "accuracy": run["accuracy"],
             "ci95": [round(x, 4) for x in run["accuracy_ci95"]],
             "chance": 0.5, "tokens": run["mean_generated_tokens"], "chains": chains,
             "polarity_probe": {"negated_accuracy": round(polarity["swap_accuracy"]["mean"], 4),
                                "flip_rate": round(polarity["flip_rate"]["mean"], 4),
                                "both_right": round(polarity["both_right"]["mean"], 4)},
             "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine_info(note=args.machine_note),
             "command": "python -m benchmarks.prontoqa_mirror " + " ".join(sys.argv[1:] if argv is None else argv),
             "_correct": {r["id"]: int(bool(r["correct"])) for r in records}}
    if args.eval_real:
        entry["real_test"] = real_test(run_dir, args.eval_real, args.method)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".lock"), "w") as lock:  # one process per core may finish at the same time
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = json.loads(out.read_text()) if out.is_file() else {}
        results[key] = entry
        results["summary"] = summarize(results)
        results["curves"] = learning_curves(results)
        out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(json.dumps({k: entry[k] for k in ("accuracy", "ci95", "tokens")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
