"""The `tasks` and `eval` commands: argument handling, the suite seam, an end-to-end run on a
tiny model, a SIGKILL mid-run followed by a resume, and (slow) the embedded model on GSM8K."""
from __future__ import annotations

import importlib.machinery
import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from anchored_reasoning.cli import main
from anchored_reasoning.commands.eval import parse_key_values
from anchored_reasoning.errors import ConfigError
from anchored_reasoning.eval.records import load_records
from anchored_reasoning.testing import make_tiny_causal_lm

DATA = os.environ.get("ANCHORED_REASONING_DATA")
needs_data = pytest.mark.skipif(
    not DATA or not Path(DATA, "gsm8k", "test.jsonl").is_file(),
    reason="needs the local GSM8K copy: set ANCHORED_REASONING_DATA (CI sets ../shared/data)",
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(make_tiny_causal_lm(tmp_path_factory.mktemp("tiny")))


def test_parse_key_values():
    assert parse_key_values(["batch_size=4", "dtype=bfloat16", "chat=off", "x=1.5", "flag=true", "s="], "--x") == {
        "batch_size": 4, "dtype": "bfloat16", "chat": False, "x": 1.5, "flag": True, "s": ""}
    assert parse_key_values(["top-k=3"], "--x") == {"top_k": 3}
    with pytest.raises(ConfigError, match="key=value"):
        parse_key_values(["novalue"], "--backend-arg")


def test_tasks_command_lists_tasks(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["task", "splits", "metrics"]
    assert "gsm8k" in out and "accuracy,strict,flexible" in out
    assert main(["tasks", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r for r in rows}
    assert {"gsm8k", "humaneval", "prontoqa"} <= set(by_name)
    assert by_name["humaneval"]["code"] is True and "test" in by_name["gsm8k"]["splits"]


def test_eval_needs_task_model_out(capsys):
    assert main(["eval", "--task", "gsm8k"]) == 1
    assert "--model, --out" in capsys.readouterr().err


def test_suite_seam(monkeypatch, tmp_path, capsys):
    """A suite gets only the flags the user gave, as a plain mapping: a flag left out does not override."""
    seen = {}

    def run_suite(path, overrides, progress=True):
        seen.update(path=path, overrides=overrides, progress=progress)
        return {"suite": "s", "out": tmp_path, "runs": [], "summaries": [], "table": "| table |\n", "compare": None}
    module = types.ModuleType("anchored_reasoning.eval.suites")
    module.__spec__ = importlib.machinery.ModuleSpec("anchored_reasoning.eval.suites", None)
    module.run_suite = run_suite
    monkeypatch.setitem(sys.modules, "anchored_reasoning.eval.suites", module)
    assert main(["eval", str(tmp_path / "suite.yaml"), "--limit", "3", "--seed", "0", "--no-progress"]) == 0
    assert seen == {"path": str(tmp_path / "suite.yaml"), "overrides": {"limit": 3, "seed": 0}, "progress": False}
    assert capsys.readouterr().out.startswith("| table |")
    # --task / --method filter the suite's runs; --method-arg reaches every run (not dropped)
    assert main(["eval", str(tmp_path / "suite.yaml"), "--task", "gsm8k", "--method-arg", "k=3"]) == 0
    assert seen["overrides"] == {"task": "gsm8k", "method_args": {"k": 3}}


class SeededBackend:
    def __init__(self, model, seed=0, depth=1):
        self.seed, self.depth = seed, depth


class UnseededBackend:
    def __init__(self, model, depth=1):
        self.depth = depth


def test_build_backend_passes_the_seed_where_taken(monkeypatch):
    from anchored_reasoning import backends

    monkeypatch.setitem(backends._BACKENDS, "seeded", f"{__name__}:SeededBackend")
    monkeypatch.setitem(backends._BACKENDS, "unseeded", f"{__name__}:UnseededBackend")
    assert vars(backends.build_backend("seeded", "m", seed=3, depth=2)) == {"seed": 3, "depth": 2}
    assert vars(backends.build_backend("seeded", "m")) == {"seed": 0, "depth": 1}  # no seed: the backend's default
    assert vars(backends.build_backend("unseeded", "m", seed=3, depth=2)) == {"depth": 2}  # takes no seed
    with pytest.raises(ConfigError, match=r"backend 'unseeded' does not accept these options \['depht'\].*--backend-arg"):
        backends.build_backend("unseeded", "m", seed=3, depht=2)


def test_backend_options_are_checked(tiny, tmp_path, capsys):
    rc = main(["eval", "--task", "gsm8k", "--model", tiny, "--method", "cot", "--out", str(tmp_path),
               "--backend-arg", "no_such_option=1"])
    assert rc == 1 and "does not accept" in capsys.readouterr().err


@needs_data
def test_eval_end_to_end_and_trained_checkpoint(tiny, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["eval", "--task", "gsm8k", "--model", tiny, "--method", "cot", "--limit", "3", "--max-new-tokens", "8",
            "--batch-size", "2", "--out", str(out), "--no-progress", "--data-dir", DATA]
    assert main(args) == 0
    assert "| gsm8k | cot |" in capsys.readouterr().out
    records = [json.loads(l) for l in (out / "records.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["test-0", "test-1", "test-2"]
    assert all(r["tokens"] <= 8 and "#### <number>" in r["prompt"] for r in records)
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["metrics"]) == {"strict", "flexible"} and summary["counts"]["samples"] == 3
    # A checkpoint of ours carries its method: no --method needed, trained-style prompt.
    (Path(tiny) / "anchored_reasoning.json").write_text(json.dumps({"method": "cot", "method_options": {}, "style": "trained"}))
    try:
        out2 = tmp_path / "trained"
        assert main(["eval", "--task", "gsm8k", "--model", tiny, "--limit", "2", "--max-new-tokens", "4",
                     "--out", str(out2), "--no-progress", "--data-dir", DATA]) == 0
        config = json.loads((out2 / "config.json").read_text())
        assert config["method"]["name"] == "cot" and config["method"]["style"] == "trained"
        rec = json.loads((out2 / "records.jsonl").read_text().splitlines()[0])
        assert rec["prompt"].endswith("[BoR]")
    finally:
        (Path(tiny) / "anchored_reasoning.json").unlink()


@needs_data
@pytest.mark.slow
def test_cli_sigkill_mid_run_then_resume(tiny, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "anchored_reasoning.cli", "eval", "--task", "gsm8k", "--model", tiny, "--method", "cot",
           "--limit", "12", "--batch-size", "1", "--max-new-tokens", "64", "--stop", "@@@@", "--out", str(out),
           "--no-progress", "--data-dir", DATA]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = out / "records.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if records.exists() and records.read_bytes().count(b"\n") >= 2:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = load_records(records, repair=False)
    assert 2 <= len(first) < 12, f"expected a kill midway, found {len(first)} records"
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    final = load_records(records, repair=False)
    keys = [(r["id"], r["sample"]) for r in final]
    assert len(keys) == len(set(keys)) == 12
    assert final[: len(first)] == first  # the finished samples were not regenerated
    assert len({r["session"] for r in final[len(first):]}) == 1 and final[-1]["session"] != first[0]["session"]


@needs_data
@pytest.mark.slow
def test_acceptance_embedded_model_gsm8k(tmp_path):
    """The README's main command at --limit 4 (and 256 new tokens, to keep CI short): offline, CPU, the embedded SmolLM2."""
    out = tmp_path / "smol"
    cmd = [sys.executable, "-m", "anchored_reasoning.cli", "eval", "--task", "gsm8k", "--model", "smollm2-135m",
           "--method", "cot", "--limit", "4", "--batch-size", "4", "--max-new-tokens", "256", "--out", str(out), "--no-progress"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"]["samples"] == 4 and summary["model"] == "smollm2-135m"
    records = load_records(out / "records.jsonl", repair=False)
    assert all(r["completion"].strip() for r in records)  # the instruct model answers in words
    assert sum(r["details"]["flexible_extracted"] is not None for r in records) >= 3  # with numbers in them
