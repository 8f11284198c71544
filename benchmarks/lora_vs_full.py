"""LoRA against full fine-tuning at equal steps: SmolLM2-135M-Instruct on small shortcut-free ProsQA (1-2 hops,
the wrong option as deep as the right one), CoT and the written anchors (``anchor_chain``).

    python -m benchmarks.lora_vs_full --work-dir runs/lora_vs_full                 # trains what is missing
    python -m benchmarks.lora_vs_full --work-dir runs/lora_vs_full --no-train      # only the finished runs

Each run is ``anchored-reasoning train <work-dir>/recipe.yaml method.name=M [peft.r=16 ...] output_dir=...``: the
same recipe, data, seed and steps; LoRA (r 16, alpha 32, every linear layer, the format's new token rows trained)
at its usual ten times the full fine-tune's learning rate. One process at a time, one thread; a finished run is
reused. Graded by the recipe's greedy validation after the last step on held-out problems (half at 1 hop, half at
2; none in training). Per run: accuracy with a 95% bootstrap interval (chance 0.5), per depth, mean generated
tokens, training tokens per second (``train_runtime``, the end-of-training validation excluded), peak resident
memory of the training process (``ru_maxrss``, validation included), trained parameters; per method the LoRA minus
full difference paired over the problems (bootstrap interval, exact McNemar test). Writes
``benchmarks/results/lora_vs_full.json``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import accuracy_ci, last_validation, paired_with, write_result

logger = logging.getLogger("benchmarks.lora_vs_full")

OUT = Path("benchmarks/results/lora_vs_full.json")
METHODS: dict[str, list[str]] = {
    "cot": ["method.name=cot"],
    "anchor_chain": ["method.name=anchor_chain", "method.options.revisits=true", "method.options.mark_backups=true"],
}
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "all-linear"}
HOPS_OF_SOURCE = {"0": 1, "1": 2}


def recipe(steps: int, n_eval: int, lr: float) -> dict[str, Any]:
    def source(n: int, seed: int, hops: int) -> dict[str, Any]:
        return {"generator": "prosqa", "n": n, "seed": seed,
                "params": {"num_nodes": 4 + 4 * hops, "min_hops": hops, "max_hops": hops, "neg_depth": "match"}}

    return {
        "trainer": "ar", "task": "prosqa", "seed": 0, "model": {"name": "smollm2-135m"},
        "method": {"name": "cot"},
        "data": {"train": {"trace": "dfs", "mix": [source(1000, 0, 1), source(1000, 1, 2)]},
                 "valid": {"mix": [source(n_eval // 2, 100, 1), source(n_eval - n_eval // 2, 101, 2)]}},
        "training": {"max_steps": steps, "per_device_train_batch_size": 8, "learning_rate": lr,
                     "lr_scheduler_type": "constant_with_warmup", "warmup_steps": 5, "weight_decay": 0.0,
                     "logging_steps": 10, "generation_eval": True, "generation_eval_every_stage": False,
                     "generation_eval_samples": n_eval, "generation_max_new_tokens": 128,
                     "generation_batch_size": 16, "save_strategy": "no", "disable_tqdm": True},
    }


def command(recipe_path: Path, method: str, lora: bool, lr: float, run_dir: Path) -> list[str]:
    extra = [f"peft.{k}={v}" for k, v in LORA.items()] if lora else []
    return ["anchored-reasoning", "train", str(recipe_path), *METHODS[method], *extra,
            f"training.learning_rate={lr}", f"output_dir={run_dir}"]


def train(cmd: list[str], env: dict[str, str]) -> int:
    """Run ``cmd`` (``anchored-reasoning ...`` as ``python -m anchored_reasoning.cli ...``, this interpreter); return
    its peak resident memory in kB (``ru_maxrss`` of that process alone)."""
    proc = subprocess.Popen([sys.executable, "-m", "anchored_reasoning.cli", *cmd[1:]], env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed with exit status {proc.returncode}")
    return int(usage.ru_maxrss)


def read_run(run_dir: Path) -> dict[str, Any]:
    path = last_validation(run_dir)
    if path is None:
        raise FileNotFoundError(f"{run_dir} has no validation records (did the run finish?)")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    summary = json.loads((run_dir / "train_summary.json").read_text())
    logs = summary["log_history"]
    runtime = next(e["train_runtime"] for e in reversed(logs) if "train_runtime" in e)
    tokens = max(e.get("num_tokens", 0) for e in logs)
    meta = json.loads((run_dir / "anchored_reasoning.json").read_text())
    by_hop: dict[int, list[int]] = {}
    for r in records:
        by_hop.setdefault(HOPS_OF_SOURCE[r["id"].split("-")[1].removeprefix("valid")], []).append(int(bool(r["correct"])))
    stats = json.loads((run_dir / "run_stats.json").read_text()) if (run_dir / "run_stats.json").is_file() else {}
    return {
        "correct": {r["id"]: int(bool(r["correct"])) for r in records},
        **accuracy_ci([int(bool(r["correct"])) for r in records]),
        "by_hops": {str(h): accuracy_ci(v) for h, v in sorted(by_hop.items())},
        "mean_tokens": round(sum(r["tokens"] for r in records) / len(records), 1),
        "steps": summary["global_steps"], "train_tokens": int(tokens), "train_runtime_s": round(runtime, 1),
        "train_tokens_per_s": round(tokens / runtime, 1),
        "trainable_parameters": (meta.get("peft") or {}).get("trainable_parameters", summary.get("parameters")),
        "parameters": summary.get("parameters"), "final_train_loss": _last(logs, "loss"),
        "peak_rss_mb": round(stats["peak_rss_kb"] / 1024, 1) if stats.get("peak_rss_kb") else None,
    }


def _last(logs: list[dict[str, Any]], key: str) -> float | None:
    return next((round(e[key], 4) for e in reversed(logs) if key in e), None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work-dir", default="runs/lora_vs_full")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--n-eval", type=int, default=120, help="held-out problems, half at 1 hop, half at 2")
    p.add_argument("--lr", type=float, default=5e-5, help="full fine-tuning's learning rate (LoRA: 10x)")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--no-train", action="store_true")
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    recipe_path = work / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe(args.steps, args.n_eval, args.lr), sort_keys=False))
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    runs: dict[str, dict[str, Any]] = {}
    commands: dict[str, str] = {}
    for method in args.methods:
        for mode, lr in (("full", args.lr), ("lora", args.lr * 10)):
            name, run_dir = f"{method}_{mode}", work / f"{method}_{mode}"
            cmd = command(recipe_path, method, mode == "lora", lr, run_dir)
            commands[name] = " ".join(cmd)
            if not (run_dir / "train_summary.json").is_file():
                if args.no_train:
                    logger.warning("%s is not finished: left out", run_dir)
                    continue
                logger.info("training %s: %s", name, commands[name])
                t0 = time.monotonic()
                peak = train(cmd, env)
                (run_dir / "run_stats.json").write_text(json.dumps(
                    {"peak_rss_kb": peak, "wall_s": round(time.monotonic() - t0, 1)}) + "\n")
            runs[name] = read_run(run_dir)
    pairs = {m: paired_with({0: runs[f"{m}_lora"]["correct"]}, {0: runs[f"{m}_full"]["correct"]})
             for m in args.methods if f"{m}_lora" in runs and f"{m}_full" in runs}
    for pair in pairs.values():
        if pair:  # paired_with names the second side "cot"; here it is the full fine-tune
            pair["only_full_right"] = pair.pop("only_cot_right")
            pair["only_lora_right"] = pair.pop("only_this_right")
    result = {
        "question": "At equal steps, does LoRA (r 16, new token rows trained) reach full fine-tuning's accuracy on "
                    "held-out 1-2-hop shortcut-free ProsQA with SmolLM2-135M, and at what speed and memory?",
        "model": "smollm2-135m (SmolLM2-135M-Instruct, fp32)", "chance": 0.5,
        "held_out": f"{args.n_eval} problems, half at 1 hop, half at 2, none in training",
        "settings": {"steps": args.steps, "batch": 8, "lr_full": args.lr, "lr_lora": args.lr * 10, "lora": LORA},
        "recipe": recipe(args.steps, args.n_eval, args.lr), "commands": commands,
        "runs": {k: {kk: vv for kk, vv in v.items() if kk != "correct"} for k, v in runs.items()},
        "lora_minus_full": pairs,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "threads": int(env["OMP_NUM_THREADS"]),
                    "processes": "one thread per training process; the methods ran side by side, one per core, on a machine shared with other jobs (load 2-5)", "python": sys.version.split()[0]},
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": "python -m benchmarks.lora_vs_full " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    write_result(args.out, result)
    for name, r in result["runs"].items():
        print(f"{name}: {r['accuracy']:.3f} {r['ci95']} at {r['mean_tokens']} tokens, {r['train_tokens_per_s']} "
              f"train tokens/s, peak {r['peak_rss_mb']} MB, {r['trainable_parameters']} trained parameters")
    for method, pair in pairs.items():
        if pair:
            print(f"{method}: LoRA minus full {pair['diff']:+.3f} {pair['ci95']} (McNemar p = {pair['mcnemar_p']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
