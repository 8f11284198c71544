"""``anchored-reasoning demo``: No-CoT vs CoT vs pause vs ACoT on generated ProsQA, on a CPU, in minutes.

    anchored-reasoning demo                          # ~12 minutes of work on 2 CPU cores
    anchored-reasoning demo --budget-minutes 5 --out runs/demo-5min --seed 1

What it does, offline:

1. generates small ProsQA problems (Coconut's construction at a reduced size: 7 nodes drawn,
   1-2 hop answers, ~35 words per question instead of ~200) -- training problems and held-out
   problems from different seeds, held-out questions that also occur in training removed;
2. fine-tunes the shipped ``logic-gpt2`` backbone (a 4-layer d=128 GPT-2 pretrained on generated
   logic text, see anchored_reasoning.train.backbone) once per method, each for the same
   wall-clock budget (``--backbone none``: a 2-layer GPT-2 from scratch with a tokenizer trained
   on the generated text instead); ACoT follows the paper's curriculum (one more [ANT] slot and
   one reasoning step fewer per stage, optimizer reset at each switch), squeezed into the budget;
3. evaluates each checkpoint through the evaluation runner (HF backend, greedy) on the held-out
   problems and, when ``$ANCHORED_REASONING_DATA`` holds the real ProsQA test split, on its first
   ``--real-n`` problems (full-size graphs: out of the training distribution at this scale);
4. prints a table (accuracy with a 95% bootstrap interval, mean generated tokens, steps trained),
   and writes ``summary.json``, ``results.md`` and ``demo.png`` to ``--out``.

This is a small-scale, time-boxed run: full-size ProsQA needs the GPU recipes in ``train/``.
Rerunning with the same settings reuses finished checkpoints and evaluations.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEMO_METHODS = ["nocot", "cot", "pause", "acot"]
#: ProsQA generator size of the demo problems (the real files: 28 nodes drawn, >= 3 hops).
DEMO_SIZE = {"num_nodes": 7, "min_hops": 1, "max_hops": 2}
METHOD_OPTIONS: dict[str, dict[str, Any]] = {
    "nocot": {},
    "cot": {},
    "pause": {"k": 3, "remove_steps_per_stage": 1},  # ACoT's exact schedule, no anchor loss
    "acot": {"k": 3, "remove_steps_per_stage": 1},
    "stepwise": {"stages": 2},
}
CURRICULUM = {"acot", "pause", "stepwise"}


@dataclass
class DemoSettings:
    """Everything that determines a demo run (a rerun with equal settings resumes)."""

    methods: list[str] = field(default_factory=lambda: list(DEMO_METHODS))
    seed: int = 0
    budget_minutes: float = 12.0
    train_n: int = 20000
    eval_n: int = 200
    real_n: int = 100
    size: dict[str, Any] = field(default_factory=lambda: dict(DEMO_SIZE))
    #: Model every method fine-tunes: a checkpoint, alias or Hub id (default: the shipped
    #: ``logic-gpt2`` backbone); None trains ``preset`` from scratch with a tokenizer trained here.
    backbone: str | None = "logic-gpt2"
    preset: str = "gpt2-tiny"
    learning_rate: float = 1e-3
    batch_size: int = 32
    max_new_tokens: int = 64
    real_max_new_tokens: int = 128
    threads: int | None = None


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo",
        help="train No-CoT, CoT, pause and ACoT on generated ProsQA and compare them (CPU, minutes)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    p.add_argument("--budget-minutes", type=float, default=12.0, help="total time budget for training + evaluation (default 12)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--methods", default=",".join(DEMO_METHODS), help="comma-separated (nocot,cot,pause,acot,stepwise)")
    p.add_argument("--train-n", type=int, default=20000, help="generated training problems (default 20000)")
    p.add_argument("--eval-n", type=int, default=200, help="held-out generated problems (default 200)")
    p.add_argument("--real-n", type=int, default=100, help="real ProsQA test problems when $ANCHORED_REASONING_DATA is set (0: skip)")
    p.add_argument("--backbone", default="logic-gpt2",
                   help="model every method fine-tunes: alias, checkpoint folder or Hub id (default: the shipped "
                        "logic-gpt2); 'none' trains a 2-layer GPT-2 from scratch instead")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.set_defaults(func=main)


def parse_backbone(value: str | None) -> str | None:
    """``--backbone`` as typed -> the model to fine-tune, or None for from scratch ('none', 'scratch', '')."""
    return None if value is None or str(value).lower() in ("none", "scratch", "") else str(value)


def main(args: argparse.Namespace) -> int:
    settings = DemoSettings(
        methods=[m.strip() for m in args.methods.split(",") if m.strip()],
        seed=args.seed,
        budget_minutes=args.budget_minutes,
        train_n=args.train_n,
        eval_n=args.eval_n,
        real_n=args.real_n,
        threads=args.threads,
        backbone=parse_backbone(args.backbone),
    )
    summary = run_demo(settings, Path(args.out))
    print(render_table(summary))
    print(f"\nwrote {Path(args.out) / 'summary.json'}, {Path(args.out) / 'results.md'}, {Path(args.out) / 'demo.png'}")
    return 0


# ---------------------------------------------------------------------------------------------
# data


def make_data(settings: DemoSettings) -> tuple[list, list]:
    from anchored_reasoning.generators.prosqa import generate_dataset

    train = generate_dataset(settings.train_n, seed=settings.seed, split="demo-train", **settings.size)
    seen = {ex.question for ex in train}
    held: list = []
    batch_seed = settings.seed + 10_000
    while len(held) < settings.eval_n:
        fresh = generate_dataset(max(settings.eval_n * 2, 50), seed=batch_seed, split=f"demo-test{batch_seed}", **settings.size)
        held.extend(ex for ex in fresh if ex.question not in seen)
        seen.update(ex.question for ex in fresh)
        batch_seed += 1
    held = held[: settings.eval_n]
    for i, ex in enumerate(held):
        ex.id = f"demo-test-{i}"
    return train, held


def real_test(settings: DemoSettings) -> list:
    """The first ``real_n`` problems of the real ProsQA test split, or [] when no local data is set."""
    if settings.real_n <= 0 or not os.environ.get("ANCHORED_REASONING_DATA"):
        return []
    from anchored_reasoning.tasks import get_task

    try:
        return list(get_task("prosqa").load("test", limit=settings.real_n))
    except Exception as exc:  # noqa: BLE001 - the real split is optional for the demo
        log.warning("real ProsQA test split not loaded (%s); evaluating on generated problems only", exc)
        return []


def shared_tokenizer(train: list, out: Path, methods: list[str]) -> Path:
    """One tokenizer for every method, trained on every method's rendered text."""
    from anchored_reasoning.methods import get_method
    from anchored_reasoning.methods.anchored import add_special_tokens
    from anchored_reasoning.train.ar import build_tokenizer_from_texts, training_texts

    path = out / "tokenizer"
    if (path / "tokenizer.json").is_file():
        return path
    texts: list[str] = []
    for name in methods:
        method = get_method(name, style="trained", **METHOD_OPTIONS.get(name, {}))
        texts.extend(training_texts(train[:2000], method, "prosqa"))
    tok = build_tokenizer_from_texts(texts, path, vocab_size=512)
    add_special_tokens(tok)
    tok.save_pretrained(path)
    return path


