"""Evaluation details (issue 49, items 5 and 7): ``run_eval`` resolves a method name against a
checkpoint trained here exactly as ``anchored-reasoning eval --method`` does; HumanEval's
``completion`` template is a real method; records carry the ``gold`` answer; an answer that is
neither option is a wrong answer, not "no answer"."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from anchored_reasoning.cli import main
from anchored_reasoning.errors import ConfigError
from anchored_reasoning.eval.regrade import regrade_run
from anchored_reasoning.eval.methods import method_for_backend
from anchored_reasoning.eval.records import RECORDS, load_records
from anchored_reasoning.eval.runner import run_eval
from anchored_reasoning.generators.prosqa import write_json
from anchored_reasoning.methods import get_method, list_methods
from anchored_reasoning.methods.prompting import CoT
from anchored_reasoning.tasks import get_task, list_tasks
from anchored_reasoning.types import Completion, Example

SIZE = {"num_nodes": 6, "min_hops": 1, "max_hops": 2}


class EchoBackend:
    """Answers every prompt with ``answer``; ``model`` is what an openai backend holds (a name or a path)."""

    name = "echo"

    def __init__(self, answer="", model="echo-model"):
        self.answer, self.model, self.batch_size = answer, model, 8
        self.prompts = []
        self.specs = []

    def describe(self):
        return {"backend": "echo", "model": self.model}

    def generate(self, prompts, spec):
        self.prompts += prompts
        self.specs.append(spec)
        return [[Completion(self.answer, 3, 0.01, "stop")] for _ in prompts]


# ----------------------------------------------------------------------------- item 5: one prompt for a trained checkpoint


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A checkpoint trained here with CoT (tiny_test, one step) and a ProsQA data folder."""
    import torch

    from anchored_reasoning.train import get_trainer

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("trained")
    ckpt = get_trainer("ar")("tiny_test", [f"output_dir={root / 'ckpt'}", "method.name=cot", "method.options={}",
                                            "training.max_steps=1", "training.generation_eval=false"])
    data = root / "data"
    write_json(data / "prosqa" / "test.json", 3, seed=5, **SIZE)
    return Path(ckpt), data


def _prompts(out: Path) -> list[str]:
    return [r["prompt"] for r in load_records(out / RECORDS)]


def test_run_eval_by_name_prompts_a_trained_checkpoint_as_the_cli_does(trained, tmp_path, capsys):
    from anchored_reasoning.backends import get_backend

    ckpt, data = trained
    common = ["--limit", "3", "--max-new-tokens", "2", "--no-progress", "--data-dir", str(data)]
    assert main(["eval", "--task", "prosqa", "--model", str(ckpt), "--method", "cot", "--out", str(tmp_path / "cli"), *common]) == 0
    capsys.readouterr()
    backend = get_backend("hf", str(ckpt), device="cpu")
    for name in ("cot", None):
        out = tmp_path / f"lib-{name}"
        run_eval("prosqa", backend, name, out_dir=out, limit=3, max_new_tokens=2, data_dir=data, progress=False)
        assert _prompts(out) == _prompts(tmp_path / "cli")
        assert json.loads((out / "config.json").read_text())["method"]["style"] == "trained"
    assert all(p.endswith("[BoR]") for p in _prompts(tmp_path / "cli"))  # the trained format, not the instruct one


def test_run_eval_refuses_what_the_trained_checkpoint_never_saw(trained, tmp_path):
    ckpt, data = trained
    examples = get_task("prosqa").load("test", data_dir=data)
    backend = EchoBackend(model=str(ckpt))  # an openai backend serving the checkpoint's folder
    with pytest.raises(ConfigError, match="trained with method 'cot'.*--method cot"):
        run_eval("prosqa", backend, "nocot", out_dir=tmp_path / "a", examples=examples, progress=False)
    with pytest.raises(ConfigError, match="instruct-style 'cot'.*build_method"):
        run_eval("prosqa", backend, CoT(), out_dir=tmp_path / "b", examples=examples, progress=False)
    assert backend.prompts == []  # refused before any work
    run_eval("prosqa", backend, "cot", out_dir=tmp_path / "c", examples=examples, progress=False)
    assert all(p.text.endswith("[BoR]") for p in backend.prompts)


def test_method_for_backend_without_a_checkpoint_is_the_registry_method(tmp_path):
    assert isinstance(method_for_backend("cot", EchoBackend(model="some/hub-id")), CoT)
    assert isinstance(method_for_backend("cot", EchoBackend(), model=tmp_path), CoT)  # a folder without metadata
    with pytest.raises(ConfigError, match="no method given"):
        method_for_backend(None, EchoBackend())


# ----------------------------------------------------------------------------- item 7: completion is a method


def _write_humaneval(folder: Path) -> Path:
    rows = [{
        "task_id": f"HumanEval/{i}",
        "prompt": f'def add{i}(a, b):\n    """Return a + b."""\n',
        "entry_point": f"add{i}",
        "canonical_solution": "    return a + b\n",
        "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
    } for i in range(2)]
    path = folder / "humaneval" / "HumanEval.jsonl.gz"
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return folder


