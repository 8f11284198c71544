"""Eval runner: records, summaries, resume (after a truncated write or a SIGKILL), config checks,
grading errors, and trained-checkpoint method selection. Uses a fake task and backend so that
only the runner's contract with them is exercised."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from anchored_reasoning.errors import ConfigError, ResumeError
from anchored_reasoning.eval.methods import build_method
from anchored_reasoning.eval.records import load_records
from anchored_reasoning.eval.runner import run_eval
from anchored_reasoning.methods.prompting import CoT, NoCoT
from anchored_reasoning.types import Completion, Example, Grade, SamplingSpec


class FakeTask:
    """Example i asks for 2*i; a completion is right when its last word is that number."""

    name = "fake"
    metrics = ["accuracy", "strict"]
    is_code = False
    generation = {"max_new_tokens": 8, "stop": ["\n\n"]}
    prompts = {"nocot": "Q: {question}\nA:", "cot": "Q: {question}\nThink step by step.\nA:"}

    def __init__(self, count=10, fail_on=()):
        self.count = count
        self.fail_on = set(fail_on)
        self.graded = 0

    def load(self, split, data_dir=None, limit=None):
        exs = [Example(id=f"ex{i}", question=f"What is {i} doubled?", answer=str(2 * i)) for i in range(self.count)]
        return exs[:limit] if limit else exs

    def render_question(self, example):
        return example.question

    def grade(self, completion, example):
        self.graded += 1
        if example.id in self.fail_on:
            raise RuntimeError("grader exploded")
        words = completion.split()
        extracted = words[-1] if words else None
        ok = extracted == example.answer
        return Grade(ok, extracted, {"strict": ok and completion.startswith("#")})


class FakeBackend:
    """Answers example i correctly when i is even; counts what it was asked to generate."""

    name = "fake"

    def __init__(self, model="fake-model", batch_size=4):
        self.model = model
        self.batch_size = batch_size
        self.calls: list[list[str]] = []
        self.specs: list[SamplingSpec] = []

    def describe(self):
        return {"backend": "fake", "model": self.model, "batch_size": self.batch_size}

    def generate(self, prompts, spec):
        self.calls.append([p.text for p in prompts])
        self.specs.append(spec)
        out = []
        for p in prompts:
            i = int(p.text.split("What is ")[1].split()[0])
            answer = 2 * i if i % 2 == 0 else 2 * i + 1
            out.append([Completion(f"# it is {answer}" if s == 0 else f"maybe {answer + s}", 3, 0.01, "stop") for s in range(spec.n)])
        return out


def _read(out):
    return [json.loads(l) for l in (Path(out) / "records.jsonl").read_text().splitlines()]


def test_run_writes_records_summary_and_config(tmp_path):
    task, backend = FakeTask(6), FakeBackend()
    summary = run_eval(task, backend, CoT(), out_dir=tmp_path, progress=False)
    records = _read(tmp_path)
    assert [(r["id"], r["sample"]) for r in records] == [(f"ex{i}", 0) for i in range(6)]
    r0 = records[0]
    assert r0["prompt"] == "Q: What is 0 doubled?\nThink step by step.\nA:"
    assert r0["completion"] == "# it is 0" and r0["extracted"] == "0" and r0["correct"] is True
    assert r0["tokens"] == 3 and r0["seconds"] == pytest.approx(0.01) and r0["details"] == {"strict": True}
    assert summary["accuracy"]["mean"] == pytest.approx(0.5)
    assert summary["metrics"]["strict"]["mean"] == pytest.approx(0.5)
    assert summary["counts"]["samples"] == 6 and summary["counts"]["missing"] == 0
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["accuracy"] == summary["accuracy"] and saved["task"] == "fake" and saved["method"] == "cot"
    assert "| fake | cot | fake-model |" in (tmp_path / "summary.md").read_text()
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["sampling"]["max_new_tokens"] == 8 and config["sampling"]["stop"] == ["\n\n"]
    assert config["method"] == {"name": "cot", "style": "instruct", "options": CoT().options}
    # chunks of batch_size prompts
    assert [len(c) for c in backend.calls] == [4, 2]


def test_resume_generates_only_missing_and_extends_limit(tmp_path):
    task = FakeTask(10)
    b1 = FakeBackend()
    run_eval(task, b1, NoCoT(), out_dir=tmp_path, limit=4, progress=False)
    first = _read(tmp_path)
    b2 = FakeBackend(batch_size=3)  # batch size may change between sessions
    summary = run_eval(task, b2, NoCoT(), out_dir=tmp_path, limit=7, progress=False)
    records = _read(tmp_path)
    keys = [(r["id"], r["sample"]) for r in records]
    assert len(keys) == len(set(keys)) == 7
    assert records[:4] == first  # untouched
    assert [p for call in b2.calls for p in call] == [f"Q: What is {i} doubled?\nA:" for i in (4, 5, 6)]
    assert summary["counts"]["examples"] == 7
    b3 = FakeBackend()
    run_eval(task, b3, NoCoT(), out_dir=tmp_path, limit=7, progress=False)
    assert b3.calls == []  # nothing left to do
    assert len(json.loads((tmp_path / "config.json").read_text())["sessions"]) == 3


def test_truncated_last_line_is_repaired(tmp_path):
    task = FakeTask(5)
    run_eval(task, FakeBackend(), NoCoT(), out_dir=tmp_path, progress=False)
    path = tmp_path / "records.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    # as if killed while writing the last record: half a line, no newline
    path.write_text("".join(lines[:3]) + lines[3][: len(lines[3]) // 2])
    backend = FakeBackend()
    run_eval(task, backend, NoCoT(), out_dir=tmp_path, progress=False)
    records = _read(tmp_path)
    assert sorted(r["id"] for r in records) == [f"ex{i}" for i in range(5)]
    assert [p for c in backend.calls for p in c] == ["Q: What is 3 doubled?\nA:", "Q: What is 4 doubled?\nA:"]


def test_load_records_drops_duplicates_and_garbage(tmp_path):
    path = tmp_path / "records.jsonl"
    rec = {"id": "a", "sample": 0, "correct": True}
    path.write_text(json.dumps(rec) + "\n" + "not json\n" + json.dumps({**rec, "correct": False}) + "\n" + json.dumps({"id": "b", "sample": 0}))
    records = load_records(path)
    assert records == [rec, {"id": "b", "sample": 0}]
    assert path.read_text() == json.dumps(rec) + "\n" + json.dumps({"id": "b", "sample": 0}) + "\n"


@pytest.mark.parametrize(
    "change",
    [
        {"method": NoCoT()},
        {"temperature": 0.7},
        {"max_new_tokens": 99},
        {"n": 2},
        {"backend": FakeBackend(model="other-model")},
        {"split": "train"},
    ],
)
def test_config_mismatch_is_refused(tmp_path, change):
    task = FakeTask(3)
    run_eval(task, FakeBackend(), CoT(), out_dir=tmp_path, progress=False)
    kwargs = {"method": CoT(), "backend": FakeBackend()}
    kwargs.update(change)
    method, backend = kwargs.pop("method"), kwargs.pop("backend")
    with pytest.raises(ResumeError, match="different settings"):
        run_eval(task, backend, method, out_dir=tmp_path, progress=False, **kwargs)


def test_a_run_recorded_before_an_option_existed_resumes_under_its_default(tmp_path):
    """A method option added later (``backup_marker``, default ``word``) is absent from an older run's
    config.json: asking for the default resumes that run, asking for another value is refused."""
    from anchored_reasoning.eval.records import check_resume
    from anchored_reasoning.methods import get_method

    def config(**options):
        method = get_method("anchor_chain", style="trained", revisits=True, mark_backups=True, **options)
        return {"task": "prosqa", "split": "test", "backend": {}, "sampling": {},
                "method": {"name": "anchor_chain", "style": "trained", "options": dataclasses.asdict(method)}}

    old = config()
    del old["method"]["options"]["backup_marker"]
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert check_resume(tmp_path, config(backup_marker="word")) == old
    with pytest.raises(ResumeError, match="backup_marker: 'word' \\(in the run\\) != 'token'"):
        check_resume(tmp_path, config(backup_marker="token"))


def test_records_without_config_are_refused(tmp_path):
    (tmp_path / "records.jsonl").write_text('{"id": "x", "sample": 0}\n')
    with pytest.raises(ResumeError, match="config.json"):
        run_eval(FakeTask(2), FakeBackend(), CoT(), out_dir=tmp_path, progress=False)


def test_concurrent_run_is_refused(tmp_path):
    import fcntl

    tmp_path.mkdir(exist_ok=True)
    with open(tmp_path / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(ResumeError, match="another run"):
            run_eval(FakeTask(2), FakeBackend(), CoT(), out_dir=tmp_path, progress=False)


def test_grading_errors_become_wrong_records(tmp_path):
    task = FakeTask(4, fail_on={"ex2"})
    summary = run_eval(task, FakeBackend(), CoT(), out_dir=tmp_path, progress=False)
    rec = {r["id"]: r for r in _read(tmp_path)}
    assert rec["ex2"]["correct"] is False and rec["ex2"]["extracted"] is None
    assert "grader exploded" in rec["ex2"]["details"]["grading_error"]
    assert rec["ex0"]["correct"] is True
    assert summary["counts"]["grading_errors"] == 1


def test_grade_batch_is_used_and_its_failure_falls_back(tmp_path):
    class BatchTask(FakeTask):
        def __init__(self, broken):
            super().__init__(4)
            self.broken, self.batches = broken, 0

        def grade_batch(self, completions, examples):
            self.batches += 1
            if self.broken:
                raise OSError("sandbox pool died")
            return [self.grade(c, e) for c, e in zip(completions, examples)]

    ok = BatchTask(False)
    run_eval(ok, FakeBackend(), CoT(), out_dir=tmp_path / "a", progress=False)
    assert ok.batches == 1 and ok.graded == 4
    broken = BatchTask(True)
    summary = run_eval(broken, FakeBackend(), CoT(), out_dir=tmp_path / "b", progress=False)
    assert broken.graded == 4 and summary["accuracy"]["mean"] == pytest.approx(0.5)


def test_n_samples_and_pass_at_k_for_code_tasks(tmp_path):
    task = FakeTask(4)
    task.is_code = True
    task.metrics = ["pass@k"]
    backend = FakeBackend()
    summary = run_eval(task, backend, CoT(), out_dir=tmp_path, n=3, temperature=0.8, seed=5, progress=False)
    assert backend.specs[0].n == 3 and backend.specs[0].temperature == 0.8 and backend.specs[0].seed == 5
    records = _read(tmp_path)
    assert sorted((r["id"], r["sample"]) for r in records) == [(f"ex{i}", s) for i in range(4) for s in range(3)]
    # even examples: sample 0 right, samples 1-2 wrong (c=1 of 3); odd: none right
    assert summary["pass_at_k"]["pass@1"]["mean"] == pytest.approx((1 / 3 + 0 + 1 / 3 + 0) / 4)
    assert summary["pass_at_k"]["pass@3"]["mean"] == pytest.approx(0.5)


def test_sampling_overrides_and_bad_arguments(tmp_path):
    backend = FakeBackend()
    run_eval(FakeTask(2), backend, CoT(), out_dir=tmp_path, max_new_tokens=3, stop=["X"], top_p=0.9, progress=False)
    spec = backend.specs[0]
    assert (spec.max_new_tokens, spec.stop, spec.top_p) == (3, ["X"], 0.9)
    with pytest.raises(ConfigError):
        run_eval(FakeTask(2), FakeBackend(), CoT(), out_dir=tmp_path / "x", n=0, progress=False)
    with pytest.raises(ConfigError, match="no prompt template"):
        run_eval(FakeTask(2), FakeBackend(), CoT(template="missing"), out_dir=tmp_path / "y", progress=False)


def test_instruct_prompt_has_text_and_chat_turns():
    p = CoT(system="Be brief.").prompt(Example("a", "2+2?", "4"), FakeTask())
    assert p.text == "Q: 2+2?\nThink step by step.\nA:"
    assert p.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": p.text}]


def test_build_method_reads_checkpoint_metadata(tmp_path):
    assert isinstance(build_method("cot", tmp_path), CoT)  # no metadata: instruct style
    (tmp_path / "anchored_reasoning.json").write_text(json.dumps({"method": "acot", "method_options": {"k": 2}, "style": "trained"}))
    m = build_method(None, tmp_path)
    assert m.name == "acot" and m.k == 2 and m.style == "trained"
    assert build_method("acot", tmp_path).k == 2
    with pytest.raises(ConfigError, match="trained with method 'acot'"):
        build_method("cot", tmp_path)
    (tmp_path / "anchored_reasoning.json").write_text(json.dumps({"method": "cot", "style": "trained"}))
    m = build_method("cot", tmp_path)
    assert m.style == "trained" and not isinstance(m, CoT)
    with pytest.raises(ConfigError, match="--method"):
        build_method(None, tmp_path / "nothing-here")


KILL_SCRIPT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {tests!r})
    from test_runner import FakeTask, FakeBackend
    from anchored_reasoning.eval.runner import run_eval
    from anchored_reasoning.methods.prompting import CoT

    class SlowBackend(FakeBackend):
        def generate(self, prompts, spec):
            time.sleep(0.15)
            return super().generate(prompts, spec)

    run_eval(FakeTask(12), SlowBackend(batch_size=2), CoT(), out_dir={out!r}, progress=False)
    """
)


