"""The wheel: `pip install .` (not editable) into a fresh virtual environment, then, from a directory outside the
checkout, `anchored-reasoning tasks`, `train tiny_test` and `eval` on the result all work -- the task specs,
recipes, suites and shipped models travel inside the wheel (setup.py maps the top-level folders, no copy).

The environment reuses this interpreter's installed dependencies (``--system-site-packages``) so only the
package itself is installed; the test asserts that the package it runs is the wheel's, not the checkout's."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow
DATA = os.environ.get("ANCHORED_REASONING_DATA")


def _run(cmd, cwd, env, timeout=600):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
         cwd=out, env=os.environ.copy())
    (whl,) = out.glob("anchored_reasoning-*.whl")
    return whl


def test_the_wheel_carries_specs_recipes_suites_and_models_as_the_checkout_has_them(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in ("tasks", "train", "eval"):
        for f in (ROOT / folder).rglob("*.yaml"):
            assert f"anchored_reasoning/_builtin/{folder}/{f.relative_to(ROOT / folder).as_posix()}" in names, f
    with zipfile.ZipFile(wheel) as z:  # the same bytes, not a copy that could drift
        assert z.read("anchored_reasoning/_builtin/train/tiny_test.yaml") == (ROOT / "train/tiny_test.yaml").read_bytes()
    assert any(n.startswith("anchored_reasoning/assets/logic-gpt2-search/") for n in names)
    assert not any(n.startswith(("research/", "benchmarks/", "tests/")) for n in names)


@pytest.mark.skipif(not DATA or not Path(DATA, "prosqa", "test.json").is_file(),
                    reason="evaluates on the local ProsQA test split: set ANCHORED_REASONING_DATA (CI sets ../shared/data)")
def test_installed_wheel_lists_tasks_trains_and_evaluates_from_another_directory(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], cwd=tmp_path,
         env=os.environ.copy())
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(OMP_NUM_THREADS="1", PATH=f"{venv / 'bin'}:{env.get('PATH', '')}")
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)], cwd=tmp_path, env=env)
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = _run([str(py), "-c", "import anchored_reasoning, anchored_reasoning.resources as r; "
                  "print(anchored_reasoning.__file__); print(r.builtin_dir('train'))"], cwd=work, env=env).split()
    assert str(venv) in where[0] and str(venv) in where[1], where  # the wheel's package, not the checkout's
    cli = str(venv / "bin" / "anchored-reasoning")
    listing = _run([cli, "tasks"], cwd=work, env=env)
    assert "gsm8k" in listing and "prosqa" in listing
    _run([cli, "train", "tiny_test", "output_dir=tiny", "--quiet"], cwd=work, env=env)
    assert (work / "tiny" / "anchored_reasoning.json").is_file()
    _run([cli, "eval", "--task", "prosqa", "--model", "tiny", "--split", "test", "--limit", "2",
          "--max-new-tokens", "4", "--out", "ev", "--quiet"], cwd=work, env=env)
    records = (work / "ev" / "records.jsonl").read_text().splitlines()
    assert len(records) == 2 and all("correct" in json.loads(r) for r in records)
    assert json.loads((work / "ev" / "summary.json").read_text())["task"] == "prosqa"
