"""`anchored-reasoning compare`: table, paired tests and plots over run directories."""
from __future__ import annotations

import json
import math

import pytest

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.eval.compare import compare_runs, expand_run_dirs, mcnemar_exact
from anchored_reasoning.eval.report import summarize

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(path, task, method, model, correct, *, tokens=10, n=1, summary=True, wall=2.0):
    """A run directory shaped like the runner's: correct[i] is a list of n booleans for example i."""
    path.mkdir(parents=True)
    records = []
    for i, samples in enumerate(correct):
        for s, ok in enumerate(samples):
            records.append({"id": f"e{i}", "sample": s, "prompt": "p", "completion": "c", "extracted": "1" if ok else None,
                            "correct": ok, "tokens": tokens, "seconds": 0.1, "finish_reason": "stop", "details": {}})
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    config = {"task": task, "method": {"name": method}, "backend": {"backend": "hf", "model": model},
              "sampling": {"n": n}, "sessions": [{"session": "s", "wall_seconds": wall}]}
    (path / "config.json").write_text(json.dumps(config))
    if summary:
        meta = {"task": task, "method": method, "model": model, "backend": "hf", "n": n, "wall_seconds": wall}
        s = summarize(records, n=n, ids=[f"e{i}" for i in range(len(correct))], meta=meta)
        (path / "summary.json").write_text(json.dumps(s))
    return path


@pytest.mark.parametrize("b,c", [(0, 0), (1, 0), (3, 1), (10, 0), (7, 12), (40, 25), (200, 230)])
def test_mcnemar_exact_matches_binomial_test(b, c):
    binomtest = pytest.importorskip("scipy.stats").binomtest

    want = 1.0 if b + c == 0 else binomtest(min(b, c), b + c, 0.5).pvalue
    assert mcnemar_exact(b, c) == pytest.approx(want, rel=1e-9)
    assert mcnemar_exact(b, c) == mcnemar_exact(c, b)


def test_mcnemar_known_values():
    assert mcnemar_exact(10, 0) == pytest.approx(2 * 0.5**10)
    assert mcnemar_exact(3, 1) == pytest.approx(0.625)
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


def test_compare_two_runs_table_tests_and_plots(tmp_path):
    # 20 shared examples: A right on 0-13, B right on 0-5 and 14-15  ->  only A: 8, only B: 2
    a = [[i < 14] for i in range(20)]
    b = [[i < 6 or 14 <= i < 16] for i in range(20)]
    ra = write_run(tmp_path / "cot", "gsm8k", "cot", "/m/smollm2", a, tokens=100, wall=4.0)
    rb = write_run(tmp_path / "nocot", "gsm8k", "nocot", "/m/smollm2", b, tokens=5, wall=1.0)
    out = tmp_path / "cmp"
    result = compare_runs([ra, rb], out_dir=out)
    table = result["table_markdown"]
    assert "cot/smollm2" in table and "nocot/smollm2" in table
    assert "70.0 [" in table and "40.0 [" in table  # accuracy with its interval
    assert "| 100.0 |" in table and "| 5.0 |" in table  # mean tokens
    runs = {r["label"]: r for r in result["runs"]}
    assert runs["cot/smollm2"]["tokens_per_second_wall"] == pytest.approx(20 * 100 / 4.0)
    (t,) = result["tests"]
    assert (t["only_a_correct"], t["only_b_correct"], t["both_correct"], t["both_wrong"]) == (8, 2, 6, 4)
    assert t["shared_examples"] == 20
    assert t["mcnemar_p"] == pytest.approx(mcnemar_exact(8, 2))
    assert t["diff"] == pytest.approx(0.3) and t["diff_ci_low"] <= 0.3 <= t["diff_ci_high"]
    for name in ("accuracy.png", "accuracy_vs_tokens.png"):
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000
    saved = json.loads((out / "compare.json").read_text())  # strict JSON (no NaN)
    assert saved["tests"][0]["only_a_correct"] == 8
    md = (out / "compare.md").read_text()
    assert "McNemar" in md and "cot/smollm2" in md


def test_only_shared_examples_are_paired_and_partial_runs_are_summarised(tmp_path):
    ra = write_run(tmp_path / "a", "gsm8k", "cot", "m", [[True]] * 10)
    rb = write_run(tmp_path / "b", "gsm8k", "nocot", "m", [[False]] * 4, summary=False)  # stopped early
    result = compare_runs([ra, rb])
    (t,) = result["tests"]
    assert t["shared_examples"] == 4 and t["only_a_correct"] == 4 and t["only_b_correct"] == 0
    b = next(r for r in result["runs"] if r["method"] == "nocot")
    assert b["counts"]["examples_done"] == 4 and b["accuracy"]["mean"] == 0.0


