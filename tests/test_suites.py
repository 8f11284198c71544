"""Evaluation suites: validation, overrides (the flags the user gave, nothing else), the built-in suites,
and end-to-end runs."""
from __future__ import annotations

import json

import pytest

from anchored_reasoning import backends
from anchored_reasoning.cli import main
from anchored_reasoning.commands.eval import suite_overrides
from anchored_reasoning.errors import ConfigError
from anchored_reasoning.eval.suites import find_suite, load_suite, plan, run_suite
from anchored_reasoning.types import Completion

GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?", "answer": "3+4=<<3+4=7>>7\n#### 7"},
    {"question": "A box holds 12 eggs. How many eggs are in 2 boxes?", "answer": "12*2=<<12*2=24>>24\n#### 24"},
    {"question": "What is 16 - 3 - 4?", "answer": "16-3-4=<<16-3-4=9>>9\n#### 9"},
]


class EchoBackend:
    """Answers 7 to everything; remembers the seed and options it was built with."""

    name = "echo"
    built: list["EchoBackend"] = []

    def __init__(self, model, seed=0, **options):
        self.model, self.seed, self.options, self.batch_size = model, seed, options, 8
        EchoBackend.built.append(self)

    def describe(self):
        return {"backend": "echo", "model": self.model}

    def generate(self, prompts, spec):
        return [[Completion("The answer is 7.", 4, 0.0, "stop") for _ in range(spec.n)] for _ in prompts]


def eval_args(*argv: str):
    from anchored_reasoning.cli import build_parser

    return build_parser().parse_args(["eval", *argv])


def write(path, text):
    path.write_text(text)
    return path


def test_unknown_keys_and_missing_parts_are_named(tmp_path):
    bad = write(tmp_path / "a.yaml", "model: m\nruns:\n  - {task: gsm8k, methods: [cot], temprature: 0.5}\n")
    with pytest.raises(ConfigError, match=r"runs\[0\].*temprature"):
        load_suite(bad)
    with pytest.raises(ConfigError, match="unknown key.*modle"):
        load_suite(write(tmp_path / "b.yaml", "modle: m\nruns: [{task: gsm8k, method: cot}]\n"))
    with pytest.raises(ConfigError, match="'runs' must be a non-empty list"):
        load_suite(write(tmp_path / "c.yaml", "model: m\n"))
    with pytest.raises(ConfigError, match="'method' or 'methods'"):
        load_suite(write(tmp_path / "d.yaml", "runs: [{task: gsm8k}]\n"))
    with pytest.raises(ConfigError, match="run names repeat"):
        load_suite(write(tmp_path / "e.yaml", "runs: [{task: gsm8k, method: cot}, {task: gsm8k, method: cot, n: 4}]\n"))
    with pytest.raises(ConfigError, match="no suite file.*built-in suites:.*baselines"):
        find_suite("no-such-suite")


def test_builtin_baselines_suite_covers_the_benchmarks():
    from anchored_reasoning.tasks import get_task

    suite = load_suite("baselines")
    assert suite.backend == "openai" and suite.compare
    pairs = {(r.task, r.method) for r in suite.runs}
    assert pairs == {(t, m) for t in ("gsm8k", "aime24", "aime25", "gpqa_diamond", "humaneval") for m in ("nocot", "cot")}
    for r in suite.runs:
        assert r.method in get_task(r.task).prompts  # every run has its prompt template
    he = [r for r in suite.runs if r.task == "humaneval"]
    assert any(not r.settings.get("n") for r in he)  # a greedy pass@1 run ...
    assert any(r.settings.get("n") == 10 and r.settings["temperature"] > 0 for r in he)  # ... and a sampled pass@10 one
    small = load_suite("smollm2-gsm8k")
    assert [r.settings["limit"] for r in small.runs] == [50, 50] and small.model == "smollm2-135m"


