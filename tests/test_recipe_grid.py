"""benchmarks/recipe_grid.sh: one process per (method, seed), the paper's baselines given their curriculum,
names with the tag, and a failed run counted in the exit status (dry runs: nothing is trained)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "recipe_grid.sh"


def _grid(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(tmp_path / "grid")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DRY_RUN": "1", "SEEDS": "1", "PYTHON": sys.executable, **env})


def _recipe(log: Path) -> dict:
    text = log.read_text()
    return json.loads(text[text.index("{"):])


def test_each_run_gets_its_method_seed_and_the_papers_curriculum(tmp_path):
    proc = _grid(tmp_path, METHODS="nocot pause stepwise", TAG="_t", CHECK_RUN="anchor_chain:0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 runs: nocot:1 pause:1 stepwise:1 anchor_chain:0" in proc.stdout
    grid = tmp_path / "grid"
    got = {p.stem: _recipe(p) for p in grid.glob("*.log")}
    assert set(got) == {"nocot_t_s1", "pause_t_s1", "stepwise_t_s1", "anchor_chain_t_s0"}
    pause, stepwise, nocot = got["pause_t_s1"], got["stepwise_t_s1"], got["nocot_t_s1"]
    assert pause["method"] == {"name": "pause", "options": {"remove_steps_per_stage": 1}} and pause["training"]["curriculum"]
    assert stepwise["method"]["name"] == "stepwise" and stepwise["training"]["curriculum"]
    assert "curriculum" not in nocot["training"] and nocot["seed"] == 1
    assert all(r["training"]["generation_eval_every_stage"] is False for r in got.values())
    assert pause["output_dir"] == str(grid / "pause_t_s1")


def test_a_run_that_fails_is_counted_and_named(tmp_path):
    proc = _grid(tmp_path, METHODS="cot", CHECK_RUN="", EXTRA="training.learning_rat=1")
    assert proc.returncode == 1
    assert "1 of 1 runs failed" in proc.stdout
    assert "learning_rate" in proc.stdout  # the run's line quotes its log: the unknown key and the close match