def test_every_listed_prompt_is_a_method(capsys):
    assert main(["tasks", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert "completion" in rows["humaneval"]["methods"]
    for name in list_tasks():
        for method in rows[name]["methods"]:
            assert method in list_methods(), (name, method)
            get_method(method)  # builds


def test_completion_method_gives_the_raw_prompt_to_continue(tmp_path):
    data = _write_humaneval(tmp_path / "data")
    backend = EchoBackend(answer="    return a + b\n")
    summary = run_eval("humaneval", backend, "completion", out_dir=tmp_path / "run", data_dir=data, progress=False)
    task = get_task("humaneval")
    examples = task.load("test", data_dir=data)
    assert [p.text for p in backend.prompts] == [e.question for e in examples]
    assert all(p.messages is None for p in backend.prompts)  # never a chat turn
    assert "\ndef " in backend.specs[0].stop  # the task's stop strings for completion
    assert summary["counts"]["correct"] == 2
    with pytest.raises(ConfigError, match="no system turn"):
        get_method("completion", system="be brief")


def test_cli_method_completion_runs_humaneval(tmp_path, capsys):
    from anchored_reasoning.testing import make_tiny_causal_lm

    tiny = make_tiny_causal_lm(tmp_path / "tiny")
    data = _write_humaneval(tmp_path / "data")
    rc = main(["eval", "--task", "humaneval", "--model", str(tiny), "--method", "completion", "--max-new-tokens", "4",
               "--data-dir", str(data), "--out", str(tmp_path / "run"), "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    records = load_records(tmp_path / "run" / RECORDS)
    assert [r["prompt"] for r in records] == [e.question for e in get_task("humaneval").load("test", data_dir=data)]


# ----------------------------------------------------------------------------- item 7: gold, and neither-option answers

PROSQA_EX = Example(id="p0", question="Is Sally a sterpus or a hilpus?", answer="Sally is a sterpus.",
                    meta={"answer_concept": "sterpus", "neg_concept": "hilpus", "entity": "Sally"})


@pytest.mark.parametrize("task,example,gold", [
    ("prosqa", PROSQA_EX, "sterpus"),
    ("gsm8k", Example(id="g0", question="1+1?", answer="2"), "2"),
    ("prontoqa", Example(id="t0", question="True or false: x", answer="False"), "False"),
    ("humaneval", Example(id="h0", question="def f():\n", answer="    return 1\n", meta={"entry_point": "f"}), None),
])
def test_task_gold_is_what_the_grader_compares(task, example, gold):
    assert get_task(task).gold(example) == gold


def test_records_carry_gold_and_regrade_fills_it(tmp_path):
    run_eval("prosqa", EchoBackend("Sally is a sterpus."), "nocot", out_dir=tmp_path, examples=[PROSQA_EX], progress=False)
    (record,) = load_records(tmp_path / RECORDS)
    assert record["gold"] == "sterpus" and record["extracted"] == "sterpus" and record["correct"]
    # a record written before gold existed gets it on regrading
    del record["gold"]
    (tmp_path / RECORDS).write_text(json.dumps(record) + "\n")
    config = json.loads((tmp_path / "config.json").read_text())
    data = tmp_path / "data"
    (data / "prosqa").mkdir(parents=True)
    (data / "prosqa" / "test.json").write_text("[]")
    result = regrade_run(tmp_path, task=_OneExampleTask(), data_dir=data, write=True)
    assert result.changes == [] and config["task"] == "prosqa"
    assert load_records(tmp_path / RECORDS)[0]["gold"] == "sterpus"


class _OneExampleTask:
    """ProsQA, loading only PROSQA_EX (regrade loads the run's examples through the task)."""

    def __init__(self):
        self._task = get_task("prosqa")
        self.name, self.metrics, self.is_code = "prosqa", self._task.metrics, False

    def load(self, split, data_dir=None, limit=None):
        return [PROSQA_EX]

    def __getattr__(self, name):
        return getattr(self._task, name)


@pytest.mark.parametrize("task,example,completion,extracted", [
    ("prosqa", PROSQA_EX, "Sally is a rempus.", "rempus"),
    ("prosqa", PROSQA_EX, "### Sally is a Rempus.", "rempus"),
    ("prontoqa", Example(id="t0", question="q", answer="True"), "The answer is Unknown.", "Unknown"),
    ("prontoqa", Example(id="t0", question="q", answer="True"), "### maybe", "maybe"),
])
def test_an_answer_that_is_neither_option_is_wrong_not_missing(task, example, completion, extracted):
    grade = get_task(task).grade(completion, example)
    assert grade.extracted == extracted and grade.correct is False


def test_an_option_named_anywhere_still_wins_over_other_concepts():
    grade = get_task("prosqa").grade("Sally is a sterpus. Every sterpus is a rempus. Sally is a rempus.", PROSQA_EX)
    assert grade.extracted == "sterpus" and grade.correct is True


@pytest.mark.parametrize("task,example,completion", [
    ("prosqa", PROSQA_EX, ""),
    ("prosqa", PROSQA_EX, "Sally is not a hilpus."),
    ("prosqa", PROSQA_EX, "Every rempus is a gorpus."),
    ("prontoqa", Example(id="t0", question="q", answer="True"), "I cannot tell"),
    ("prontoqa", Example(id="t0", question="q", answer="True"), "The answer is not clear."),
])
def test_text_without_an_answer_stays_no_answer(task, example, completion):
    grade = get_task(task).grade(completion, example)
    assert grade.extracted is None and grade.correct is False


def test_summary_counts_a_neither_option_answer_as_wrong_not_as_no_answer(tmp_path):
    summary = run_eval("prosqa", EchoBackend("Sally is a rempus."), "nocot", out_dir=tmp_path / "a",
                       examples=[PROSQA_EX], progress=False)
    assert summary["counts"]["no_answer"] == 0 and summary["counts"]["correct"] == 0
    summary = run_eval("prosqa", EchoBackend("I do not know."), "nocot", out_dir=tmp_path / "b",
                       examples=[PROSQA_EX], progress=False)
    assert summary["counts"]["no_answer"] == 1
