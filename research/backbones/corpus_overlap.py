"""Contamination check: do evaluation problems occur in a backbone's pretraining corpus?

    python -m research.backbones.corpus_overlap --out research/backbones/results/corpus_overlap_search.json

Rebuilds the ``search`` corpus of ``logic-gpt2-search`` (``research.backbones.backbone.qa_corpus``, seeds 5 and 6, 120,000
documents each: its two pretraining runs) and counts the evaluation problems whose facts (the question
without its query) equal those of a corpus problem (a ProsQA document or a drill): the demo's held-out problems,
the backbone probe's ladder problems and the real ProsQA test split. One process, ~8 minutes on one core.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
from pathlib import Path



def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", nargs="+", type=int, default=[5, 6], help="the corpus seeds of the pretraining runs")
    p.add_argument("--docs", type=int, default=120_000)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "corpus_overlap_search.json"))
    a = p.parse_args(argv)
    from anchored_reasoning.demo import DemoSettings, make_data
    from anchored_reasoning.generators.prosqa import generate_dataset, ladder_size
    from anchored_reasoning.tasks import get_task
    from anchored_reasoning.train.data.logic_text import facts_of
    from research.backbones.backbone import qa_corpus

    heads: set[str] = set()
    for seed in a.seeds:
        for task, doc in qa_corpus(a.docs, seed=seed, mixture="search"):
            if task in ("prosqa_dfs", "drill"):
                heads.add(facts_of(doc.split("\n")[0], "prosqa"))
    _, held = make_data(DemoSettings())
    sets = {"demo_held_out": held,
            "backbone_probe_ladder_1_4": [e for h in (1, 2, 3, 4)
                                          for e in generate_dataset(100, seed=4242 + h, split="probe", **ladder_size(h))],
            "prosqa_real_test": list(get_task("prosqa").load("test"))}
    result = {"corpus": {"mixture": "search", "seeds": a.seeds, "documents_per_seed": a.docs, "distinct_problems": len(heads)},
              "overlap": {k: {"n": len(v), "facts_in_corpus": sum(facts_of(e.question, "prosqa") in heads for e in v)}
                          for k, v in sets.items()},
              "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": {"platform": platform.platform(), "note": "one process, one core"},
              "command": "python -m research.backbones.corpus_overlap " + " ".join(sys.argv[1:])}
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["overlap"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
