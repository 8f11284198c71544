"""Trained ProsQA runs graded on the real ProsQA test, and taken apart.

    anchored-reasoning train prosqa_real_cpu output_dir=runs/prosqa_anchor_chain_s0
    anchored-reasoning train prosqa_real_cpu method.name=cot output_dir=runs/prosqa_cot_s0
    python -m benchmarks.prosqa_real --run runs/prosqa_anchor_chain_s0 --run runs/prosqa_cot_s0

For each run folder (its ``run_config.json`` names the method, seed and training data):

- the real test (500 problems, 3-6 hops, two options, chance 0.5), from the trainer's end-of-training
  validation records (graded here when they are missing): accuracy with its 95% interval, by hop count,
  tokens; the answers that name no option, and how many of them the generation budget cut off, beside
  what a right completion costs (``gold_tokens``: the run's own target on the test problems);
- the real test's own surface shortcut beside it: the best rule of ``generators/shortcuts.py`` on the test
  ("the option less frequent in the facts", 0.66) and the model's accuracy where that rule is right and
  where it is wrong -- a model riding the rule is near 0 where it is wrong;
- the written chains read against each graph (``eval.probes.chain_summary``: exact walks, first errors; a
  ``dfs``/``dfs_paths`` run's search replayed by ``eval.search_probe``: legal steps, the first rule broken);
- the binding probe: every test problem asked about the other entity, the answer flipped
  (``eval.probes.binding_probe_examples``): the share of answers that follow, by hop count;
- held-out shortcut-free problems (``neg_depth: match`` at the published size, 3, 4 and 5-6 hops,
  ``--heldout`` per depth, seed 200, the run's training questions dropped).

Runs of the same seed are paired on the real test (bootstrap over problems, exact McNemar); runs that differ
only in their seed are pooled (``over_seeds``: the mean, and an interval over problems), and two such
groups are paired on the seeds both ran (``paired_over_seeds``). Writes
``benchmarks/results/prosqa_real_cpu.json``, one entry per run (``<method>_s<seed>``, with what sets the run
apart from the recipe named before ``_s``: a curriculum, a walk, the trace, the backbone, the lr; ``entry_key``) and ``paired``;
a rerun replaces its own entries. Grading is greedy through the evaluation runner (``demo.evaluate``).
"""
from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import json
from functools import lru_cache
from itertools import combinations
import sys
from pathlib import Path
from typing import Any

from anchored_reasoning.generators.traces import BACK_WORD
from benchmarks.common import accuracy_ci, last_validation, paired_with

ROOT = Path(__file__).resolve().parents[1]

#: Held-out shortcut-free problems: the published graph size, the wrong option as deep as the right one.
HELDOUT_SIZES = {
    "3": {"num_nodes": 28, "min_hops": 3, "max_hops": 3, "neg_depth": "match"},
    "4": {"num_nodes": 28, "min_hops": 4, "max_hops": 4, "neg_depth": "match"},
    "5-6": {"num_nodes": 31, "min_hops": 5, "max_hops": 6, "neg_depth": "match"},
}


def shortcut_groups(test: list) -> tuple[str, float, dict[str, str]]:
    """The test's best surface rule, its accuracy, and per problem whether the rule is right, wrong, or
    undecided (``rule_right`` / ``rule_wrong`` / ``undecided``)."""
    from anchored_reasoning.generators.shortcuts import RULES, example_problems, parse, rule_scores

    problems = example_problems(test)
    scores = rule_scores(problems)
    name = max(scores, key=scores.get)
    group = {}
    for ex, (question, gold) in zip(test, problems):
        pick = RULES[name](*parse(question))
        group[ex.id] = "undecided" if pick is None else "rule_right" if pick == gold else "rule_wrong"
    return name, scores[name], group


