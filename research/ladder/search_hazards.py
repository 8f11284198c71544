"""Where written searches break on the real ProsQA test: the rate of a first error right after a step down
and right after a back-up, and whether those two rates account for the accuracy by depth.

    python -m benchmarks.prosqa_real --run <run> ...          # grade the runs first (their records are read)
    python -m research.ladder.search_hazards                       # every search entry of prosqa_real_cpu.json

For each graded run that writes a search (``trace: dfs``, as sentences or, with the anchor chain's
``revisits``, as the walk of nodes), every test record is replayed by ``eval.search_probe``. A move is made
in a context, the move before it: the first move, after a step down, or after a back-up. ``hazard`` is, per
context, the share of moves that broke a rule first (made-up step, revisit, early back-up, wrong parent), with
a 95% bootstrap interval over problems, and ``back_over_down`` the ratio of the two rates. ``detail`` says
where the wrong steps down went (``search_probe`` module doc). Seeds of one method are pooled (counts summed).

``model`` checks the rates against the accuracy: a search that needs ``d`` steps down and ``b`` back-ups
(the trace's own search for that problem) survives to the answer with probability
``(1 - h_start) (1 - h_down)^(d - 1) (1 - h_back)^b`` if every move broke a rule at its context's rate; the
mean of that by hop count is set beside the share of searches that did reach the answer by legal steps.
The gold search's steps down and back-ups by hop count are in ``gold_search``, and by whether the split's
surface rule is right on the problem in ``gold_search_by_surface_rule``.

Writes ``research/ladder/results/search_hazards.json``; a group whose runs' records are not all on this machine keeps
its result from the file it replaces (``kept_from``).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from anchored_reasoning.generators.traces import BACK_WORD

ROOT = Path(__file__).resolve().parents[2]

CONTEXTS = ("start", "down", "back")


def searches_of(entry: dict[str, Any]) -> str | None:
    """The form a graded entry writes its search in (``search_probe.FORMS``), None when it writes none."""
    if entry.get("trace") == "dfs_paths":
        return "dfs_paths"
    if entry.get("trace") != "dfs" or entry.get("method") not in ("cot", "anchor_chain"):
        return None
    return "walk" if (entry.get("method_options") or {}).get("revisits") else "dfs"


def replays(records: list[dict[str, Any]], test: list, form: str, marker: str = BACK_WORD) -> list[dict[str, Any]]:
    """One replay per first-sample record of a test problem, with the problem's id and hop count (``marker``:
    the word a walk backs up with, the ``anchor_chain`` option ``backup_word``)."""
    from anchored_reasoning.eval.probes import hops_of
    from anchored_reasoning.eval.search_probe import replay

    by_id = {ex.id: ex for ex in test}
    out = []
    for rec in records:
        ex = by_id.get(rec.get("id"))
        if ex is not None and not rec.get("sample", 0):
            out.append({**replay(ex, rec.get("completion") or "", form, marker), "hops": hops_of(ex), "id": ex.id})
    return out


def _rates(rows: list[dict[str, Any]], idx) -> dict[str, float]:
    moves = {c: sum(rows[i]["moves_after"][c] for i in idx) for c in CONTEXTS}
    errors = {c: sum(rows[i]["after"] == c for i in idx) for c in CONTEXTS}
    return {c: errors[c] / moves[c] if moves[c] else float("nan") for c in CONTEXTS}


def _run_rates(rows: list[dict[str, Any]]) -> dict[str, float]:
    """One run's error rate per context, rounded as the JSON keeps it."""
    return {c: round(v, 4) for c, v in _rates(rows, range(len(rows))).items()}


