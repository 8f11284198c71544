"""Paired comparisons across two depth-ladder JSONs: a method run at another budget against a ladder's methods.

    python -m research.ladder.ladder_pairs \\
        --a benchmarks/results/depth_ladder_walk2000.json:anchor_walk \\
        --b benchmarks/results/depth_ladder_search.json:cot --b benchmarks/results/depth_ladder_search.json:nocot \\
        --out research/ladder/results/depth_ladder_walk2000_pairs.json

A ladder JSON holds runs of one budget (``depth_ladder.SAME_EXPERIMENT``), so a method trained longer
(to its own convergence) lives in its own JSON. When both were evaluated on the same held-out problems
(the same ``hops``, ``train_problems`` and ``held_out_per_depth``: checked, and the two JSONs' problem ids
and depths must agree), each problem's accuracy (averaged over each side's seeds) pairs up, and this writes,
per depth, the paired bootstrap difference a - b with its 95% interval, both accuracies, and the token
ratio a / b, with each side's steps, learning rate and seeds beside them.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any


#: setup keys that fix the held-out problems: two ladders pair up only if these agree
SAME_PROBLEMS = ("hops", "train_problems", "held_out_per_depth")


def side(spec: str) -> tuple[dict[str, Any], str, str]:
    """``path:method`` -> (the JSON, the method, the path), refusing a method the JSON does not hold."""
    path, sep, label = spec.rpartition(":")
    if not sep or not path or not label:
        raise SystemExit(f"{spec!r}: expected <ladder JSON>:<method>")
    data = _load(path)
    if label not in data.get("methods", {}) or label not in data.get("_per_problem", {}):
        raise SystemExit(f"{path} has no per-problem records of {label!r} (it holds {sorted(data.get('methods', {}))})")
    return data, label, path


@lru_cache(maxsize=None)
def _load(path: str) -> dict[str, Any]:
    """A ladder JSON, read once however many comparisons name it (only read, never changed here)."""
    return json.loads(Path(path).read_text())


def check_same_problems(a: dict[str, Any], b: dict[str, Any], a_path: str, b_path: str) -> dict[str, int]:
    """The held-out depth map both JSONs share, or SystemExit naming what differs."""
    differ = {k: (a["setup"].get(k), b["setup"].get(k)) for k in SAME_PROBLEMS if a["setup"].get(k) != b["setup"].get(k)}
    if differ:
        raise SystemExit(f"{a_path} and {b_path} were evaluated on other problems ("
                         + ", ".join(f"{k}: {x!r} vs {y!r}" for k, (x, y) in differ.items()) + ")")
    if a.get("_held_out_hops") != b.get("_held_out_hops"):
        raise SystemExit(f"{a_path} and {b_path} hold different held-out problem ids or depths")
    return {i: int(h) for i, h in a["_held_out_hops"].items()}


def budget(data: dict[str, Any], label: str) -> dict[str, Any]:
    """What one side trained with: steps and seeds from its runs, the lr from its setup."""
    entry = data["methods"][label]
    steps = sorted({r["steps"] for r in entry.get("per_seed", []) if "steps" in r})
    return {"steps": steps, "lr": data["setup"].get("lr"), "seeds": entry.get("seeds"),
            "backbone": data["setup"].get("backbone"), "accuracy": entry["accuracy"], "tokens": entry["tokens"]}


def compare(a_spec: str, b_spec: str) -> dict[str, Any]:
    """Per depth: a - b paired over the shared problems, both accuracies and the token ratio."""
    from benchmarks.depth_ladder import paired

    a, a_label, a_path = side(a_spec)
    b, b_label, b_path = side(b_spec)
    hops = check_same_problems(a, b, a_path, b_path)
    full_a = {**a["methods"][a_label], "_per_problem": a["_per_problem"][a_label]}
    full_b = {**b["methods"][b_label], "_per_problem": b["_per_problem"][b_label]}
    by_hops = {}
    for h in sorted(full_a["by_hops"], key=int):
        if h not in full_b["by_hops"]:
            continue
        ra, rb = full_a["by_hops"][h], full_b["by_hops"][h]
        by_hops[h] = {**paired(full_a, full_b, hops, h), "a_accuracy": ra["accuracy"], "b_accuracy": rb["accuracy"],
                      "token_ratio": ra["tokens"] / rb["tokens"] if rb["tokens"] else None}
    return {"a": {"json": a_path, "method": a_label, **budget(a, a_label)},
            "b": {"json": b_path, "method": b_label, **budget(b, b_label)}, "by_hops": by_hops}


def pair_names(a_spec: str, b_specs: list[str]) -> list[str]:
    """``<a>_minus_<b>`` per ``b_specs``; a b method that is a's own, or that more than one b names, gets its
    JSON's name (``anchor_walk_minus_anchor_walk_of_depth_ladder_search``, ``..._minus_cot_of_depth_ladder_cot2000``),
    so no pair replaces another."""
    a = a_spec.rpartition(":")[2]
    bs = [spec.rpartition(":") for spec in b_specs]
    methods = [b for _, _, b in bs]
    names = [f"{a}_minus_{b}" + (f"_of_{Path(path).stem}" if b == a or methods.count(b) > 1 else "")
             for path, _, b in bs]
    if len(set(names)) < len(names):
        raise SystemExit(f"two --b name the same comparison: {b_specs}")
    return names


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="<ladder JSON>:<method>, the side the differences are of")
    p.add_argument("--b", required=True, action="append", help="<ladder JSON>:<method> to compare against (repeatable)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    pairs = {name: compare(args.a, b) for name, b in zip(pair_names(args.a, args.b), args.b)}
    for name, c in pairs.items():
        print(name, {h: f"{r['diff']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] x{r['token_ratio']:.2f}"
                     for h, r in c["by_hops"].items()})
    out = {"pairs": pairs, "chance": 0.5, "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": "python -m research.ladder.ladder_pairs " + " ".join(sys.argv[1:] if argv is None else argv)}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
