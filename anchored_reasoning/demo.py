"""The demo (``anchored-reasoning demo``): the written anchors vs CoT vs pause vs ACoT on generated ProsQA, on a CPU.

    anchored-reasoning demo                          # ~7 minutes of work on 2 CPU cores
    anchored-reasoning demo --budget-minutes 5 --out runs/demo-5min --seed 1

What it does, offline:

1. generates small ProsQA problems without surface shortcuts: Coconut's construction at the
   depth-ladder sizes of 1, 2 and 3 hops (8-16 nodes drawn), the wrong option as deep as the
   right one (``neg_depth="match"``), equal shares per depth -- training and held-out problems
   from different seeds, held-out questions that also occur in training removed. The surface-rule
   baselines of :mod:`anchored_reasoning.generators.shortcuts` are scored on the held-out
   problems and written beside the results (all near 0.5). The training problems' reasoning is written
   as the depth-first search from the asked entity (``--trace dfs``, the default: look-ups forward only,
   ``Back to <parent>.`` at a dead end) or as the dataset's proof (``--trace forward``, whose first step
   already needs look-ahead);
2. fine-tunes the shipped ``logic-gpt2-search`` backbone (``logic-gpt2-shift`` pretrained further on
   problems written as the search) once per method, each for the same wall-clock
   budget (``--backbone none``: a 2-layer GPT-2 from scratch); ACoT and pause follow the paper's
   curriculum (one more slot and one reasoning step fewer per stage), scaled to the budget;
3. evaluates each checkpoint through the evaluation runner (HF backend, greedy) on the held-out
   problems, per answer depth, and under the **binding probe** (the same problems asked about the
   other entity: the right answer flips; :mod:`anchored_reasoning.eval.probes`); optionally on the
   first ``--real-n`` problems of the real ProsQA test split (full-size graphs, out of distribution);
4. prints a table and writes ``summary.json``, ``results.md`` and ``demo.png`` to ``--out``.

Methods trained side by side (``--workers``) run without bars; the terminal shows one line per method,
its minutes of training spent / its budget, then its evaluated samples (:class:`~anchored_reasoning.demo_report.StatusBoard`).

Rerunning with the same settings reuses finished checkpoints and evaluations.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from anchored_reasoning.demo_report import MethodStatus, StatusBoard

log = logging.getLogger(__name__)

#: The written anchors (the search's nodes, back-ups marked: the method that beats CoT on the real ProsQA test at a
#: third of its tokens) beside CoT and the paper's latent methods; No-CoT and stepwise with --methods.
DEMO_METHODS = ["cot", "anchor_chain", "pause", "acot"]
#: Answer depths of the demo's problems, one generator size each (generators.prosqa.ladder_size).
DEMO_HOPS = [1, 2, 3]
#: One representative single-size setting (the 2-hop ladder size), for callers that need one size.
DEMO_SIZE = {"num_nodes": 12, "min_hops": 2, "max_hops": 2, "neg_depth": "match"}
METHOD_OPTIONS: dict[str, dict[str, Any]] = {
    "nocot": {},
    "cot": {},
    "anchor_chain": {"revisits": True, "mark_backups": True},
    "pause": {"k": 3, "remove_steps_per_stage": 1},  # ACoT's exact schedule, no anchor loss
    "acot": {"k": 3, "remove_steps_per_stage": 1},
    "stepwise": {"stages": 2},
}
CURRICULUM = {"acot", "pause", "stepwise"}
#: What starting a spawned worker costs before it trains (a fresh interpreter importing torch and transformers).
SPAWN_SECONDS = 3.0


@dataclass
class DemoSettings:
    """Everything that determines a demo run (a rerun with equal settings resumes)."""

    methods: list[str] = field(default_factory=lambda: list(DEMO_METHODS))
    seed: int = 0
    budget_minutes: float = 7.0  # + ~2-3 min of install on a fresh machine: make demo <= 10 min
    train_n: int = 20000
    eval_n: int = 240  # held-out problems, split equally over ``hops``
    real_n: int = 0
    #: answer depths (ladder sizes) of the problems; ``size`` (a generator size) overrides them
    hops: list[int] = field(default_factory=lambda: list(DEMO_HOPS))
    size: dict[str, Any] | None = None
    probe: bool = True
    #: how the training problems' reasoning is written (``generators.traces.TRACE_ORDERS``): ``dfs``, the
    #: depth-first search from the asked entity, needs forward look-ups only; ``forward`` (the dataset's
    #: proof) needs look-ahead from its first step, which no method learned in the demo's budget
    trace: str = "dfs"
    #: what joins a trace's steps in the training targets: a space, as in the shipped logic backbones'
    #: pretraining documents (``train.logic_text``), so fine-tuning keeps the format the backbone knows
    step_separator: str = " "
    #: Model every method fine-tunes: a checkpoint, alias or Hub id (default: the shipped
    #: ``logic-gpt2-search`` backbone); None trains ``preset`` from scratch with a tokenizer trained here.
    backbone: str | None = "logic-gpt2-search"
    preset: str = "gpt2-tiny"
    learning_rate: float = 1e-3
    batch_size: int = 32
    max_new_tokens: int = 128
    real_max_new_tokens: int = 128
    threads: int | None = None
    #: methods trained at once, one process each (with ``threads`` torch threads): a CPU with two cores
    #: trains two methods side by side, so each gets twice the steps of one-at-a-time in the same wall
    #: clock. None: one per core, at most one per method.
    workers: int | None = None


def parse_backbone(value: str | None) -> str | None:
    """``--backbone`` as typed -> the model to fine-tune, or None for from scratch ('none', 'scratch', '')."""
    return None if value is None or str(value).lower() in ("none", "scratch", "") else str(value)


# ---------------------------------------------------------------------------------------------
# data


def _sizes(settings: DemoSettings) -> list[dict[str, Any]]:
    from anchored_reasoning.generators.prosqa import ladder_size

    return [dict(settings.size)] if settings.size else [ladder_size(h) for h in settings.hops]


def make_data(settings: DemoSettings) -> tuple[list, list]:
    """(training problems, held-out problems): equal shares of every size, held-out questions unseen in training."""
    from anchored_reasoning.generators.prosqa import generate_dataset
    from anchored_reasoning.generators.traces import apply_trace

    sizes = _sizes(settings)
    train: list = []
    for i, size in enumerate(sizes):
        n = settings.train_n // len(sizes) + (1 if i < settings.train_n % len(sizes) else 0)
        train += generate_dataset(n, seed=settings.seed * 100 + i, split=f"demo-train{i}", **size)
    random.Random(settings.seed).shuffle(train)
    train = apply_trace(train, "prosqa", settings.trace)
    seen = {ex.question for ex in train}
    held: list = []
    for i, size in enumerate(sizes):
        want = settings.eval_n // len(sizes) + (1 if i < settings.eval_n % len(sizes) else 0)
        got: list = []
        batch_seed = settings.seed * 100 + 10_000 + i * 1000
        while len(got) < want:
            fresh = generate_dataset(max(want * 2, 50), seed=batch_seed, split=f"demo-test{batch_seed}", **size)
            got.extend(ex for ex in fresh if ex.question not in seen)
            seen.update(ex.question for ex in fresh)
            batch_seed += 1
        held += got[:want]
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
    from anchored_reasoning.train.pipelines.ar import build_tokenizer_from_texts, training_texts

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
        # the settings' step separator joins the steps whatever the options (an explicit one in them wins)
        "method": {"name": name, "options": {"step_separator": settings.step_separator,
                                             **(METHOD_OPTIONS.get(name, {}) if options is None else options)}},
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
            "dataloader_pin_memory": False,
        },
    }


def train_method(name: str, train: list, settings: DemoSettings, tokenizer: Path | None, out: Path, train_seconds: float,
                 status: MethodStatus | None = None) -> dict[str, Any]:
    """Train one method (or reuse its finished checkpoint). With ``status`` (a worker beside others) there
    is no bar: the status file says when training began and where its log is."""
    from anchored_reasoning.train.pipelines import ar
    from anchored_reasoning.train.callbacks.progress import TRAIN_LOG_JSONL, run_log

    ckpt = out / name / "model"
    done = ckpt / "train_summary.json"
    if done.is_file() and (ckpt / "anchored_reasoning.json").is_file():
        log.info("%s: reusing the finished checkpoint in %s", name, ckpt)
    else:
        recipe = method_recipe(name, settings, tokenizer, ckpt, train_seconds)
        if status is not None:
            recipe["training"]["disable_tqdm"] = True
            status.set(phase="train", since=time.time(), limit_s=train_seconds, log=str(ckpt / TRAIN_LOG_JSONL))
        with run_log():  # the run's log lines in <ckpt>/train.log
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


def evaluate(ckpt: str, examples: list, out_dir: Path, max_new_tokens: int, task: str = "prosqa",
             hops: dict[str, int] | None = None, *, status: MethodStatus | None = None) -> dict[str, Any]:
    """Greedy evaluation through the runner, prompting the checkpoint with the method it was trained
    with; with ``hops`` (example id -> answer depth) also the accuracy per depth. With ``status``: no
    bars, the finished samples counted there."""
    from anchored_reasoning.backends import get_backend
    from anchored_reasoning.eval.probes import accuracy_by
    from anchored_reasoning.eval.methods import build_method
    from anchored_reasoning.eval.records import load_records
    from anchored_reasoning.eval.runner import run_eval

    backend = get_backend("hf", ckpt, batch_size=64, device="cpu")
    method = build_method(None, ckpt)
    summary = run_eval(task, status.watch(backend) if status else backend, method, out_dir=out_dir, examples=examples,
                       max_new_tokens=max_new_tokens, progress=status is None)
    acc = summary["accuracy"]
    out = {
        "accuracy": acc["mean"],
        "accuracy_ci95": [acc["ci_low"], acc["ci_high"]],
        "mean_generated_tokens": summary["tokens"]["mean"],
        "n": acc["n"],
        "no_answer": summary["counts"]["no_answer"],
        "truncated": summary["counts"]["truncated"],
        "eval_seconds": summary.get("wall_seconds"),
        "records": str(Path(out_dir) / "records.jsonl"),
    }
    if hops:
        out["by_hops"] = {h: {"accuracy": r["mean"], "accuracy_ci95": [r["ci_low"], r["ci_high"]], "n": r["n"]}
                          for h, r in accuracy_by(load_records(out["records"]), hops).items()}
    return out


def probe(ckpt: str, swapped: list, out_dir: Path, max_new_tokens: int, hops: dict[str, int], *,
          status: MethodStatus | None = None) -> dict[str, Any]:
    """The binding probe of one checkpoint: the swapped problems evaluated, paired with the originals."""
    from anchored_reasoning.eval.probes import probe_summary
    from anchored_reasoning.eval.records import load_records

    swap = evaluate(ckpt, swapped, out_dir / "eval_swapped", max_new_tokens, status=status)
    figures = probe_summary(load_records(out_dir / "eval_generated" / "records.jsonl"), load_records(swap["records"]), hops)
    return {"swapped": swap, **figures}


# ---------------------------------------------------------------------------------------------
# the whole demo


def demo_workers(settings: DemoSettings) -> int:
    """How many methods train at once: ``settings.workers``, else one per core (at most one per method)."""
    n = settings.workers or (os.cpu_count() or 1) // max(settings.threads or 1, 1)
    return max(1, min(int(n), len(settings.methods)))


def _worker_init(threads: int | None) -> None:
    """A worker beside others: warnings only on the console and no bars (the parent draws the board)."""
    import torch
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(threads or 1)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.WARNING)
    hf_logging.disable_progress_bar()


def method_job(name: str, *, train: list, settings: DemoSettings, tokenizer: Path | None, out: Path, train_seconds: float,
               held: list, hops: dict[str, int], swapped: list, real: list, board: bool = False) -> dict[str, Any]:
    """Train one method and evaluate it (held-out problems, binding probe, real split): one worker's job.
    ``board``: a worker beside others, reporting to ``<out>/<name>/status.json`` instead of drawing bars."""
    t_m = time.monotonic()
    status = MethodStatus(out / name) if board else None
    info = train_method(name, train, settings, tokenizer, out, train_seconds, status)
    if status is not None:
        status.set(phase="eval", done=0, total=len(held) + len(swapped) + len(real))
    info["generated"] = evaluate(info["checkpoint"], held, out / name / "eval_generated", settings.max_new_tokens, hops=hops,
                                 status=status)
    if swapped:
        info["probe"] = probe(info["checkpoint"], swapped, out / name, settings.max_new_tokens, hops, status=status)
    if real:
        info["real_prosqa"] = evaluate(info["checkpoint"], real, out / name / "eval_real", settings.real_max_new_tokens,
                                       status=status)
    info["wall_seconds"] = round(time.monotonic() - t_m, 1)
    g = info["generated"]
    if status is not None:
        status.set(phase="done", accuracy=g["accuracy"], steps=info["steps"], minutes=info["wall_seconds"] / 60)
    log.info("%s: accuracy %.3f, %.1f tokens, %d steps", name, g["accuracy"], g["mean_generated_tokens"], info["steps"])
    return info


def run_demo(settings: DemoSettings, out: Path) -> dict[str, Any]:
    import torch

    from anchored_reasoning.demo_report import plot, render_table
    from anchored_reasoning.eval.probes import binding_probe_examples, hops_of
    from anchored_reasoning.generators.shortcuts import example_problems, rule_scores

    t0 = time.monotonic()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    out.mkdir(parents=True, exist_ok=True)
    settings_file = out / "demo_settings.json"
    # threads and workers change how fast, not what is trained
    identity = {k: v for k, v in asdict(settings).items() if k not in ("threads", "workers")}
    current = json.dumps(identity, sort_keys=True)
    if settings_file.is_file() and settings_file.read_text().strip() != current:
        from anchored_reasoning.errors import ResumeError

        raise ResumeError(f"{out} holds a demo run with other settings ({settings_file}); use another --out or remove it")
    settings_file.write_text(current + "\n")

    train, held = make_data(settings)
    hops = {ex.id: hops_of(ex) for ex in held}
    swapped = binding_probe_examples(held) if settings.probe else []
    shortcuts = rule_scores(example_problems(held))
    real = real_test(settings)
    tokenizer = None if settings.backbone else shared_tokenizer(train, out, settings.methods)
    setup_s = time.monotonic() - t0

    # Equal training time per method; evaluation time is reserved up front from a rough per-example cost.
    workers = demo_workers(settings)
    rounds = -(-len(settings.methods) // workers)  # methods each worker trains one after the other
    budget = settings.budget_minutes * 60.0
    eval_per_method = 5.0 + 0.06 * (len(held) + len(swapped)) + 0.25 * len(real)
    spawn_s = SPAWN_SECONDS if workers > 1 else 0.0
    train_seconds = max(2.0, (budget - setup_s) / max(rounds, 1) - eval_per_method - spawn_s)
    log.info("demo: %d train / %d held-out generated problems (%d swapped), %d real; %.0fs of training per method, "
             "%d at a time", len(train), len(held), len(swapped), len(real), train_seconds, workers)

    job = dict(train=train, settings=settings, tokenizer=tokenizer, out=out, train_seconds=train_seconds,
               held=held, hops=hops, swapped=swapped, real=real)
    results: dict[str, Any] = {}
    if workers == 1:
        for name in settings.methods:
            results[name] = method_job(name, **job)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter per worker: no forked torch state
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init, initargs=(settings.threads,)) as pool:
            with StatusBoard(out, settings.methods) as status_board:  # one line per method, drawn here only
                futures = {name: pool.submit(method_job, name, board=True, **job) for name in settings.methods}
                status_board.follow(futures.values())
            results = {name: f.result() for name, f in futures.items()}

    summary = {
        "settings": asdict(settings),
        "scale": {
            "problems": (f"generated ProsQA, generator size {settings.size}" if settings.size else
                         f"generated ProsQA, {', '.join(map(str, settings.hops))}-hop ladder sizes "
                         "(wrong option as deep as the answer), equal shares")
                         + ("" if settings.trace == "forward" else f"; reasoning written as the {settings.trace} trace"),
            "model": (f"{settings.backbone} fine-tuned" if settings.backbone
                      else f"{settings.preset} from scratch (see anchored_reasoning.train.pipelines.ar.MODEL_PRESETS)"),
            "train_seconds_per_method": round(train_seconds, 1),
            "held_out": len(held),
            "real_prosqa_test_examples": len(real),
        },
        "chance": 0.5,
        "surface_rules_on_held_out": shortcuts,
        "methods": results,
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "workers": workers},
        "total_seconds": round(time.monotonic() - t0, 1),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (out / "results.md").write_text(render_table(summary) + "\n")
    plot(summary, out / "demo.png")
    return summary