def hazards(rows: list[dict[str, Any]], resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Per context the moves, first errors and their rate with a 95% bootstrap interval over problems; the
    ratio of the rate after a back-up to the rate after a step down, with its interval."""
    import numpy as np

    rng = np.random.default_rng(seed)
    point = _rates(rows, range(len(rows)))
    draws = [_rates(rows, rng.integers(0, len(rows), len(rows))) for _ in range(resamples)]
    out: dict[str, Any] = {}
    for c in CONTEXTS:
        vals = np.array([d[c] for d in draws])
        out[c] = {"moves": sum(r["moves_after"][c] for r in rows), "errors": sum(r["after"] == c for r in rows),
                  "rate": round(point[c], 4), "ci95": [round(float(np.nanpercentile(vals, q)), 4) for q in (2.5, 97.5)]}
    # no error after a step down (a search that breaks no rule there): the ratio is undefined, not infinite
    ratios = np.array([d["back"] / d["down"] for d in draws if d["down"] > 0])
    out["back_over_down"] = {"ratio": round(point["back"] / point["down"], 2) if point["down"] > 0 else None,
                             "ci95": [round(float(np.nanpercentile(ratios, q)), 2) for q in (2.5, 97.5)]
                             if len(ratios) else None}
    return out


def gold_shape(test: list) -> dict[int, dict[str, Any]]:
    """Per test problem, the trace's own search: its steps down and back-ups."""
    from anchored_reasoning.anchors import logic_walk
    from anchored_reasoning.generators.traces import prosqa_dfs

    out = {}
    for ex in test:
        walk = logic_walk(prosqa_dfs(ex))
        back = len(walk) - len(set(walk))  # a back-up returns to a node already written
        out[ex.id] = {"down": len(walk) - 1 - back, "back": back}
    return out


def model_by_hops(rows: list[dict[str, Any]], rate: dict[str, float], shape: dict[str, dict[str, int]]) -> dict[str, Any]:
    """Survival to the answer predicted from the pooled rates against the share observed, by hop count."""
    from collections import defaultdict

    pred, seen = defaultdict(list), defaultdict(list)
    for row in rows:
        s = shape[row["id"]]
        p = (1 - rate["start"]) * (1 - rate["down"]) ** max(s["down"] - 1, 0) * (1 - rate["back"]) ** s["back"]
        pred[row["hops"]].append(p)
        seen[row["hops"]].append(row["first_error"] == "none")
    return {str(h): {"n": len(seen[h]), "predicted": round(sum(pred[h]) / len(pred[h]), 3),
                     "observed": round(sum(seen[h]) / len(seen[h]), 3)} for h in sorted(seen)}


def analyse(entries: dict[str, dict[str, Any]], test: list, resamples: int,
            previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every group of search runs pooled (module doc). A group with a run whose records are not on this
    machine (a fresh checkout holds the graded JSON, not the runs) keeps its ``previous`` result (``kept_from``:
    that result's date), with the runs that are here and were not in it under ``unpooled_runs`` (each run's
    rates), so a rerun loses nothing it cannot recompute."""
    from benchmarks.prosqa_real import backup_word, entry_key, seed_groups, shortcut_groups

    from anchored_reasoning.eval.probes import hops_of
    from anchored_reasoning.eval.records import load_records
    from anchored_reasoning.eval.search_probe import detail_key

    previous = previous or {}
    shape = gold_shape(test)
    groups: dict[str, list[tuple[str, list[dict[str, Any]]]]] = {}
    missing: dict[str, list[str]] = {}
    for name, seeds in seed_groups(entries, min_seeds=1).items():
        for entry in seeds:
            form = searches_of(entry)
            records_path = Path(str((entry.get("real_test") or {}).get("records", "")))
            if form is None:
                continue
            if not records_path.is_file():
                missing.setdefault(name, []).append(entry_key(entry))
                continue
            rows = replays(load_records(records_path), test, form, backup_word(entry.get("method_options")))
            groups.setdefault(name, []).append((entry_key(entry), rows))
    out: dict[str, Any] = {}
    for name in sorted(set(groups) | set(missing)):
        runs = groups.get(name, [])
        kept = (previous.get("groups") or {}).get(name)
        if name in missing and kept is not None:
            extra = {k: _run_rates(rs) for k, rs in runs if k not in kept["runs"]}
            out[name] = {**{k: v for k, v in kept.items() if k != "unpooled_runs"},
                         "kept_from": kept.get("kept_from") or previous.get("date"),  # when it was computed
                         **({"unpooled_runs": extra} if extra else {})}
            continue
        if not runs:
            continue
        rows = [r for _, rs in runs for r in rs]
        h = hazards(rows, resamples)
        detail: dict[str, int] = {}
        for r in rows:
            if r["detail"]:
                detail[detail_key(r)] = detail.get(detail_key(r), 0) + 1
        out[name] = {"runs": [k for k, _ in runs], "searches": len(rows), "hazard": h,
                     "per_run_rate": {k: _run_rates(rs) for k, rs in runs},
                     "detail": dict(sorted(detail.items(), key=lambda kv: -kv[1])),
                     "model": model_by_hops(rows, {c: h[c]["rate"] for c in CONTEXTS}, shape),
                     **({"runs_not_here": missing[name]} if name in missing else {})}
    gold = {str(h): v for h, v in _shape_means(test, shape, hops_of).items()}
    # where the split's surface rule is wrong the search is shorter: why every model scores higher there
    rule, _, rule_group = shortcut_groups(test)
    return {"groups": out, "gold_search": gold,
            "gold_search_by_surface_rule": {"rule": rule, **_shape_means(test, shape, lambda ex: rule_group[ex.id])}}


def _shape_means(test: list, shape: dict[str, dict[str, int]], key_of) -> dict[Any, dict[str, Any]]:
    """The gold search's mean steps down and back-ups per group of problems (``key_of(example)``), groups sorted."""
    groups: dict[Any, list[dict[str, int]]] = {}
    for ex in test:
        groups.setdefault(key_of(ex), []).append(shape[ex.id])
    return {k: {"n": len(v), "down": round(sum(s["down"] for s in v) / len(v), 2),
                "back": round(sum(s["back"] for s in v) / len(v), 2)} for k, v in sorted(groups.items())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--graded", default=str(ROOT / "benchmarks" / "results" / "prosqa_real_cpu.json"),
                   help="prosqa_real.py's JSON: its entries name the runs' records")
    p.add_argument("--resamples", type=int, default=2000)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "search_hazards.json"))
    args = p.parse_args(argv)
    from anchored_reasoning.machine import machine_info
    from anchored_reasoning.tasks import get_task

    graded = json.loads(Path(args.graded).read_text())
    entries = {k: v for k, v in graded.items() if isinstance(v, dict) and v.get("_correct")}
    out = Path(args.out)
    previous = json.loads(out.read_text()) if out.is_file() else None
    result = analyse(entries, get_task("prosqa").load("test"), args.resamples, previous)
    if not result["groups"]:
        raise SystemExit(f"no graded search run with its records on this machine in {args.graded}")
    result.update({"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine_info(),
                   "command": "python -m research.ladder.search_hazards " + " ".join(sys.argv[1:] if argv is None else argv)})
    out.write_text(json.dumps(result, indent=2) + "\n")
    for name, g in result["groups"].items():
        h = g["hazard"]
        if "kept_from" in g:
            name += f" (kept from {g['kept_from']})"
        print(f"{name}: after down {h['down']['rate']} {h['down']['ci95']}, after back {h['back']['rate']} "
              f"{h['back']['ci95']}, ratio {h['back_over_down']['ratio']}; model {g['model']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