@pytest.mark.slow
def test_sigkill_mid_run_then_resume(tmp_path):
    out = tmp_path / "run"
    script = tmp_path / "run.py"
    script.write_text(KILL_SCRIPT.format(tests=str(Path(__file__).parent), out=str(out)))
    proc = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "OMP_NUM_THREADS": "1"})
    records = out / "records.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline:
        if records.exists() and records.read_text().count("\n") >= 4:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = load_records(records, repair=False)  # a line cut short by the kill is not counted
    assert 4 <= len(first) < 12, "the run should have been killed midway"
    subprocess.run([sys.executable, str(script)], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    final = _read(out)
    keys = [(r["id"], r["sample"]) for r in final]
    assert len(keys) == len(set(keys)) == 12
    assert final[: len(first)] == first  # finished samples were kept, not regenerated
    sessions = {r["session"] for r in final}
    assert len(sessions) == 2
    config = json.loads((out / "config.json").read_text())
    killed, resumed = config["sessions"]
    assert "ended" not in killed and killed["wall_seconds"] > 0
    assert killed["generated"] in (len(first) - 2, len(first))  # the kill may fall between records and config (chunk of 2)
    assert resumed["generated"] == 12 - len(first) and "ended" in resumed


def test_samples_that_finished_before_a_backend_failure_are_kept(tmp_path):
    from anchored_reasoning.errors import BackendError

    class DiesMidChunk(FakeBackend):
        def generate(self, prompts, spec):
            done = super().generate(prompts[:2], spec)  # two prompts answered, then the server dies
            err = BackendError("server died")
            err.partial = {0: done[0], 1: done[1]}
            raise err

    task = FakeTask(6)
    with pytest.raises(BackendError, match="server died"):
        run_eval(task, DiesMidChunk(batch_size=6), NoCoT(), out_dir=tmp_path, progress=False)
    assert sorted(r["id"] for r in _read(tmp_path)) == ["ex0", "ex1"]  # nothing that finished is lost
    backend = FakeBackend()
    run_eval(task, backend, NoCoT(), out_dir=tmp_path, progress=False)  # the rerun does only the rest
    assert [p for c in backend.calls for p in c] == [f"Q: What is {i} doubled?\nA:" for i in range(2, 6)]
    assert sorted(r["id"] for r in _read(tmp_path)) == [f"ex{i}" for i in range(6)]
