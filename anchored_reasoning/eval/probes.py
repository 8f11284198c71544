"""Break a reasoning accuracy down: by answer depth (hops) and under the ProsQA binding probe.

Plain accuracy can rank methods wrongly while the data has a surface shortcut (CALIBRATION.md:
No-CoT 0.85 above CoT 0.72, while only CoT read the question). Two views make a number
explainable:

* **by hops** -- accuracy per shortest entity -> answer distance, so a method that solves
  1-hop problems and guesses on 3-hop ones shows as such;
* **the binding probe** -- every problem asked again about the *other* seed entity (same facts,
  same options, the right answer flips, :func:`anchored_reasoning.generators.prosqa.swapped_row`).
  A model that reads the asked entity changes its answer; one that answers from the graph's shape
  does not. ``flip_rate`` is the share of problems whose extracted answer differs between the
  two prompts; ``both_right`` the share answered right both times (a coin scores 0.25).

>>> swapped = binding_probe_examples(held_out)                 # list[Example], ids "<id>~swap"
>>> summary = probe_summary(records, swapped_records)          # from two runner record lists
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Sequence

from anchored_reasoning.eval.metrics import mean_ci
from anchored_reasoning.types import Example

SWAP_SUFFIX = "~swap"


def prosqa_row_of(example: Example) -> dict[str, Any]:
    """The published-format row behind a ProsQA Example (the loader keeps the graph in ``meta``)."""
    meta = example.meta
    try:
        return {
            "question": example.question, "answer": example.answer, "steps": list(example.steps),
            "idx_to_symbol": meta["idx_to_symbol"], "edges": meta["edges"], "root": meta["root"],
            "target": meta["target"], "neg_target": meta["neg_target"],
        }
    except KeyError as exc:
        raise ValueError(f"example {example.id!r} is not a ProsQA example with its graph in meta (missing {exc})") from None


def hops_of(example: Example) -> int:
    from anchored_reasoning.generators.prosqa import hops_of as row_hops

    return row_hops(prosqa_row_of(example))


def binding_probe_examples(examples: Sequence[Example]) -> list[Example]:
    """Each problem asked about the other seed entity (answer flipped); problems without a
    well-defined swap (possible only in hand-made data) are left out and logged by the caller."""
    from anchored_reasoning.generators.prosqa import rows_to_examples, swapped_row

    out: list[Example] = []
    for ex in examples:
        row = swapped_row(prosqa_row_of(ex))
        if row is None:
            continue
        (swapped,) = rows_to_examples([row], split="probe")
        swapped.id = ex.id + SWAP_SUFFIX
        out.append(swapped)
    return out


def _by_id(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in records if r.get("sample", 0) == 0}


def accuracy_by(records: Iterable[dict[str, Any]], key_of: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``{key: mean_ci}`` of ``correct`` grouped by ``key_of[record id]`` (keys as strings, sorted)."""
    groups: dict[Any, list[float]] = defaultdict(list)
    for rid, rec in _by_id(records).items():
        if rid in key_of:
            groups[key_of[rid]].append(float(bool(rec.get("correct"))))
    return {str(k): mean_ci(v) for k, v in sorted(groups.items())}


def probe_summary(records: Sequence[dict[str, Any]], swapped_records: Sequence[dict[str, Any]],
                  hops: dict[str, int] | None = None) -> dict[str, Any]:
    """Binding-probe figures from the runner records of the original and the swapped problems:
    ``swap_accuracy``, ``flip_rate``, ``both_right`` (each a mean_ci), and per hop when ``hops``
    (id -> hops of the original problem) is given."""
    orig, swap = _by_id(records), _by_id(swapped_records)
    pairs = [(orig[i], swap[i + SWAP_SUFFIX]) for i in orig if i + SWAP_SUFFIX in swap]
    if not pairs:
        raise ValueError("no problem has both an original and a swapped record")

    def figures(sel):
        return {
            "swap_accuracy": mean_ci([float(bool(s.get("correct"))) for _, s in sel]),
            "flip_rate": mean_ci([float(o.get("extracted") is not None and s.get("extracted") is not None
                                        and o.get("extracted") != s.get("extracted")) for o, s in sel]),
            "both_right": mean_ci([float(bool(o.get("correct")) and bool(s.get("correct"))) for o, s in sel]),
        }

    out = figures(pairs)
    if hops:
        per: dict[int, list] = defaultdict(list)
        for o, s in pairs:
            if o["id"] in hops:
                per[hops[o["id"]]].append((o, s))
        out["by_hops"] = {str(h): figures(sel) for h, sel in sorted(per.items())}
    return out
