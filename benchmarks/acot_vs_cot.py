"""ACoT vs CoT, No-CoT, pause and stepwise at an equal training budget, several seeds, real test splits.

    ANCHORED_REASONING_DATA=../shared/data python -m benchmarks.acot_vs_cot --train-seconds 30 --seeds 0 1 2

For each task (ProsQA: real test, 500 problems; ProntoQA: real test, 800 problems) and each method
(acot, cot, pause, nocot, stepwise), for each seed: trains a GPT-2-class model from scratch for the
same wall-clock budget (``--train-seconds``), on generated full-size ProsQA problems / the ProntoQA
train split, then evaluates it greedily through the evaluation runner on the real test split.
Writes ``benchmarks/results/acot_vs_cot.json``:

    {"prosqa": {"acot": {"accuracy", "accuracy_ci95", "mean_generated_tokens", "seeds", "per_seed", "budget"}, ...},
     "prontoqa": {...}, "step_time": {...}, "goals": {...}, "machine": ..., "date": ..., "command": ...}

``accuracy`` is the mean over seeds; ``accuracy_ci95`` a 95% bootstrap interval over test problems of
the per-problem accuracy averaged over seeds. ``step_time`` is ACoT's training step time over plain
SFT's (TRL's own SFTTrainer.compute_loss) on the same batch, measured interleaved in one process.

On a 2-core CPU the budget is minutes, not the paper's 50 GPU epochs: read the numbers with the
budget they came with (results at chance are a statement about the budget, not about the methods).
Finished runs are reused and killed ones resume: rerun the same command. A work folder that holds a run
with other settings (steps, trace, backbone, examples) is refused with the keys that differ.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from anchored_reasoning.machine import machine_info
from benchmarks.common import OPTIONS, backbone_of, run_one

ROOT = Path(__file__).resolve().parents[1]

log = logging.getLogger("acot_vs_cot")

METHODS = ["acot", "cot", "pause", "nocot", "stepwise"]
#: Also runnable with --methods (not in the default set, which is the paper's table): the anchors decoded
#: as a terse chain (methods.anchor_chain.AnchorChain).
EXTRA_METHODS = ["anchor_chain"]
#: Method pairs compared per problem in ``goals`` when both ran.
PAIRS = [("cot", "nocot"), ("acot", "cot"), ("acot", "pause"), ("anchor_chain", "cot"), ("anchor_chain", "nocot")]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=["prosqa", "prontoqa"])
    p.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS + EXTRA_METHODS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--train-seconds", type=float, default=30.0, help="wall-clock training budget per run (equal for all)")
    p.add_argument("--train-steps", type=int, default=None,
                   help="optimizer steps per run instead of a time budget (equal examples for every method, as the paper's equal epochs)")
    p.add_argument("--train-n", type=int, default=6000, help="generated ProsQA training problems (ProntoQA uses its train split)")
    p.add_argument("--prosqa-n", type=int, default=500, help="real ProsQA test problems (all 500 by default)")
    p.add_argument("--prontoqa-n", type=int, default=800, help="real ProntoQA test problems (all 800 by default)")
    p.add_argument("--backbone", default="logic-gpt2-shift",
                   help="model every run fine-tunes (alias, directory or Hub id); 'none' trains --preset from scratch")
    p.add_argument("--preset", default="gpt2-tiny", help="from-scratch architecture when --backbone none")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--work", default="runs/bench_acot_vs_cot", help="checkpoints and per-run evaluations")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "acot_vs_cot.json"))
    p.add_argument("--step-time-repeats", type=int, default=10)
    p.add_argument("--skip-step-time", action="store_true")
    p.add_argument("--trace", choices=["forward", "backward"], default="forward",
                   help="proof order the CoT family trains on (generators/traces.py; backward: ProntoQA only)")
    p.add_argument("--machine-note", default=None, help="what else ran on the machine (recorded in the JSON)")
    return p.parse_args(argv)


def task_data(task: str, args) -> tuple[list, list]:
    from anchored_reasoning.tasks import get_task

    t = get_task(task)
    if task == "prosqa":
        from anchored_reasoning.generators.prosqa import generate_dataset

        train = generate_dataset(args.train_n, seed=12345, split="bench-train")
        test = t.load("test", limit=args.prosqa_n)
    else:
        train = t.load("train")
        test = t.load("test", limit=args.prontoqa_n)
    if args.trace != "forward":
        from anchored_reasoning.generators.traces import apply_trace

        train, test = apply_trace(train, task, args.trace), apply_trace(test, task, args.trace)
    return train, test


def aggregate(per_seed: list[dict[str, Any]], budget: dict[str, Any]) -> dict[str, Any]:
    from anchored_reasoning.eval.metrics import mean_ci, per_problem_over_seeds

    by_id = per_problem_over_seeds([r["_correct"] for r in per_seed])
    ids, per_problem = list(by_id), list(by_id.values())
    ci = mean_ci(per_problem)
    return {
        "accuracy": statistics.mean(r["accuracy"] for r in per_seed),
        "accuracy_ci95": [ci["ci_low"], ci["ci_high"]],
        "accuracy_seed_std": statistics.pstdev([r["accuracy"] for r in per_seed]) if len(per_seed) > 1 else 0.0,
        "mean_generated_tokens": statistics.mean(r["mean_generated_tokens"] for r in per_seed),
        "seeds": [r["seed"] for r in per_seed],
        "per_seed": [{k: v for k, v in r.items() if not k.startswith("_")} for r in per_seed],
        "n_test": len(ids),
        "per_problem": dict(zip(ids, per_problem)),  # seed-averaged correctness, for the paired tests in goals
        **answered(per_seed, len(ids)),
        "budget": budget,
    }


def answered(per_seed: list[dict[str, Any]], n_test: int) -> dict[str, Any]:
    """Mean ungradable answers per seed, and accuracy among the answers that name an option."""
    among = [r["accuracy"] * n_test / (n_test - r["no_answer"]) for r in per_seed if n_test > r["no_answer"]]
    return {"no_answer_mean": statistics.mean(r["no_answer"] for r in per_seed),
            "accuracy_among_answered": statistics.mean(among) if among else None}


def step_time(args) -> dict[str, Any]:
    """ACoT step / plain SFT step on the same ProsQA batch, interleaved (median of repeats)."""
    import torch
    from trl import SFTConfig, SFTTrainer

    from anchored_reasoning.generators.prosqa import generate_dataset
    from anchored_reasoning.methods import get_method
    from anchored_reasoning.train.trainers.acot_trainer import AnchoredSFTConfig, AnchoredSFTTrainer
    from anchored_reasoning.train.pipelines.ar import build_model_and_tokenizer, training_texts
    from anchored_reasoning.train.data.collate import AnchoredCollator, examples_dataset

    examples = generate_dataset(args.batch_size, seed=999, split="bench-steptime")
    method = get_method("acot", style="trained", k=6)  # 6 [ANT] slots with anchors, full CoT target
    work = Path(args.work) / "step_time"
    spec = {"name": backbone_of(args)} if backbone_of(args) else {"preset": args.preset, "tokenizer": "train"}
    model, tok = build_model_and_tokenizer(spec,
                                           training_texts(examples, method, "prosqa"), work, 0)
    batch = AnchoredCollator(tok, method, task="prosqa")([{"example": r} for r in examples_dataset(examples)["example"]])
    ds = examples_dataset(examples)
    common = dict(output_dir=str(work / "o"), report_to="none", per_device_train_batch_size=args.batch_size,
                  gradient_checkpointing=False, bf16=False, use_cpu=True, disable_tqdm=True)
    acot = AnchoredSFTTrainer(model=model, args=AnchoredSFTConfig(**common), train_dataset=ds,
                              data_collator=lambda rows: rows, processing_class=tok)
    sft_model = type(model)(model.config)
    sft_model.load_state_dict(model.state_dict())
    sft = SFTTrainer(model=sft_model, args=SFTConfig(**common, dataset_kwargs={"skip_prepare_dataset": True},
                                                     remove_unused_columns=False),
                     train_dataset=ds, data_collator=lambda rows: rows, processing_class=tok)
    for t in (acot, sft):
        t.create_optimizer_and_scheduler(num_training_steps=1000)
        t.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which is not used here
    acot_batch = {k: v for k, v in batch.items()}
    sft_batch = {k: batch[k] for k in ("input_ids", "attention_mask", "labels")}

    def timed(trainer, b):
        t0 = time.perf_counter()
        trainer.training_step(trainer.model, {k: v.clone() for k, v in b.items()})
        trainer.optimizer.step()
        trainer.optimizer.zero_grad()
        return time.perf_counter() - t0

    for _ in range(3):  # warm-up
        timed(acot, acot_batch), timed(sft, sft_batch)
    a_times, s_times = [], []
    for i in range(args.step_time_repeats):
        if i % 2:
            a_times.append(timed(acot, acot_batch)); s_times.append(timed(sft, sft_batch))
        else:
            s_times.append(timed(sft, sft_batch)); a_times.append(timed(acot, acot_batch))
    ratios = [a / s for a, s in zip(a_times, s_times)]
    return {
        "acot_over_sft": statistics.median(ratios),
        "acot_step_ms_median": 1000 * statistics.median(a_times),
        "sft_step_ms_median": 1000 * statistics.median(s_times),
        "repeats": args.step_time_repeats,
        "batch": {"examples": args.batch_size, "tokens": int(batch["attention_mask"].sum()),
                  "anchor_labels": int((batch["anchor_labels"] != -100).sum())},
        "model": backbone_of(args) or args.preset,
        "threads": torch.get_num_threads(),
        "goal": "<= 1.10",
        "what": "training_step + optimizer step of AnchoredSFTTrainer (LM + anchor loss) vs TRL SFTTrainer "
                "(its own compute_loss, LM loss only) on the same ACoT-rendered batch, interleaved; median of per-pair ratios",
    }


def goals(results: dict[str, Any], st: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    p = results.get("prosqa", {})
    if all(m in p for m in ("acot", "cot", "pause")):
        a, c, z = p["acot"], p["cot"], p["pause"]
        out["prosqa_acot_ge_cot"] = a["accuracy"] >= c["accuracy"]
        out["prosqa_acot_tokens_le_third_of_cot"] = a["mean_generated_tokens"] <= c["mean_generated_tokens"] / 3
        out["prosqa_acot_gt_pause"] = a["accuracy"] > z["accuracy"]
    if st:
        out["step_time_le_1.10"] = st["acot_over_sft"] <= 1.10
    from anchored_reasoning.eval.metrics import paired_bootstrap_diff

    for task in ("prosqa", "prontoqa"):  # paired bootstrap over test problems, a - b
        r = results.get(task, {})
        for a, b in PAIRS:
            pa, pb = (r[m].get("per_problem") if isinstance(r.get(m), dict) else None for m in (a, b))
            if pa and pb:
                ids = sorted(set(pa) & set(pb))
                out[f"{task}_{a}_minus_{b}"] = {"n": len(ids), **paired_bootstrap_diff([pa[i] for i in ids], [pb[i] for i in ids])}
    return out


def _budget_text(budget: dict[str, Any], steps: list[int]) -> str:
    if budget.get("train_steps_per_run"):
        what = f"{budget['train_steps_per_run']} optimizer steps of batch {budget['batch_size']} per run"
    else:
        what = f"{budget['train_seconds_per_run']:.0f} s of training per run ({min(steps)}-{max(steps)} optimizer steps)"
    return f"{what}, {budget['model']}"


def notes(results: dict[str, Any]) -> list[str]:
    """Plain-language reading of the numbers (what a reader must not conclude)."""
    out = []
    for task in ("prosqa", "prontoqa"):
        methods = {m: v for m, v in results.get(task, {}).items() if isinstance(v, dict) and "accuracy" in v}
        if not methods:
            continue
        best_name, best = max(methods.items(), key=lambda kv: kv[1]["accuracy"])
        budget = best["budget"]
        steps = [r["steps"] for v in methods.values() for r in v["per_seed"]]
        lo = best["accuracy_ci95"][0]
        if lo <= 0.5:
            if task == "prosqa" and all(m in methods for m in ("acot", "cot", "pause")):
                out.append(
                    "prosqa: the goal flags compare accuracies at or below chance and are not evidence for or against "
                    "ACoT; see accuracy_among_answered (near 0.5 means a coin flip between the two options)."
                )
            out.append(
                f"{task}: no method is clearly above chance (best {best_name} {best['accuracy']:.3f}, 95% CI from "
                f"{lo:.3f}; two options, a random pick scores 0.5) after {_budget_text(budget, steps)}. This is a "
                "statement about the budget, not a ranking of the methods; the token counts show each format's cost."
            )
        else:
            out.append(
                f"{task}: best {best_name} {best['accuracy']:.3f} (95% CI {lo:.3f}-{best['accuracy_ci95'][1]:.3f}) after "
                f"{_budget_text(budget, steps)}; a random pick between the two options scores 0.5."
            )
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    import torch

    torch.set_num_threads(args.threads)
    if not os.environ.get("ANCHORED_REASONING_DATA"):
        log.warning("ANCHORED_REASONING_DATA is unset: the real test splits come from the Hub (needs network)")
    from anchored_reasoning.demo import shared_tokenizer

    t_start = time.monotonic()
    out = Path(args.out)
    results: dict[str, Any] = {}  # this process's tasks; _write merges them into --out
    st = None if args.skip_step_time else step_time(args)
    if st:
        log.info("step time: ACoT / SFT = %.3f", st["acot_over_sft"])
    model = f"{backbone_of(args)} fine-tuned" if backbone_of(args) else f"{args.preset} from scratch"
    budget = {"train_seconds_per_run": None if args.train_steps else args.train_seconds,
              "train_steps_per_run": args.train_steps, "model": model, "lr": args.lr,
              "batch_size": args.batch_size, "torch_threads": args.threads, "trace": args.trace}
    for task in args.tasks:
        train, test = task_data(task, args)
        tok_dir = Path(args.work) / task
        if backbone_of(args):
            tokenizer = None  # the backbone's own
        elif task == "prosqa":
            tokenizer = shared_tokenizer(train, tok_dir, args.methods)
        else:
            tokenizer = _prontoqa_tokenizer(train, tok_dir, args)
        task_budget = dict(budget, train_problems=len(train),
                           train_data="generated full-size ProsQA" if task == "prosqa" else "ProntoQA train split")
        per_task = results.setdefault(task, {})
        for method in args.methods:
            runs = []
            for seed in args.seeds:
                r = run_one(task, method, seed, train, test, tokenizer, args)
                log.info("%s %s seed %d: accuracy %.3f, %.1f tokens, %d steps", task, method, seed, r["accuracy"],
                         r["mean_generated_tokens"], r["steps"])
                runs.append(r)
            per_task[method] = aggregate(runs, task_budget)
            results["step_time"] = st
            _write(out, results, args, t_start)
    _write(out, results, args, t_start)
    print(json.dumps({t: {m: round(v["accuracy"], 3) for m, v in results[t].items()} for t in args.tasks}, indent=1))
    return 0


def _prontoqa_tokenizer(train: list, work: Path, args) -> Path:
    from anchored_reasoning.methods import get_method
    from anchored_reasoning.methods.anchored import add_special_tokens
    from anchored_reasoning.train.pipelines.ar import build_tokenizer_from_texts, training_texts

    path = work / "tokenizer"
    if (path / "tokenizer.json").is_file():
        return path
    texts: list[str] = []
    for name in args.methods:
        texts.extend(training_texts(train[:2000], get_method(name, style="trained", **OPTIONS["prontoqa"][name]), "prontoqa"))
    tok = build_tokenizer_from_texts(texts, path, vocab_size=1024)
    add_special_tokens(tok)
    tok.save_pretrained(path)
    return path


def _write(out: Path, results: dict[str, Any], args, t_start: float) -> None:
    """Merge this process's tasks into ``out`` under a file lock, so one process per task can run at once."""
    import fcntl

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        merged: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
        for key in args.tasks:
            if key in results:
                merged.setdefault(key, {}).update(results[key])  # per method: other methods' runs stay
        if results.get("step_time"):
            merged["step_time"] = results["step_time"]
        merged["goals"] = goals(merged, merged.get("step_time"))
        merged["notes"] = notes(merged)
        merged["machine"] = machine_info(torch_threads=args.threads,
                                         **({"note": args.machine_note} if args.machine_note else {}))
        merged["date"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        command = "python -m benchmarks.acot_vs_cot " + " ".join(sys.argv[1:])
        commands = merged.setdefault("commands", {})
        for key in args.tasks:
            commands[key] = command
        merged.pop("command", None)
        merged.pop("resumed_with", None)
        walls = merged.setdefault("wall_seconds", {})
        if not isinstance(walls, dict):
            walls = merged["wall_seconds"] = {}
        walls["+".join(args.tasks)] = round(time.monotonic() - t_start, 1)
        out.write_text(json.dumps(merged, indent=2, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
