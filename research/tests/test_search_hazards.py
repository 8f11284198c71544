"""research/ladder/search_hazards.py: a rerun recomputes what it has the records for and keeps what it has not."""
from __future__ import annotations

import json
from pathlib import Path

from anchored_reasoning.generators.prosqa import generate_dataset
from anchored_reasoning.generators.traces import prosqa_dfs

from research.ladder import search_hazards


def _entry(seed: int, records: Path) -> dict:
    return {"method": "cot", "seed": seed, "trace": "dfs", "model": "logic-gpt2-search", "method_options": {},
            "real_test": {"records": str(records)}, "_correct": {"x": 1}}


def test_a_group_whose_records_are_gone_keeps_its_earlier_result(tmp_path):
    test = generate_dataset(6, seed=6)
    lines = [{"id": ex.id, "sample": 0, "completion": " ".join(prosqa_dfs(ex)) + "[EoR]\n### x"} for ex in test]
    here = tmp_path / "records.jsonl"
    here.write_text("".join(json.dumps(r) + "\n" for r in lines))
    gone = tmp_path / "gone" / "records.jsonl"
    group = "cot_dfs_logic-gpt2-search"

    fresh = search_hazards.analyse({f"{group}_s1": _entry(1, here)}, test, resamples=20)
    assert fresh["groups"][group]["runs"] == [f"{group}_s1"] and fresh["groups"][group]["searches"] == 6
    assert fresh["groups"][group]["hazard"]["down"]["rate"] == 0.0  # the gold search breaks no rule

    earlier = {"date": "2026-12-01 00:00 UTC", "groups": {group: {"runs": [f"{group}_s0"], "searches": 500,
                                                                   "hazard": {"down": {"rate": 0.03}}}}}
    both = {f"{group}_s0": _entry(0, gone), f"{group}_s1": _entry(1, here)}  # keyed as prosqa_real.py keys them
    got = search_hazards.analyse(both, test, resamples=20, previous=earlier)["groups"][group]
    assert got["runs"] == [f"{group}_s0"] and got["searches"] == 500 and got["hazard"] == {"down": {"rate": 0.03}}
    assert got["kept_from"] == "2026-12-01 00:00 UTC"
    assert got["unpooled_runs"] == {f"{group}_s1": {"start": 0.0, "down": 0.0, "back": 0.0}}
    # kept again by a later rerun: still dated when it was computed
    later = {"date": "2026-12-09 00:00 UTC", "groups": {group: got}}
    assert search_hazards.analyse(both, test, resamples=20, previous=later)["groups"][group] == got
    # nothing earlier to keep: pooled from the runs that are here, the others named
    got = search_hazards.analyse(both, test, resamples=20)["groups"][group]
    assert got["runs"] == [f"{group}_s1"] and got["runs_not_here"] == [f"{group}_s0"] and "kept_from" not in got