def test_pass_at_k_and_multi_sample_pairs(tmp_path):
    a = [[True, False, False, False]] * 5 + [[False] * 4] * 5
    b = [[True] * 4] * 3 + [[False] * 4] * 7
    ra = write_run(tmp_path / "a", "humaneval", "cot", "m", a, n=4)
    rb = write_run(tmp_path / "b", "humaneval", "nocot", "m", b, n=4)
    for d in (ra, rb):  # humaneval summaries carry pass@k
        recs = [json.loads(x) for x in (d / "records.jsonl").read_text().splitlines()]
        s = json.loads((d / "summary.json").read_text())
        s.update(summarize(recs, is_code=True, n=4, meta={k: s[k] for k in ("task", "method", "model", "backend", "n", "wall_seconds")}))
        (d / "summary.json").write_text(json.dumps(s))
    result = compare_runs([ra, rb])
    assert "pass@4 %" in result["table_markdown"]
    (t,) = result["tests"]
    assert t["accuracy_a"] == pytest.approx(0.125) and t["accuracy_b"] == pytest.approx(0.3)
    assert (t["only_a_correct"], t["only_b_correct"]) == (2, 0)  # sample 0 only


def test_different_tasks_are_not_paired_and_labels_say_the_task(tmp_path):
    ra = write_run(tmp_path / "a", "gsm8k", "cot", "m", [[True]] * 3)
    rb = write_run(tmp_path / "b", "aime24", "cot", "m", [[False]] * 3)
    result = compare_runs([ra, rb])
    assert result["tests"] == []
    assert {r["label"] for r in result["runs"]} == {"gsm8k/cot/m", "aime24/cot/m"}


def test_folder_of_runs_expands_and_bad_paths_are_clear(tmp_path):
    suite = tmp_path / "suite"
    write_run(suite / "gsm8k-cot", "gsm8k", "cot", "m", [[True]] * 3)
    write_run(suite / "gsm8k-nocot", "gsm8k", "nocot", "m", [[False]] * 3)
    assert [p.name for p in expand_run_dirs([suite])] == ["gsm8k-cot", "gsm8k-nocot"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no run"):
        expand_run_dirs([tmp_path / "empty"])
    with pytest.raises(ConfigError, match="not a directory"):
        expand_run_dirs([tmp_path / "missing"])


def test_cli_compare_prints_and_saves(tmp_path, capsys):
    from anchored_reasoning.cli import main

    ra = write_run(tmp_path / "a", "gsm8k", "cot", "m", [[True], [False], [True]])
    rb = write_run(tmp_path / "b", "gsm8k", "nocot", "m", [[False], [False], [True]])
    assert main(["compare", str(ra), str(rb), "--out", str(tmp_path / "o")]) == 0
    printed = capsys.readouterr().out
    assert "cot/m" in printed and "McNemar exact p" in printed and "accuracy.png" in printed
    assert (tmp_path / "o" / "accuracy.png").is_file()


@pytest.mark.slow
def test_compare_real_runs_of_the_runner(tmp_path):
    """Two real runs (tiny model, hf backend, nocot vs cot) go through compare unchanged."""
    import torch

    torch.set_num_threads(1)
    from anchored_reasoning.backends.hf import HFBackend
    from anchored_reasoning.eval.runner import run_eval
    from anchored_reasoning.testing import make_tiny_causal_lm
    from anchored_reasoning.types import Example

    path = make_tiny_causal_lm(tmp_path / "tiny")
    backend = HFBackend(str(path), device="cpu")
    examples = [Example(id=f"q{i}", question=f"What is {i} + {i}?", answer=str(2 * i)) for i in range(5)]
    for method in ("nocot", "cot"):
        run_eval("gsm8k", backend, method, out_dir=tmp_path / method, max_new_tokens=8, progress=False, examples=examples)
    result = compare_runs([tmp_path / "nocot", tmp_path / "cot"], out_dir=tmp_path / "cmp")
    assert len(result["runs"]) == 2 and len(result["tests"]) == 1
    assert result["tests"][0]["shared_examples"] == 5
    assert not math.isnan(result["runs"][0]["tokens"]["mean"])
    assert (tmp_path / "cmp" / "accuracy_vs_tokens.png").read_bytes()[:8] == PNG_MAGIC