def test_command_line_overrides_and_filters(tmp_path):
    suite_file = write(tmp_path / "s.yaml", (
        "model: base/model\nbackend: openai\nbackend_args: {base_url: 'http://h:1/v1', concurrency: 4}\n"
        "defaults: {limit: 10, n: 2, temperature: 0.5}\n"
        "runs:\n  - {task: gsm8k, methods: [nocot, cot]}\n  - {task: aime24, method: cot, n: 4}\n"
    ))
    suite = load_suite(suite_file)
    assert suite_overrides(eval_args(str(suite_file))) == {}  # no flag given: nothing overridden
    spec, runs = plan(suite)  # the suite's own settings
    assert spec == {"backend": "openai", "model": "base/model", "options": {"base_url": "http://h:1/v1", "concurrency": 4}}
    assert [(r.name, r.settings["n"], r.settings["limit"]) for r in runs] == [("gsm8k-nocot", 2, 10), ("gsm8k-cot", 2, 10), ("aime24-cot", 4, 10)]
    args = eval_args(str(suite_file), "--limit", "3", "--n", "1", "--model", "other", "--base-url", "http://x:2/v1",
                     "--backend-arg", "concurrency=8", "--method", "cot")
    assert suite_overrides(args) == {"limit": 3, "n": 1, "model": "other", "method": "cot",
                                     "backend_args": {"base_url": "http://x:2/v1", "concurrency": 8}}
    spec, runs = plan(suite, suite_overrides(args))
    assert spec["model"] == "other" and spec["options"] == {"base_url": "http://x:2/v1", "concurrency": 8}
    assert [(r.name, r.settings["limit"]) for r in runs] == [("gsm8k-cot", 3), ("aime24-cot", 3)]
    assert [r.settings["n"] for r in runs] == [1, 1]  # --n 1 given: it overrides the suite's n: 2 and n: 4
    assert [r.settings["temperature"] for r in runs] == [0.5, 0.5]  # not given: the suite's
    with pytest.raises(ConfigError, match="no run matches"):
        plan(suite, suite_overrides(eval_args(str(suite_file), "--task", "humaneval")))
    with pytest.raises(ConfigError, match="suite overrides: unknown key.*temprature"):
        plan(suite, {"temprature": 0.1})
    with pytest.raises(ConfigError, match="suite overrides: n must be an integer, got '2'"):
        plan(suite, {"n": "2"})
    with pytest.raises(ConfigError, match=r"runs\[0\]: temperature must be a number"):
        load_suite(write(tmp_path / "t.yaml", "model: m\nruns: [{task: gsm8k, method: cot, temperature: hot}]\n"))


def test_a_suite_runs_with_its_own_settings_and_a_flag_overrides_one(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(backends._BACKENDS, "echo", f"{__name__}:EchoBackend")
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GSM8K_ROWS))
    monkeypatch.setenv("ANCHORED_REASONING_DATA", str(tmp_path / "data"))
    suite_file = write(tmp_path / "s.yaml", (
        f"model: some-model\nbackend: echo\nbackend_args: {{depth: 2}}\nout: {tmp_path / 'own'}\n"
        "defaults: {limit: 2, n: 2, seed: 5, temperature: 0.5, max_new_tokens: 5}\nruns:\n  - {task: gsm8k, method: cot}\n"
    ))

    def ran(out):
        config = json.loads((out / "gsm8k-cot" / "config.json").read_text())
        return {"split": config["split"], "limit": config["limit"], **{k: config["sampling"][k] for k in
                ("n", "seed", "temperature", "max_new_tokens")}}

    result = run_suite(suite_file, progress=False)  # no overrides: the file's values, run_eval's split
    assert ran(tmp_path / "own") == {"split": "test", "limit": 2, "n": 2, "seed": 5, "temperature": 0.5, "max_new_tokens": 5}
    assert result["runs"] == [tmp_path / "own" / "gsm8k-cot"] and result["compare"] is None
    assert (EchoBackend.built[-1].seed, EchoBackend.built[-1].options) == (5, {"depth": 2})
    assert main(["eval", str(suite_file), "--temperature", "0.9", "--out", str(tmp_path / "flag"), "--no-progress"]) == 0
    assert ran(tmp_path / "flag") == {"split": "test", "limit": 2, "n": 2, "seed": 5, "temperature": 0.9, "max_new_tokens": 5}
    assert "suite s: 1 runs in" in capsys.readouterr().out


@pytest.mark.slow
def test_suite_runs_end_to_end_and_resumes(tmp_path, capsys):
    import torch

    torch.set_num_threads(1)
    from anchored_reasoning.cli import main
    from anchored_reasoning.testing import make_tiny_causal_lm

    model = make_tiny_causal_lm(tmp_path / "tiny")
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GSM8K_ROWS))
    out = tmp_path / "out"
    suite_file = write(tmp_path / "tiny.yaml", (
        f"name: tiny\nmodel: {model}\nbackend: hf\nbackend_args: {{device: cpu}}\nout: {out}\n"
        "defaults: {max_new_tokens: 6}\nruns:\n  - {task: gsm8k, methods: [nocot, cot]}\n"
    ))
    argv = ["eval", str(suite_file), "--data-dir", str(tmp_path / "data"), "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "McNemar exact p" in printed and "suite tiny: 2 runs" in printed
    for name in ("gsm8k-nocot", "gsm8k-cot"):
        lines = (out / name / "records.jsonl").read_text().splitlines()
        assert len(lines) == 3
    assert (out / "compare" / "accuracy.png").is_file() and (out / "summary.md").is_file()
    plan_saved = json.loads((out / "suite.json").read_text())
    assert [r["name"] for r in plan_saved["runs"]] == ["gsm8k-nocot", "gsm8k-cot"]
    before = (out / "gsm8k-cot" / "records.jsonl").read_text()
    assert main(argv) == 0  # rerun: resumes, nothing generated again
    assert (out / "gsm8k-cot" / "records.jsonl").read_text() == before
    sessions = json.loads((out / "gsm8k-cot" / "config.json").read_text())["sessions"]
    assert len(sessions) == 2 and sessions[-1]["generated"] == 0