# ---------------------------------------------------------------------------------------------
# train + evaluate one method


def method_recipe(
    name: str,
    settings: DemoSettings,
    tokenizer: Path | None,
    out_dir: Path,
    train_seconds: float,
    *,
    task: str = "prosqa",
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``ar`` recipe of one time-boxed run (also used by benchmarks/acot_vs_cot.py).

    With ``settings.backbone`` the run fine-tunes that model (and its tokenizer); otherwise it
    trains ``settings.preset`` from scratch with ``tokenizer``."""
    curriculum = name in CURRICULUM
    if settings.backbone:
        model = {"name": settings.backbone}
    else:
        if tokenizer is None:
            raise ValueError("a from-scratch run (backbone=None) needs a tokenizer")
        model = {"preset": settings.preset, "tokenizer": str(tokenizer)}
    return {
        "trainer": "ar",
        "task": task,
        "seed": settings.seed,
        "output_dir": str(out_dir),
        "model": model,
        "method": {"name": name, "options": dict(METHOD_OPTIONS.get(name, {}) if options is None else options)},
        "training": {
            "max_steps": 1_000_000,  # the time budget stops training
            "max_train_seconds": float(train_seconds),
            "per_device_train_batch_size": settings.batch_size,
            "learning_rate": settings.learning_rate,
            "lr_scheduler_type": "constant_with_warmup",
            "warmup_steps": 20,
            "weight_decay": 0.0,
            "logging_steps": 25,
            "curriculum": curriculum,
            "curriculum_schedule": "fraction",
            "reset_optimizer_on_stage": True,
            "generation_eval": False,
            "disable_tqdm": True,
            "dataloader_pin_memory": False,
        },
    }


def train_method(name: str, train: list, settings: DemoSettings, tokenizer: Path | None, out: Path, train_seconds: float) -> dict[str, Any]:
    from anchored_reasoning.train import ar

    ckpt = out / name / "model"
    done = ckpt / "train_summary.json"
    if done.is_file() and (ckpt / "anchored_reasoning.json").is_file():
        log.info("%s: reusing the finished checkpoint in %s", name, ckpt)
    else:
        recipe = method_recipe(name, settings, tokenizer, ckpt, train_seconds)
        ar.run_with_examples(recipe, train, [])
    summary = json.loads(done.read_text())
    losses = [h for h in summary["log_history"] if "lm_loss" in h]
    return {
        "checkpoint": str(ckpt),
        "steps": summary["global_steps"],
        "train_seconds": summary["train_seconds"],
        "final_stage": summary["final_stage"],
        "stages_planned": summary["stages_planned"],
        "final_lm_loss": losses[-1]["lm_loss"] if losses else None,
        "final_anchor_loss": next((h["anchor_loss"] for h in reversed(losses) if "anchor_loss" in h), None),
        "final_anchor_accuracy": next((h["anchor_accuracy"] for h in reversed(losses) if "anchor_accuracy" in h), None),
    }


def evaluate(ckpt: str, examples: list, out_dir: Path, max_new_tokens: int, task: str = "prosqa") -> dict[str, Any]:
    """Greedy evaluation through the runner, prompting the checkpoint with the method it was trained with."""
    from anchored_reasoning.backends import get_backend
    from anchored_reasoning.eval.runner import build_method, run_eval

    backend = get_backend("hf", ckpt, batch_size=64, device="cpu")
    method = build_method(None, ckpt)
    summary = run_eval(task, backend, method, out_dir=out_dir, examples=examples, max_new_tokens=max_new_tokens, progress=False)
    acc = summary["accuracy"]
    return {
        "accuracy": acc["mean"],
        "accuracy_ci95": [acc["ci_low"], acc["ci_high"]],
        "mean_generated_tokens": summary["tokens"]["mean"],
        "n": acc["n"],
        "no_answer": summary["counts"]["no_answer"],
        "truncated": summary["counts"]["truncated"],
        "eval_seconds": summary.get("wall_seconds"),
    }


# ---------------------------------------------------------------------------------------------
# the whole demo


def run_demo(settings: DemoSettings, out: Path) -> dict[str, Any]:
    import torch

    t0 = time.monotonic()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    out.mkdir(parents=True, exist_ok=True)
    settings_file = out / "demo_settings.json"
    identity = {k: v for k, v in asdict(settings).items() if k != "threads"}  # threads do not change what is trained
    current = json.dumps(identity, sort_keys=True)
    if settings_file.is_file() and settings_file.read_text().strip() != current:
        from anchored_reasoning.errors import ResumeError

        raise ResumeError(f"{out} holds a demo run with other settings ({settings_file}); use another --out or remove it")
    settings_file.write_text(current + "\n")

    train, held = make_data(settings)
    real = real_test(settings)
    tokenizer = None if settings.backbone else shared_tokenizer(train, out, settings.methods)
    setup_s = time.monotonic() - t0

    # Equal training time per method; evaluation time is reserved up front from a rough per-example cost.
    budget = settings.budget_minutes * 60.0
    eval_reserve = len(settings.methods) * (5.0 + 0.08 * len(held) + 0.25 * len(real))
    train_seconds = max(2.0, (budget - setup_s - eval_reserve) / max(len(settings.methods), 1))
    log.info(
        "demo: %d train / %d held-out generated problems, %d real; %.0fs of training per method",
        len(train), len(held), len(real), train_seconds,
    )

    results: dict[str, Any] = {}
    for name in settings.methods:
        t_m = time.monotonic()
        info = train_method(name, train, settings, tokenizer, out, train_seconds)
        info["generated"] = evaluate(info["checkpoint"], held, out / name / "eval_generated", settings.max_new_tokens)
        if real:
            info["real_prosqa"] = evaluate(info["checkpoint"], real, out / name / "eval_real", settings.real_max_new_tokens)
        info["wall_seconds"] = round(time.monotonic() - t_m, 1)
        results[name] = info
        g = info["generated"]
        log.info("%s: accuracy %.3f, %.1f tokens, %d steps", name, g["accuracy"], g["mean_generated_tokens"], info["steps"])

    summary = {
        "settings": asdict(settings),
        "scale": {
            "problems": f"generated ProsQA, generator size {settings.size}",
            "model": (f"{settings.backbone} fine-tuned" if settings.backbone
                      else f"{settings.preset} from scratch (see anchored_reasoning.train.ar.MODEL_PRESETS)"),
            "train_seconds_per_method": round(train_seconds, 1),
            "real_prosqa_test_examples": len(real),
            "real_prosqa_note": "first real_n problems of the real test split (full-size graphs, out of the training distribution)"
            if real else "not evaluated ($ANCHORED_REASONING_DATA unset or real_n=0)",
        },
        "methods": results,
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "torch_threads": torch.get_num_threads()},
        "total_seconds": round(time.monotonic() - t0, 1),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (out / "results.md").write_text(render_table(summary) + "\n")
    plot(summary, out / "demo.png")
    return summary


def _fmt_acc(r: dict[str, Any] | None) -> str:
    if not r:
        return "-"
    lo, hi = r["accuracy_ci95"]
    if any(isinstance(v, float) and math.isnan(v) for v in (lo, hi)):
        return f"{r['accuracy']:.3f}"
    return f"{r['accuracy']:.3f} [{lo:.2f}, {hi:.2f}]"


def render_table(summary: dict[str, Any]) -> str:
    real = any("real_prosqa" in r for r in summary["methods"].values())
    head = "| method | accuracy (held-out generated) | mean generated tokens | steps | train s | final LM loss | [ANT] top-1 |"
    sep = "|---|---|---|---|---|---|---|"
    if real:
        head += " real ProsQA test (first %d) | tokens (real) |" % summary["scale"]["real_prosqa_test_examples"]
        sep += "---|---|"
    lines = [
        f"ProsQA demo: {summary['scale']['problems']}; {summary['scale']['model']}; "
        f"{summary['scale']['train_seconds_per_method']} s of training per method",
        "",
        head,
        sep,
    ]
    for name, r in summary["methods"].items():
        g = r["generated"]
        loss = f"{r['final_lm_loss']:.3f}" if r.get("final_lm_loss") is not None else "-"
        anchor = f"{r['final_anchor_accuracy']:.2f}" if r.get("final_anchor_accuracy") is not None else "-"
        row = (f"| {name} | {_fmt_acc(g)} | {g['mean_generated_tokens']:.1f} | {r['steps']} | {r['train_seconds']:.0f} "
               f"| {loss} | {anchor} |")
        if real:
            rr = r.get("real_prosqa")
            row += f" {_fmt_acc(rr)} | {rr['mean_generated_tokens']:.1f} |" if rr else " - | - |"
        lines.append(row)
    lines.append("")
    lines.append(
        "Picking one of the two candidate concepts at random scores 0.5; a model that has not learned the answer "
        "format scores less. Intervals: 95% bootstrap over problems. LM loss and [ANT] top-1 accuracy: last logged "
        "training values (the loss is on each method's own target, so it is comparable only between equal formats)."
    )
    return "\n".join(lines)


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["methods"])
    gen = [summary["methods"][n]["generated"] for n in names]
    real = [summary["methods"][n].get("real_prosqa") for n in names]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    xs = range(len(names))
    width = 0.38 if any(real) else 0.6

    def bars(ax, offset, rows, label, color):
        vals = [r["accuracy"] for r in rows]
        lo = [max(0.0, r["accuracy"] - r["accuracy_ci95"][0]) if not math.isnan(r["accuracy_ci95"][0]) else 0 for r in rows]
        hi = [max(0.0, r["accuracy_ci95"][1] - r["accuracy"]) if not math.isnan(r["accuracy_ci95"][1]) else 0 for r in rows]
        ax.bar([x + offset for x in xs], vals, width, yerr=[lo, hi], capsize=3, label=label, color=color)

    bars(ax1, 0 if not any(real) else -width / 2, gen, "held-out generated", "#4C72B0")
    if any(real):
        bars(ax1, width / 2, [r or {"accuracy": 0, "accuracy_ci95": [0, 0]} for r in real], "real ProsQA test", "#DD8452")
    ax1.axhline(0.5, color="grey", linestyle="--", linewidth=1, label="random pick between the 2 options")
    ax1.set_xticks(list(xs), names)
    ax1.set_ylim(0, 1.05)
    ax1.set_ylabel("accuracy")
    ax1.set_title("ProsQA accuracy (95% CI)")
    ax1.legend(fontsize=8)
    ax2.bar(list(xs), [g["mean_generated_tokens"] for g in gen], 0.6, color="#55A868")
    ax2.set_xticks(list(xs), names)
    ax2.set_ylabel("mean generated tokens")
    ax2.set_title("generated tokens (held-out)")
    fig.suptitle(
        f"{summary['scale']['model'].split(' (')[0]}, {summary['scale']['train_seconds_per_method']} s training per method",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
