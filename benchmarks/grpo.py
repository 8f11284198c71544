"""GRPO benchmarks (issue 14): what the anchor term costs, and SFT -> GRPO on a CPU, plain vs anchored.

    OMP_NUM_THREADS=1 python -m benchmarks.grpo cost --sft runs/prosqa_acot          # -> results/grpo_cost.json
    ANCHORED_REASONING_DATA=../shared/data python -m benchmarks.grpo train --sft runs/prosqa_acot \\
        --seeds 0 1 2 --steps 100 --eval-limit 200 [--diffusion-sft runs/diffusion_sft_prosqa_small_adlm]
                                                                                     # -> results/grpo.json + PNG
    python -m benchmarks.grpo diffusion --diffusion-sft runs/dsft_cot --seeds 0 1 2 --steps 200 \
        --diffusion-set sampler.steps=16 ...       # the diffu-GRPO row alone -> grpo.json["diffusion"] (docs/grpo.md)
    python -m benchmarks.grpo train --smoke --out /tmp/grpo_smoke.json              # tiny sizes, proves the pipeline

``cost``: one ACoT start (``--sft``; without it a logic-gpt2 ACoT checkpoint is trained for one step -- the
cost does not depend on how good it is), one batch of prompts. The same batch goes through TRL's plain
``GRPOTrainer`` and our ``AnchoredGRPOTrainer`` (gamma = 1), interleaved ``--repeats`` times in one
process: one generation + reward scoring per repeat (TRL's code, overridden by neither trainer) feeds
both trainers' loss + backward. Reports the medians and two ratios: the loss + backward alone (where the
anchor term lives) and the whole step (generation + scoring + loss + backward), with the quartiles of the
per-repeat loss ratio (the noise of a shared machine).

``train`` (item 5 of the issue): from an SFT checkpoint (``--sft``, method read from it), for each seed a
plain GRPO run (gamma = 0) and an anchored one (gamma = ``--gamma``) with the recipe ``--recipe``; every
checkpoint, the start included, is evaluated greedily by the evaluation runner on ``--eval-split``
(``--eval-limit`` problems, the same ones for all). Per seed: accuracy at the start and after GRPO,
McNemar's exact test and a paired bootstrap (after vs start, anchored vs plain). With
``--diffusion-sft``, the same for a diffusion checkpoint (diffu-GRPO, one run per seed). Reward curves as
PNG. Finished runs and evaluations are reused: rerun the same command to resume.

``diffusion``: the diffu-GRPO row alone (``--diffusion-set KEY=VALUE`` overrides its recipe), merged into
the JSON at ``--out`` under ``--diffusion-key`` (the AR rows and other settings kept); its reward curves
go to ``grpo_diffusion_rewards.png`` unless ``--png`` says otherwise.
"""
from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from anchored_reasoning.files import atomic_write
from anchored_reasoning.machine import machine_info

ROOT = Path(__file__).resolve().parents[1]

log = logging.getLogger("grpo_bench")
RESULTS = ROOT / "benchmarks" / "results"


def stamp(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    return {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine_info(),
            "threads": torch.get_num_threads(),
            "command": f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '?')} python -m benchmarks.grpo "
                       + " ".join(sys.argv[1:])}