def shortcut_split(test: list, correct: dict[str, int]) -> dict[str, Any]:
    """The test's best surface rule and the model's accuracy where the rule is right, wrong, or undecided."""
    name, score, group = shortcut_groups(test)
    groups: dict[str, list[float]] = {"rule_right": [], "rule_wrong": [], "undecided": []}
    for ex in test:
        if ex.id in correct:
            groups[group[ex.id]].append(float(correct[ex.id]))
    return {"rule": name, "rule_accuracy": round(score, 4),
            **{k: accuracy_ci(v) for k, v in groups.items() if v}}


def backward_chains(test: list, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Chains of a model trained on the ``options_backward`` trace (``anchor_chain``: ``hilpus lorpus Bob
    sterpus rempus scrompus Sally``) read against each graph: cut into walks at the options, each step
    ``x y`` right when "y is a x" is a fact. Counts: ``exact`` (the gold trace's chain), ``steps_real`` (every
    step a fact), per walk whether it ends at an entity and which, ``answer_follows_walks`` (the answer
    names the option whose walk ended at the asked entity, where exactly one did), and the reverse look-ups
    (``reverse_steps_real`` of ``reverse_steps``: the node written is a parent of the one before)."""
    from anchored_reasoning.anchors import logic_nodes
    from anchored_reasoning.eval.probes import prosqa_children
    from anchored_reasoning.generators.traces import apply_trace

    gold = {ex.id: logic_nodes(ex.steps) for ex in apply_trace(test, "prosqa", "options_backward")}
    by_id = {ex.id: ex for ex in test}
    counts = {"n": 0, "exact": 0, "steps_real": 0, "answer_walk_reaches_entity": 0,
              "wrong_walk_reaches_other_entity": 0, "one_walk_reaches_entity": 0, "answer_follows_walks": 0,
              "reverse_steps": 0, "reverse_steps_real": 0}
    for rec in records:
        ex = by_id.get(rec["id"])
        if ex is None or rec.get("sample", 0):
            continue
        counts["n"] += 1
        words = (rec.get("completion") or "").split("[EoA]")[0].split()
        counts["exact"] += words == gold[ex.id]
        children = prosqa_children(ex)
        options = {ex.meta["answer_concept"], ex.meta["neg_concept"]}
        walks: dict[str, list[str]] = {}
        for w in words:
            if w in options and w not in walks:
                walks[w] = [w]
                current = w
            elif walks:
                walks[current].append(w)
        steps = [x in children.get(y, ()) for walk in walks.values() for x, y in zip(walk, walk[1:])]
        counts["reverse_steps"] += len(steps)
        counts["reverse_steps_real"] += sum(steps)
        real = all(steps)
        counts["steps_real"] += real and len(walks) == 2
        ends = {o: walk[-1] for o, walk in walks.items() if real and walk[-1][:1].isupper()}
        entity = ex.meta["entity"]
        counts["answer_walk_reaches_entity"] += ends.get(ex.meta["answer_concept"]) == entity
        counts["wrong_walk_reaches_other_entity"] += ends.get(ex.meta["neg_concept"], entity) != entity
        at_entity = [o for o, e in ends.items() if e == entity]
        if len(at_entity) == 1:
            counts["one_walk_reaches_entity"] += 1
            counts["answer_follows_walks"] += rec.get("extracted") == at_entity[0]
    return counts


def backup_word(options: dict[str, Any] | None) -> str:
    """The word a run's walk marks its back-ups with, from its method options (``backup_word``; ``Back``)."""
    return (options or {}).get("backup_word", BACK_WORD)


def chains(trace: str, test: list, records: list[dict[str, Any]], hops: dict[str, int], walk: bool = False,
           marker: str = BACK_WORD) -> dict[str, Any]:
    """The written steps read against each graph, the way the run's trace writes them (``walk``: a search
    written as the nodes it walks, the anchor chain with ``revisits``; ``marker``: its back-up word)."""
    from anchored_reasoning.eval.probes import chain_summary
    from anchored_reasoning.eval.search_probe import search_summary

    if trace == "options_backward":
        return backward_chains(test, records)
    if trace in ("dfs", "dfs_paths"):  # a written search: replayed, its first error named
        return search_summary(records, test, form="walk" if walk and trace == "dfs" else trace, marker=marker)
    return chain_summary(records, test, hops)


def heldout_examples(n: int, training_questions: set[str]) -> tuple[list, dict[str, str]]:
    """``n`` shortcut-free problems per depth group of HELDOUT_SIZES (seed 200) not seen in training."""
    from anchored_reasoning.generators.prosqa import generate_dataset

    out, group = [], {}
    for name, size in HELDOUT_SIZES.items():
        for ex in generate_dataset(n, seed=200, split=f"heldout{name}", **size):
            if ex.question not in training_questions:
                out.append(ex)
                group[ex.id] = name
    return out, group


@lru_cache(maxsize=1)
def recipe_lr() -> float:
    """The learning rate of the recipe these runs start from (``prosqa_real_cpu``): another one is named in
    the entry's key."""
    from anchored_reasoning.train.recipes import load_recipe

    return float(load_recipe("prosqa_real_cpu")["training"]["learning_rate"])


def entry_key(entry: dict[str, Any]) -> str:
    """``<method>[_curriculum][_walk[_back[_as_<word>|_token[_word][_x<width>]]]][_no_answer_line][_<trace>][_<backbone>][_lr<lr>]_s<seed>``:
    ``curriculum`` for a run whose steps a curriculum removes (the paper's pause / ACoT / stepwise), ``walk`` for
    an anchor chain with ``revisits`` (``walk_back`` with its back-ups marked, ``_as_B`` by a word other than
    ``Back``, ``_token`` by the one-token marker,
    ``_word`` where that token's embedding started from the word's, ``_x2`` two of them a back-up;
    ``_no_answer_line`` where the chain ends at ``[EoA]``, its last node the answer; also CoT's steps at ``[EoR]``), the
    trace when not forward, the backbone's folder name when it is not the recipe's ``logic-gpt2-shift``, the
    learning rate when not the recipe's."""
    curriculum = "_curriculum" if entry.get("curriculum") else ""
    options = entry.get("method_options") or {}
    back = "_back_token" if options.get("backup_marker") == "token" else "_back"
    back += "_word" if options.get("backup_marker_init") == "word" else ""
    back += f"_x{options['backup_marker_width']}" if options.get("backup_marker_width", 1) != 1 else ""
    back += f"_as_{options['backup_word']}" if backup_word(options) != BACK_WORD else ""
    walk = ("_walk" + (back if options.get("mark_backups") else "")) if options.get("revisits") else ""
    walk += "_no_answer_line" if options.get("answer_line") is False else ""
    trace = "" if entry["trace"] == "forward" else f"_{entry['trace']}"
    model = "" if entry["model"] == "logic-gpt2-shift" else "_" + Path(str(entry["model"])).name
    lr = "" if entry.get("lr") in (None, recipe_lr()) else f"_lr{entry['lr']:g}"
    return f"{entry['method']}{curriculum}{walk}{trace}{model}{lr}_s{entry['seed']}"


def seed_groups(runs: dict[str, dict[str, Any]], min_seeds: int = 2) -> dict[str, list[dict[str, Any]]]:
    """Entries that differ only in their seed (``<key>_s<seed>``), ``min_seeds`` seeds or more, by seed."""
    import re

    groups: dict[str, list[dict[str, Any]]] = {}
    for key, entry in sorted(runs.items()):
        groups.setdefault(re.sub(r"_s\d+$", "", key), []).append(entry)
    return {name: sorted(entries, key=lambda e: e["seed"]) for name, entries in groups.items() if len(entries) >= min_seeds}


def over_seeds(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each group of :func:`seed_groups`: each seed's accuracy, their mean, and a 95% bootstrap interval
    over problems of the per-problem accuracy averaged over seeds."""
    from anchored_reasoning.eval.metrics import mean_ci, per_problem_over_seeds

    out = {}
    for name, entries in seed_groups(runs).items():
        c = mean_ci(list(per_problem_over_seeds([e["_correct"] for e in entries]).values()))
        out[name] = {"seeds": [e["seed"] for e in entries],
                     "accuracy_by_seed": [e["real_test"]["accuracy"] for e in entries],
                     "accuracy": round(c["mean"], 4), "ci95": [round(c["ci_low"], 4), round(c["ci_high"], 4)], "n": c["n"]}
    return out


def paired(a: dict[int, dict[str, int]], b: dict[int, dict[str, int]]) -> dict[str, Any] | None:
    """``common.paired_with`` (per-problem records by seed, on the seeds both ran), its second
    side named as such; None when no seed is shared."""

    pair = paired_with(a, b)
    if pair:
        pair["only_second_right"] = pair.pop("only_cot_right")
    return pair


def paired_over_seeds(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every two seed groups on the seeds both ran (two or more): the difference of the seed-averaged
    per-problem accuracy (paired bootstrap) and an exact McNemar test on the (seed, problem) pairs."""
    groups = {name: {e["seed"]: e["_correct"] for e in entries} for name, entries in seed_groups(runs).items()}
    out = {}
    for a, b in combinations(sorted(groups), 2):
        pair = paired(groups[a], groups[b])
        if pair and len(pair["seeds_paired"]) >= 2:
            out[f"{a} - {b}"] = pair
    return out


def gold_tokens(run: Path, recipe: dict[str, Any], test: list, trace: str) -> dict[str, int]:
    """The run's own training target (its method, options and trace; final curriculum stage) on the test
    problems, in the run's tokens: what a right completion costs, so a budget can be checked against it."""
    from transformers import AutoTokenizer

    from anchored_reasoning.generators.traces import apply_trace
    from anchored_reasoning.methods import get_method

    tok = AutoTokenizer.from_pretrained(str(run))
    method = get_method(recipe["method"]["name"], style="trained", **(recipe["method"].get("options") or {}))
    lengths = sorted(len(tok(method.render(ex, "prosqa").target)["input_ids"]) + 1  # + EOS
                     for ex in apply_trace(test, "prosqa", trace))
    return {"median": lengths[len(lengths) // 2], "max": lengths[-1]}


def grade_run(run: Path, heldout_n: int, limit: int | None = None) -> dict[str, Any]:
    from anchored_reasoning import demo
    from anchored_reasoning.eval.probes import accuracy_by, binding_probe_examples, hops_of, probe_summary
    from anchored_reasoning.eval.records import load_records
    from anchored_reasoning.tasks import get_task
    from anchored_reasoning.train.data.data_sources import load_split

    config = json.loads((run / "run_config.json").read_text())
    recipe = config["recipe"]
    max_new = int(recipe["training"].get("generation_max_new_tokens") or 112)
    trace = recipe["data"]["train"].get("trace") or "forward"
    options = recipe["method"].get("options") or {}
    test = get_task("prosqa").load("test", limit=limit)
    hops = {ex.id: hops_of(ex) for ex in test}
    found = last_validation(run)
    if found is None or len(load_records(found)) < len(test):
        demo.evaluate(str(run), test, run / "eval_test", max_new)
        found = run / "eval_test" / "records.jsonl"
    records = [r for r in load_records(found) if r["id"] in hops]
    correct = {r["id"]: int(bool(r["correct"])) for r in records if r.get("sample", 0) == 0}
    tokens = [r.get("tokens", 0) for r in records if r.get("sample", 0) == 0]
    swapped = binding_probe_examples(test)
    demo.evaluate(str(run), swapped, run / "eval_swap", max_new)
    probe = probe_summary(records, load_records(run / "eval_swap" / "records.jsonl"), hops)
    train = load_split(recipe["data"]["train"], recipe.get("task"), int(recipe.get("seed", 0)))
    held, group = heldout_examples(heldout_n, {e.question for e in train})
    ev = demo.evaluate(str(run), held, run / "eval_heldout", max_new)
    held_records = load_records(run / "eval_heldout" / "records.jsonl")
    return {
        "method": recipe["method"]["name"], "seed": int(recipe.get("seed", 0)), "run": str(run),
        "model": recipe["model"]["name"], "train_n": len(train), "method_options": options,
        "lr": float(recipe["training"]["learning_rate"]),
        "curriculum": bool(recipe["training"].get("curriculum")),
        "train_steps": config.get("completed_step") or config.get("last_checkpoint_step"),
        "real_test": {**accuracy_ci(list(map(float, correct.values()))), "chance": 0.5,
                      "tokens": round(sum(tokens) / max(len(tokens), 1), 2), "records": str(found),
                      "no_answer": sum(r.get("extracted") is None for r in records),
                      # of those, cut off by the generation budget, against what a right completion costs
                      "no_answer_cut_off": sum(r.get("extracted") is None and r.get("finish_reason") == "length"
                                               for r in records),
                      "max_new_tokens": max_new, "gold_tokens": gold_tokens(run, recipe, test, trace),
                      "by_hops": {h: {"accuracy": round(v["mean"], 4), "ci95": [round(v["ci_low"], 4),
                                                                               round(v["ci_high"], 4)], "n": v["n"]}
                                  for h, v in accuracy_by(records, hops).items()}},
        "shortcut": shortcut_split(test, correct),
        "trace": trace,
        "chains": chains(trace, test, records, hops, walk=bool(options.get("revisits")),
                         marker=backup_word(options)),
        "binding_probe": {"flip_rate": round(probe["flip_rate"]["mean"], 4),
                          "swap_accuracy": round(probe["swap_accuracy"]["mean"], 4),
                          "both_right": round(probe["both_right"]["mean"], 4),
                          "flip_rate_by_hops": {h: round(v["flip_rate"]["mean"], 4)
                                                for h, v in probe.get("by_hops", {}).items()}},
        "heldout_shortcut_free": {"accuracy": round(ev["accuracy"], 4),
                                  "ci95": [round(x, 4) for x in ev["accuracy_ci95"]], "n": ev["n"],
                                  "by_depth": {k: {"accuracy": round(v["mean"], 4), "n": v["n"]}
                                               for k, v in accuracy_by(held_records, group).items()}},
        "_correct": correct,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="append", default=[],
                   help="a trained run folder (repeat); none: only recompute `paired` and `over_seeds` from the JSON")
    p.add_argument("--heldout", type=int, default=100, help="held-out shortcut-free problems per depth group")
    p.add_argument("--limit", type=int, default=None, help="grade the first N test problems only (a quick look)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "prosqa_real_cpu.json"))
    p.add_argument("--machine-note", default=None)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from anchored_reasoning.machine import machine_info
    graded = {}
    for run in args.run:
        entry = grade_run(Path(run), args.heldout, args.limit)
        entry["date"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        entry["machine"] = machine_info(note=args.machine_note)  # the top-level one is the last grading's
        graded[entry_key(entry)] = entry
        print(json.dumps({k: entry[k] for k in ("method", "seed", "real_test")}, default=str)[:400], flush=True)
    out = Path(args.out)
    with open(out.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = json.loads(out.read_text()) if out.is_file() else {}
        results.update(graded)
        runs = {k: v for k, v in results.items() if isinstance(v, dict) and v.get("_correct")}
        results["paired"] = {}
        for a, b in combinations(sorted(runs), 2):
            ea, eb = runs[a], runs[b]
            if ea["seed"] == eb["seed"]:
                results["paired"][f"{a} - {b}"] = paired({ea["seed"]: ea["_correct"]}, {eb["seed"]: eb["_correct"]})
        results["over_seeds"] = over_seeds(runs)
        results["paired_over_seeds"] = paired_over_seeds(runs)
        if graded:  # a recompute keeps the last grading's machine and command
            results["machine"] = machine_info(note=args.machine_note)
            results["command"] = "python -m benchmarks.prosqa_real " + " ".join(sys.argv[1:] if argv is None else argv)
        out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
