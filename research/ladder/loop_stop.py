"""Would stopping a looping walk at generation cut its tokens? Read off the graded records, no model run.

    python -m benchmarks.prosqa_real --run <run> ...     # grade the walk runs first (their records are read)
    python -m research.ladder.loop_stop                       # every walk entry of prosqa_real_cpu.json

A walk (``anchor_chain`` with ``revisits``) that never reaches an option writes nodes until the generation budget
cuts it: on the marked walk without its answer line (seed 0) 38 of its 41 unanswered problems run to the 96-token
cut. A stop rule at generation -- end the walk once it steps down into one node for the ``k``-th time -- would
save those tokens, but only if walks that do reach the answer never step down into a node that often. Decoding is
greedy, so a stopped generation is exactly the recorded completion up to the stop: for each ``k`` this reports how
many walks the rule stops, how many of them were right (lost, a stopped walk has no answer), and the mean tokens
with the rule (a stopped walk's tokens counted by tokenizing its text up to the stop with the run's tokenizer).

Writes ``research/ladder/results/loop_stop.json``; a run whose records are not on this machine keeps its result from
the file it replaces.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

from anchored_reasoning.generators.traces import BACK_WORD
from anchored_reasoning.methods.anchored import EOA

ROOT = Path(__file__).resolve().parents[2]


def stop_at(completion: str, k: int, marker: str = BACK_WORD) -> int | None:
    """Where the rule stops ``completion`` (the character offset just after the node that is stepped down into
    for the ``k``-th time; the first node, the asked entity, counts as a step), or None when it runs to its end."""
    from anchored_reasoning.eval.search_probe import _walk_nodes

    text = completion.split(EOA)[0]
    entries: dict[str, int] = {}
    seen = 0
    for match in re.finditer(r"\S+", text):
        nodes = _walk_nodes(text[: match.end()], marker)
        if len(nodes) == seen or nodes[-1] == marker:  # a marker alone: the node it backs up to comes next
            continue
        seen = len(nodes)
        node = nodes[-1]
        if node.startswith(marker + " "):  # a back-up (word or token marker)
            continue
        entries[node] = entries.get(node, 0) + 1
        if entries[node] >= k:
            return match.end()
    return None


def rule_effect(records: list[dict[str, Any]], k: int, count_tokens, marker: str = BACK_WORD) -> dict[str, Any]:
    """One run's first-sample records under the rule with threshold ``k``."""
    n = right = stopped = lost = unanswered = 0
    tokens = with_rule = 0.0
    for rec in records:
        if rec.get("sample", 0):
            continue
        n += 1
        right += bool(rec.get("correct"))
        tokens += rec.get("tokens", 0)
        cut = stop_at(rec.get("completion") or "", k, marker)
        if cut is None:
            with_rule += rec.get("tokens", 0)
            continue
        stopped += 1
        lost += bool(rec.get("correct"))
        unanswered += rec.get("extracted") is None
        with_rule += count_tokens(rec["completion"][:cut])
    return {"k": k, "n": n, "stopped": stopped, "stopped_right": lost, "stopped_unanswered": unanswered,
            "tokens": round(tokens / max(n, 1), 2), "tokens_with_rule": round(with_rule / max(n, 1), 2),
            "accuracy": round(right / max(n, 1), 4), "accuracy_with_rule": round((right - lost) / max(n, 1), 4)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--graded", default=str(ROOT / "benchmarks" / "results" / "prosqa_real_cpu.json"))
    p.add_argument("--k", type=int, nargs="+", default=[2, 3, 4, 5])
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "loop_stop.json"))
    args = p.parse_args(argv)
    from benchmarks.prosqa_real import backup_word
    from transformers import AutoTokenizer

    from anchored_reasoning.eval.records import load_records
    from anchored_reasoning.machine import machine_info

    graded = json.loads(Path(args.graded).read_text())
    out_path = Path(args.out)
    # a run whose records are not on this machine (a fresh checkout) keeps what the file it replaces says of it
    kept = (json.loads(out_path.read_text()) if out_path.is_file() else {}).get("runs") or {}
    runs: dict[str, Any] = {}
    for key, entry in sorted(graded.items()):
        if not isinstance(entry, dict) or not entry.get("_correct"):
            continue
        options = entry.get("method_options") or {}
        records = Path(str((entry.get("real_test") or {}).get("records", "")))
        if entry.get("method") != "anchor_chain" or not options.get("revisits"):
            continue
        if not records.is_file():
            if key in kept:
                runs[key] = kept[key]
            continue
        tok = AutoTokenizer.from_pretrained(entry["run"])
        count = lambda text: len(tok(text, add_special_tokens=False)["input_ids"])  # noqa: E731
        recs = load_records(records, repair=False)
        runs[key] = [rule_effect(recs, k, count, backup_word(options)) for k in args.k]
        print(key, json.dumps(runs[key][0]), flush=True)
    out = {"date": dt.date.today().isoformat(), "machine": machine_info(), "command": "python -m research.ladder.loop_stop",
           "rule": "stop a walk when it steps down into one node for the k-th time (its entity counts once)",
           "runs": runs}
    out_path.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