def shown(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it (as the JSON records it)."""
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def write(out: Path, result: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, json.dumps(result, indent=2, default=str) + "\n")
    log.info("wrote %s", out)


# ------------------------------------------------------------------------------------------- starts

def tiny_sft(work: Path, diffusion: bool = False) -> Path:
    """Tiny SFT checkpoints (seconds) for --smoke runs: never evidence, only plumbing."""
    from anchored_reasoning.train.pipelines import ar
    from anchored_reasoning.train.pipelines import diffusion as dtrain

    out = work / ("dsft" if diffusion else "sft")
    if (out / "anchored_reasoning.json").is_file():
        return out
    if diffusion:
        return dtrain.run("diffusion_tiny_test", [f"output_dir={out}"])
    return ar.run("tiny_test", [f"output_dir={out}", "training.generation_eval=false", "training.curriculum=false"])


def cost_start(work: Path) -> Path:
    """A logic-gpt2 ACoT (k = 6) ProsQA checkpoint after one SFT step (its cost is that of a good one)."""
    from anchored_reasoning.train.pipelines import ar

    out = work / "sft_cost"
    if (out / "anchored_reasoning.json").is_file():
        return out
    return ar.run("prosqa_logic_cpu", [f"output_dir={out}", "method.name=acot", "method.options.k=6",
                                       "training.max_steps=1", "training.curriculum=false"])


# ------------------------------------------------------------------------------------------- cost

def measure_cost(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from trl import GRPOTrainer

    from anchored_reasoning.train.pipelines import grpo

    work = Path(args.work)
    sft = Path(args.sft) if args.sft else (tiny_sft(work) if args.smoke else cost_start(work))
    plan = grpo.prepare(args.recipe, [f"model.name={sft}", f"output_dir={work / 'cost_run'}", "training.gamma=1.0",
                                      f"training.per_device_train_batch_size={args.batch}",
                                      f"training.num_generations={args.generations}",
                                      f"training.max_completion_length={args.max_completion_length}",
                                      "training.max_train_seconds=null"])
    anchored, tok = grpo.build_trainer(plan)
    plain = GRPOTrainer(model=copy.deepcopy(anchored.model), reward_funcs=plan.rewards.funcs, args=plan.config,
                        train_dataset=anchored.train_dataset, processing_class=tok)
    rows = [dict(anchored.train_dataset[i % len(anchored.train_dataset)])
            for i in range(args.batch // args.generations) for _ in range(args.generations)]
    times: dict[str, dict[str, list[float]]] = {n: {"generate": [], "loss_backward": []} for n in ("plain", "anchored")}
    slots = []
    for rep in range(args.repeats + 1):  # the first round warms up and is not counted
        # One generation + reward scoring per repeat (TRL's code, which neither trainer overrides) feeds both
        # trainers: the same batch by construction, and no generation noise in the ratio.
        plain.model.train()
        torch.manual_seed(1000 + rep)
        t0 = time.perf_counter()
        inputs = plain._generate_and_score_completions([dict(r) for r in rows])
        gen = time.perf_counter() - t0
        order = [("plain", plain), ("anchored", anchored)] if rep % 2 == 0 else [("anchored", anchored), ("plain", plain)]
        for name, trainer in order:
            trainer.model.train()
            trainer.current_gradient_accumulation_steps = 1
            trainer.model.zero_grad(set_to_none=True)
            t1 = time.perf_counter()
            loss = trainer.compute_loss(trainer.model, inputs)
            loss.backward()
            t2 = time.perf_counter()
            if rep:
                times[name]["generate"].append(gen)
                times[name]["loss_backward"].append(t2 - t1)
        if anchored.anchor_table is not None:
            labels = anchored.anchor_table.labels_for(inputs["prompt_ids"], inputs["prompt_mask"], inputs["prompt_ids"].size(1))
            slots.append(int((labels != -100).sum()) if labels is not None else 0)
    med = {n: {k: statistics.median(v) for k, v in t.items()} for n, t in times.items()}
    full = {n: m["generate"] + m["loss_backward"] for n, m in med.items()}
    # the two trainers run back to back in each repeat: per-repeat ratios show the noise of a shared machine
    paired = sorted(a / p for a, p in zip(times["anchored"]["loss_backward"], times["plain"]["loss_backward"]))
    quartiles = statistics.quantiles(paired, n=4) if len(paired) > 1 else paired * 3
    return {
        "start": str(sft), "batch": args.batch, "num_generations": args.generations,
        "max_completion_length": args.max_completion_length, "repeats": args.repeats,
        "anchor_labels_per_batch": statistics.median(slots) if slots else 0,
        "median_seconds": med, "full_step_seconds": full,
        "ratio_loss_backward": med["anchored"]["loss_backward"] / med["plain"]["loss_backward"],
        "ratio_full_step": full["anchored"] / full["plain"],
        "ratio_loss_backward_per_repeat_quartiles": quartiles,
        "goal": "anchored step <= 1.10 x plain GRPOTrainer step on the same batch",
    }


# ------------------------------------------------------------------------------------------- train

def evaluate(ckpt: Path, out: Path, args: argparse.Namespace) -> Path:
    """Greedy evaluation through the evaluation runner (what ``anchored-reasoning eval`` does)."""
    from anchored_reasoning.backends import get_backend
    from anchored_reasoning.checkpoints import read_checkpoint_meta
    from anchored_reasoning.eval.methods import build_method
    from anchored_reasoning.eval.runner import run_eval

    meta = read_checkpoint_meta(ckpt) or {}
    if (out / "summary.json").is_file():
        return out
    if meta.get("backend") == "diffusion":
        backend = get_backend("diffusion", str(ckpt), sampler="low_confidence")
    else:
        backend = get_backend("hf", str(ckpt), batch_size=32)
    examples = None
    if args.eval_generator is not None:  # held-out problems from the task's generator (seed 999, not a training seed)
        from anchored_reasoning.train.data.data_sources import generate_examples

        examples = generate_examples(meta.get("task"), args.eval_limit, 999, json.loads(args.eval_generator),
                                     split="heldout")
    run_eval(meta.get("task"), backend, build_method(None, ckpt), out_dir=out, split=args.eval_split,
             limit=args.eval_limit, temperature=0.0, max_new_tokens=args.max_new_tokens, progress=False,
             examples=examples)
    return out


def grpo_run(recipe: str, start: Path, out: Path, seed: int, overrides: list[str]) -> Path:
    from anchored_reasoning.train.pipelines import grpo

    # Always through the trainer (train/checkpointing.py): a finished run with this recipe returns at once,
    # a killed one resumes from its newest checkpoint, one with other settings is refused with the differing keys.
    return grpo.run(recipe, [f"model.name={start}", f"output_dir={out}", f"seed={seed}", *overrides])


def reward_curve(run: Path) -> list[tuple[int, float]]:
    summary = json.loads((run / "train_summary.json").read_text())
    return [(int(h["step"]), float(h["reward"])) for h in summary["log_history"] if "reward" in h]


def compare(a: Path, b: Path) -> dict[str, Any]:
    from anchored_reasoning.eval.compare import load_run, paired_test

    return paired_test(load_run(a), load_run(b))


def accuracy(run: Path) -> float:
    from anchored_reasoning.eval.compare import load_run

    records = load_run(run).records
    return sum(bool(r.get("correct")) for r in records) / max(len(records), 1)


def plot(curves: dict[str, list[tuple[int, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, points in sorted(curves.items()):
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], label=label,
                    linestyle="--" if label.startswith("plain") else "-")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward (weighted sum)")
    ax.set_title("GRPO reward curves")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def train_bench(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work)
    sft = Path(args.sft) if args.sft else tiny_sft(work)
    steps = [f"training.max_steps={args.steps}"] + (["training.max_train_seconds=null"] if args.smoke else [])
    start_eval = evaluate(sft, work / "eval-start", args)
    result: dict[str, Any] = {"start": str(sft), "recipe": args.recipe, "overrides": list(args.set), "steps": args.steps,
                              "gamma": args.gamma,
                              "eval_split": args.eval_split if args.eval_generator is None else "generated",
                              "eval_generator": args.eval_generator, "eval_limit": args.eval_limit,
                              "start_accuracy": accuracy(start_eval), "per_seed": {}}
    curves: dict[str, list[tuple[int, float]]] = {}
    for seed in args.seeds:
        row: dict[str, Any] = {"start_accuracy": result["start_accuracy"]}
        evals = {}
        for variant, gamma in (("plain", 0.0), ("anchored", args.gamma)):
            out = grpo_run(args.recipe, sft, work / f"{variant}-s{seed}", seed,
                           steps + list(args.set) + [f"training.gamma={gamma}"])
            evals[variant] = evaluate(out, work / f"eval-{variant}-s{seed}", args)
            row[variant] = {"accuracy": accuracy(evals[variant]), "vs_start": compare(evals[variant], start_eval)}
            curves[f"{variant} seed {seed}"] = reward_curve(out)
        row["anchored_vs_plain"] = compare(evals["anchored"], evals["plain"])
        result["per_seed"][str(seed)] = row
        log.info("seed %d: start %.3f plain %.3f anchored %.3f", seed, row["start_accuracy"],
                 row["plain"]["accuracy"], row["anchored"]["accuracy"])
    for variant in ("plain", "anchored"):
        accs = [r[variant]["accuracy"] for r in result["per_seed"].values()]
        result[f"{variant}_mean_accuracy"] = statistics.mean(accs)
        result[f"{variant}_mean_gain"] = statistics.mean(accs) - result["start_accuracy"]
    if args.diffusion_sft or args.smoke:
        result["diffusion"] = diffusion_bench(args, work, curves)
    result["reward_curves"] = {k: v for k, v in curves.items()}
    png = Path(args.png)
    plot(curves, png)
    result["reward_curves_png"] = shown(png)
    return result


def diffusion_bench(args: argparse.Namespace, work: Path, curves: dict[str, list[tuple[int, float]]]) -> dict[str, Any]:
    """diffu-GRPO from a diffusion SFT start, one run per seed, each evaluated against the start."""
    dsft = Path(args.diffusion_sft) if args.diffusion_sft else tiny_sft(work, diffusion=True)
    steps = [f"training.max_steps={args.steps}"] + (["training.max_train_seconds=null"] if args.smoke else [])
    d_start = evaluate(dsft, work / "eval-dstart", args)
    row: dict[str, Any] = {"start": str(dsft), "recipe": args.diffusion_recipe, "overrides": list(args.diffusion_set),
                           "start_accuracy": accuracy(d_start), "per_seed": {}}
    for seed in args.seeds:
        d_out = grpo_run(args.diffusion_recipe, dsft, work / f"diffusion-s{seed}", seed, steps + list(args.diffusion_set))
        d_eval = evaluate(d_out, work / f"eval-diffusion-s{seed}", args)
        curves[f"diffusion seed {seed}"] = reward_curve(d_out)
        summary = json.loads((d_out / "train_summary.json").read_text())
        row["per_seed"][str(seed)] = {"accuracy": accuracy(d_eval), "vs_start": compare(d_eval, d_start),
                                      "steps": summary.get("global_steps"), "train_seconds": summary.get("train_seconds"),
                                      "reward_curve": curves[f"diffusion seed {seed}"]}
        log.info("diffusion seed %d: start %.3f after GRPO %.3f", seed, row["start_accuracy"], row["per_seed"][str(seed)]["accuracy"])
    accs = [r["accuracy"] for r in row["per_seed"].values()]
    row["mean_accuracy"] = statistics.mean(accs)
    row["mean_gain"] = row["mean_accuracy"] - row["start_accuracy"]
    return row


def diffusion_only(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """``diffusion`` mode: the diffu-GRPO row alone, merged into the JSON already at ``out`` (its AR rows kept)."""
    result = json.loads(out.read_text()) if out.is_file() else {}
    curves: dict[str, list[tuple[int, float]]] = {}
    row = diffusion_bench(args, Path(args.work), curves)
    row["reward_curves_png"] = shown(Path(args.png))
    row.update(stamp(args), eval_generator=args.eval_generator, eval_limit=args.eval_limit)
    plot(curves, Path(args.png))
    result[args.diffusion_key] = row
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=["cost", "train", "diffusion"])
    p.add_argument("--sft", help="the SFT start checkpoint (default: trained here, see the docstring)")
    p.add_argument("--recipe", default="grpo_prosqa_logic_cpu")
    p.add_argument("--diffusion-sft", help="a diffusion SFT checkpoint for the diffu-GRPO row (train mode)")
    p.add_argument("--diffusion-recipe", default="grpo_diffusion_prosqa_small")
    p.add_argument("--diffusion-key", default="diffusion",
                   help="diffusion mode: the key of the JSON the row is written under (a second setting beside the first)")
    p.add_argument("--diffusion-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a recipe override for every diffusion GRPO run (repeatable), e.g. sampler.steps=16")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="train: a recipe override for every AR GRPO run (repeatable), e.g. the training problems' size")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--gamma", type=float, default=1.0)
    p.add_argument("--eval-split", default="test")
    p.add_argument("--eval-limit", type=int, default=200)
    p.add_argument("--eval-generator", metavar="JSON", help="evaluate on --eval-limit generated held-out problems "
                   "with these generator params (e.g. '{\"num_nodes\": 7, \"min_hops\": 1, \"max_hops\": 2}') instead of --eval-split")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--batch", type=int, default=16, help="cost: completions per step")
    p.add_argument("--generations", type=int, default=8, help="cost: completions per prompt")
    p.add_argument("--max-completion-length", type=int, default=64)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work", default=str(ROOT / "runs" / "bench_grpo"))
    p.add_argument("--smoke", action="store_true", help="tiny models and sizes: proves the pipeline, measures nothing")
    p.add_argument("--out", help="result JSON (default: benchmarks/results/grpo.json or grpo_cost.json)")
    p.add_argument("--png", default=str(RESULTS / "grpo_rewards.png"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    import torch

    torch.set_num_threads(args.threads)
    if args.smoke:
        args.recipe = "grpo_tiny_test" if args.recipe == "grpo_prosqa_logic_cpu" else args.recipe
        args.diffusion_recipe = "grpo_diffusion_tiny_test"
        args.steps, args.eval_limit, args.seeds = min(args.steps, 2), min(args.eval_limit, 8), args.seeds[:3]
        args.repeats, args.batch, args.generations, args.max_completion_length = 2, 8, 4, 12
        args.max_new_tokens = min(args.max_new_tokens, 16)
        args.eval_generator = args.eval_generator or '{"num_nodes": 6, "min_hops": 1, "max_hops": 2}'  # tiny contexts
        if args.out is None or Path(args.out).resolve().parent == RESULTS.resolve():
            raise SystemExit("--smoke measures nothing: pass --out outside benchmarks/results/")
        args.png = str(Path(args.out).with_suffix(".png"))
    out = Path(args.out) if args.out else RESULTS / ("grpo_cost.json" if args.mode == "cost" else "grpo.json")
    if args.mode == "diffusion":
        if not args.diffusion_sft and not args.smoke:
            raise SystemExit("diffusion mode needs --diffusion-sft (a diffusion SFT checkpoint above chance)")
        if args.png == str(RESULTS / "grpo_rewards.png"):  # (--smoke has already put it beside --out)
            args.png = str(RESULTS / "grpo_diffusion_rewards.png")
        write(out, diffusion_only(args, out))
        return
    result = measure_cost(args) if args.mode == "cost" else train_bench(args)
    result.update(stamp(args), smoke=bool(args.smoke))
    write(out, result)
    print(json.dumps({k: v for k, v in result.items() if k not in ("reward_curves", "per_seed")}, indent=2, default=str))


if __name__ == "__main__":
    main()
