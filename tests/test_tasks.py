"""The task registry, YAML specs, loaders (local and Hub code paths) and prompt rendering."""
from __future__ import annotations

import csv
import gzip
import io
import json
import re
from pathlib import Path

import pytest

from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.tasks import format_choices, get_task, list_tasks
from anchored_reasoning.types import Example

BUILTIN = ["aime24", "aime25", "gpqa_diamond", "gsm8k", "humaneval", "prontoqa", "prosqa"]
HEX40 = re.compile(r"^[0-9a-f]{40}$")


@pytest.fixture(autouse=True)
def _no_env_data(monkeypatch):
    # Tests here build their own data folders; the real one must not leak in.
    monkeypatch.delenv("ANCHORED_REASONING_DATA", raising=False)
    monkeypatch.delenv("ANCHORED_REASONING_TASKS_DIR", raising=False)


# ----------------------------------------------------------------------------- registry


def test_builtin_tasks_are_listed_and_complete():
    assert set(BUILTIN) <= set(list_tasks())
    for name in BUILTIN:
        task = get_task(name)
        assert task.name == name
        assert {"nocot", "cot"} <= set(task.prompts)
        assert task.splits and "test" in task.splits
        assert task.metrics
        gen = task.generation_for("cot")
        assert isinstance(gen["max_new_tokens"], int) and isinstance(gen["stop"], list)
        assert task.is_code is (name == "humaneval")


def test_metrics_and_methods():
    assert get_task("gsm8k").metrics == ["accuracy", "strict", "flexible"]
    assert get_task("humaneval").metrics == ["pass@k"]
    assert get_task("gsm8k").generation_for("nocot")["max_new_tokens"] < get_task("gsm8k").generation_for("cot")["max_new_tokens"]


def test_hub_revisions_are_pinned_commit_shas():
    for name in ["gsm8k", "aime24", "aime25", "gpqa_diamond", "humaneval", "prosqa"]:
        hub = get_task(name).hub
        assert HEX40.match(hub["revision"]), name
    assert get_task("gsm8k").hub["path"] == "openai/gsm8k" and get_task("gsm8k").hub["name"] == "main"
    assert get_task("gpqa_diamond").hub["path"] == "Idavidrein/gpqa"
    assert get_task("humaneval").hub["path"] == "openai/openai_humaneval"
    for entries in get_task("prosqa").hub["splits"].values():
        for entry in entries:
            assert get_task("prosqa").hub["revision"] in entry["url"] and len(entry["sha256"]) == 64
    # no public pinned ProntoQA copy exists: the spec says how to generate it instead
    assert get_task("prontoqa").hub["kind"] == "none"


def test_unknown_task_and_split():
    with pytest.raises(ConfigError, match="unknown task"):
        get_task("nope")
    with pytest.raises(ConfigError, match="no split"):
        get_task("gsm8k").load("dev", data_dir=".")


USER_TASK = """\
name: {name}
description: a user task
splits: [test]
data:
  loader: fields
  options: {{question: q, answer: a, id: key}}
  local: {{test: mine/test.jsonl}}
extractor: last_number
grader: math
prompts:
  nocot: "{{question}} Answer:"
  cot: "{{question}} Think, then answer:"
"""


def test_user_task_dir_adds_and_overrides_tasks(tmp_path, monkeypatch):
    tasks_dir = tmp_path / "tasks"
    tasks_dir.mkdir()
    (tasks_dir / "mytask.yaml").write_text(USER_TASK.format(name="mytask"))
    (tasks_dir / "override.yaml").write_text(USER_TASK.format(name="gsm8k"))
    data = tmp_path / "data" / "mine"
    data.mkdir(parents=True)
    (data / "test.jsonl").write_text(
        json.dumps({"key": "k1", "q": "2+2?", "a": 4}) + "\n" + json.dumps({"key": "k2", "q": "1+1?", "a": "2"}) + "\n"
    )
    monkeypatch.setenv("ANCHORED_REASONING_TASKS_DIR", str(tasks_dir))
    assert "mytask" in list_tasks() and set(BUILTIN) <= set(list_tasks())
    task = get_task("mytask")
    examples = task.load("test", data_dir=tmp_path / "data")
    assert [e.id for e in examples] == ["k1", "k2"] and examples[0].answer == "4"
    assert task.grade("so it is 4", examples[0]).correct
    assert not task.grade("so it is 5", examples[0]).correct
    assert task.format_prompt("cot", examples[1]) == "1+1? Think, then answer:"
    # the user folder comes first: its gsm8k wins over the built-in one
    assert get_task("gsm8k").description == "a user task"
    # a task can also be named by its file
    assert get_task(str(tasks_dir / "mytask.yaml")).name == "mytask"


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda s: s.replace("grader: math", "grader: nosuch"), "unknown grader"),
        (lambda s: s.replace("extractor: last_number", "extractor: nosuch"), "unknown extractor"),
        (lambda s: s.replace("loader: fields", "loader: nosuch"), "unknown row loader"),
        (lambda s: s.replace("loader: fields", "loader: 'nosuchmodule:fn'"), "cannot be imported"),
        (lambda s: s + "colour: blue\n", "unknown key"),
        (lambda s: s.replace('"{question} Answer:"', '"Answer:"'), "does not contain"),
        (lambda s: s.replace('"{question} Answer:"', '"{question} \\\\boxed{}"'), "not a valid template"),
        (lambda s: s.replace("splits: [test]", "splits: []"), "splits"),
        (lambda s: s.replace("local: {test:", "local: {train:"), "not in splits"),
        (lambda s: s + "  - broken: [\n", "invalid YAML"),
    ],
)
def test_bad_task_specs_fail_with_the_file_and_key(tmp_path, monkeypatch, mutate, message):
    tasks_dir = tmp_path / "tasks"
    tasks_dir.mkdir()
    (tasks_dir / "bad.yaml").write_text(mutate(USER_TASK.format(name="bad")))
    monkeypatch.setenv("ANCHORED_REASONING_TASKS_DIR", str(tasks_dir))
    with pytest.raises(ConfigError, match=message):
        get_task("bad")


def test_duplicate_names_in_one_folder(tmp_path, monkeypatch):
    tasks_dir = tmp_path / "tasks"
    tasks_dir.mkdir()
    (tasks_dir / "a.yaml").write_text(USER_TASK.format(name="same"))
    (tasks_dir / "b.yaml").write_text(USER_TASK.format(name="same"))
    monkeypatch.setenv("ANCHORED_REASONING_TASKS_DIR", str(tasks_dir))
    with pytest.raises(ConfigError, match="declared twice"):
        list_tasks()


# ----------------------------------------------------------------------------- local loading


def _write_jsonl(path: Path, rows: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


GSM_OK = {"question": "Q?", "answer": "It is 2*3=<<2*3=6>>6.\nThen 6+1=<<6+1=7>>7.\n#### 7"}


def test_gsm8k_row_keeps_annotations_in_meta(tmp_path):
    _write_jsonl(tmp_path / "gsm8k" / "test.jsonl", [GSM_OK, {"question": "R?", "answer": "x\n#### 1,234"}])
    first, second = get_task("gsm8k").load("test", data_dir=tmp_path)
    assert first.answer == "7" and second.answer == "1234"
    assert first.steps == ["It is 2*3=6.", "Then 6+1=7."]
    assert first.meta["calculations"] == [["2*3=6"], ["6+1=7"]]
    assert first.meta["solution"] == GSM_OK["answer"]
    assert first.id == "test-0"


@pytest.mark.parametrize(
    "bad_row,message",
    [
        ("{not json", "invalid JSON"),
        ({"question": "Q?"}, "missing key 'answer'"),
        ({"question": 3, "answer": "#### 1"}, "must be a string"),
        ({"question": "Q?", "answer": "no final line"}, "no '#### <answer>'"),
        ({"question": "Q?", "answer": "#### twelve"}, "not a number"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_jsonl_malformed_row_names_file_and_line(tmp_path, bad_row, message):
    _write_jsonl(tmp_path / "gsm8k" / "test.jsonl", [GSM_OK, GSM_OK, bad_row, GSM_OK])
    with pytest.raises(DataError, match=message) as info:
        get_task("gsm8k").load("test", data_dir=tmp_path)
    assert f"{tmp_path / 'gsm8k' / 'test.jsonl'}:3" in str(info.value)


PROSQA_OK = {
    "question": "Every a is a b. Tom is a a. Is Tom a b or c?",
    "answer": "Tom is a b.",
    "steps": ["Tom is a a.", "Every a is a b."],
    "idx_to_symbol": ["Tom", "a", "b", "c"],
    "edges": [[0, 1], [1, 2]],
    "root": 0,
    "target": 2,
    "neg_target": 3,
}


@pytest.mark.parametrize(
    "change,message",
    [
        ({"answer": "Tom is a c."}, "disagrees"),
        ({"answer": "b"}, "not of the form"),
        ({"target": 9}, "outside idx_to_symbol"),
        ({"root": "0"}, "must be an integer"),
        ({"edges": [[0]]}, "edges"),
        ({"steps": "Tom is a a."}, "list of strings"),
    ],
)
def test_json_list_malformed_item_names_file_and_index(tmp_path, change, message):
    bad = {**PROSQA_OK, **change}
    path = tmp_path / "prosqa" / "test.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps([PROSQA_OK, bad]))
    with pytest.raises(DataError, match=message) as info:
        get_task("prosqa").load("test", data_dir=tmp_path)
    assert f"{path}: item 1" in str(info.value)


def test_json_list_broken_json_and_wrong_shape(tmp_path):
    path = tmp_path / "prosqa" / "test.json"
    path.parent.mkdir(parents=True)
    path.write_text('[\n{"question": "x",\n')
    with pytest.raises(DataError, match=r"test.json:\d+: invalid JSON"):
        get_task("prosqa").load("test", data_dir=tmp_path)
    path.write_text(json.dumps({"not": "a list"}))
    with pytest.raises(DataError, match="expected a JSON list"):
        get_task("prosqa").load("test", data_dir=tmp_path)


def test_prosqa_meta(tmp_path):
    path = tmp_path / "prosqa" / "test.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps([PROSQA_OK]))
    (ex,) = get_task("prosqa").load("test", data_dir=tmp_path)
    assert ex.answer == "Tom is a b."
    assert ex.meta["answer_concept"] == "b" and ex.meta["neg_concept"] == "c" and ex.meta["entity"] == "Tom"
    assert ex.meta["edges"] == [[0, 1], [1, 2]] and ex.meta["idx_to_symbol"][ex.meta["target"]] == "b"


def test_prontoqa_validates_answer(tmp_path):
    path = tmp_path / "prontoqa" / "test.json"
    path.parent.mkdir(parents=True)
    good = {"question": "Q. True or false: x.", "steps": ["a", "b"], "answer": "True"}
    path.write_text(json.dumps([good, {**good, "answer": "Maybe"}]))
    with pytest.raises(DataError, match="item 1.*'True' or 'False'"):
        get_task("prontoqa").load("test", data_dir=tmp_path)


GPQA_HEADER = ["Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3", "Record ID"]


def _write_gpqa(path: Path, rows: list[list[str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(GPQA_HEADER)
    writer.writerows(rows)
    with gzip.open(path, "wt", newline="") as handle:
        handle.write(buf.getvalue())


def _gpqa_rows(n: int) -> list[list[str]]:
    return [[f"synthetic question {i}\nwith two lines", f"right{i}", f"w1-{i}", f"w2-{i}", f"w3-{i}", f"rec{i}"] for i in range(n)]


def test_gpqa_shuffle_is_deterministic_and_seeded(tmp_path, monkeypatch):
    _write_gpqa(tmp_path / "gpqa" / "gpqa_diamond.csv.gz", _gpqa_rows(40))
    task = get_task("gpqa_diamond")
    first = task.load("test", data_dir=tmp_path)
    again = task.load("test", data_dir=tmp_path)
    assert [e.choices for e in first] == [e.choices for e in again]
    for i, ex in enumerate(first):
        assert ex.id == f"rec{i}" and len(ex.choices) == 4
        assert ex.choices["ABCD".index(ex.answer)] == f"right{i}"
        assert sorted(ex.choices) == sorted([f"right{i}", f"w1-{i}", f"w2-{i}", f"w3-{i}"])
    assert len({e.answer for e in first}) == 4  # the correct option is not always in one place
    # the order of one question does not depend on the rows loaded with it
    _write_gpqa(tmp_path / "gpqa" / "gpqa_diamond.csv.gz", _gpqa_rows(40)[5:6])
    assert task.load("test", data_dir=tmp_path)[0].choices == first[5].choices
    # another seed, another order
    task.loader_options["shuffle_seed"] = 1
    try:
        _write_gpqa(tmp_path / "gpqa" / "gpqa_diamond.csv.gz", _gpqa_rows(40))
        other = task.load("test", data_dir=tmp_path)
    finally:
        task.loader_options["shuffle_seed"] = 0
    assert [e.choices for e in other] != [e.choices for e in first]


@pytest.mark.parametrize(
    "row,message",
    [
        (["q", "", "w1", "w2", "w3", "recX"], "'Correct Answer' is empty"),
        (["q", "same", "same", "w2", "w3", "recX"], "identical"),
        (["q", "a", "b"], "missing fields"),
        (["q", "a", "b", "c", "d", "rec", "extra"], "more fields"),
    ],
)
def test_csv_gz_malformed_row_names_file_and_row(tmp_path, row, message):
    path = tmp_path / "gpqa" / "gpqa_diamond.csv.gz"
    _write_gpqa(path, [*_gpqa_rows(2), row])
    with pytest.raises(DataError, match=message) as info:
        get_task("gpqa_diamond").load("test", data_dir=tmp_path)
    # two data rows with a two-line question each come first: the bad one is row 2, line 6
    assert f"{path}: row 2 (line 6)" in str(info.value)


def test_gpqa_error_never_contains_question_text(tmp_path):
    path = tmp_path / "gpqa" / "gpqa_diamond.csv.gz"
    _write_gpqa(path, [["SECRET QUESTION TEXT", "a", "a", "b", "c", "r1"]])
    with pytest.raises(DataError) as info:
        get_task("gpqa_diamond").load("test", data_dir=tmp_path)
    assert "SECRET" not in str(info.value)


def test_duplicate_ids_and_empty_files(tmp_path):
    _write_gpqa(tmp_path / "gpqa" / "gpqa_diamond.csv.gz", [_gpqa_rows(1)[0], _gpqa_rows(1)[0]])
    with pytest.raises(DataError, match="duplicate example id 'rec0'"):
        get_task("gpqa_diamond").load("test", data_dir=tmp_path)
    _write_jsonl(tmp_path / "gsm8k" / "test.jsonl", [])
    with pytest.raises(DataError, match="no rows"):
        get_task("gsm8k").load("test", data_dir=tmp_path)


def test_missing_local_file_and_missing_data_dir(tmp_path):
    with pytest.raises(DataError, match="not found"):
        get_task("gsm8k").load("test", data_dir=tmp_path)
    with pytest.raises(DataError, match="has no local file"):
        get_task("prosqa").load("train", data_dir=tmp_path)
    with pytest.raises(DataError, match="does not exist"):
        get_task("gsm8k").load("test", data_dir=tmp_path / "nope")


def test_env_var_selects_local_data_and_limit(tmp_path, monkeypatch):
    _write_jsonl(tmp_path / "gsm8k" / "test.jsonl", [GSM_OK] * 5)
    monkeypatch.setenv("ANCHORED_REASONING_DATA", str(tmp_path))
    assert len(get_task("gsm8k").load("test", limit=2)) == 2
    assert len(get_task("gsm8k").load("test")) == 5


def test_aime_rows(tmp_path):
    _write_jsonl(
        tmp_path / "aime" / "aime24.jsonl",
        [{"id": 60, "problem": "P", "answer": "025", "solution": "a\n\nb"}, {"problem": "Q", "answer": 7}],
    )
    first, second = get_task("aime24").load("test", data_dir=tmp_path)
    assert (first.id, first.answer, first.steps) == ("60", "25", ["a", "b"])
    assert (second.id, second.answer) == ("test-1", "7")
    for bad in ("1000", "-1", "x", 2.5, True):
        _write_jsonl(tmp_path / "aime" / "aime24.jsonl", [{"problem": "P", "answer": bad}])
        with pytest.raises(DataError, match="0-999"):
            get_task("aime24").load("test", data_dir=tmp_path)


def test_humaneval_rows(tmp_path):
    row = {
        "task_id": "HumanEval/0",
        "prompt": "def f(x):\n    ",
        "entry_point": "f",
        "canonical_solution": "return x\n",
        "test": "def check(candidate):\n    assert candidate(1) == 1\n",
    }
    path = tmp_path / "humaneval" / "HumanEval.jsonl.gz"
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt") as handle:
        handle.write(json.dumps(row) + "\n" + json.dumps({**row, "task_id": "HumanEval/1", "entry_point": "g"}) + "\n")
    with pytest.raises(DataError, match=r"HumanEval.jsonl.gz:2: entry_point 'g'"):
        get_task("humaneval").load("test", data_dir=tmp_path)
    with gzip.open(path, "wt") as handle:
        handle.write(json.dumps(row) + "\n")
    (ex,) = get_task("humaneval").load("test", data_dir=tmp_path)
    assert ex.question == row["prompt"] and ex.meta["entry_point"] == "f"
    assert {"prompt", "test", "entry_point", "canonical_solution"} <= set(ex.meta)


# ----------------------------------------------------------------------------- Hub code paths (faked)


def test_hub_datasets_path(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(path, name=None, split=None, revision=None):
        calls.append((path, name, split, revision))
        return [GSM_OK, {"question": "Q2", "answer": "#### 3"}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    examples = get_task("gsm8k").load("test")
    assert calls == [("openai/gsm8k", "main", "test", get_task("gsm8k").hub["revision"])]
    assert [e.answer for e in examples] == ["7", "3"]


def test_hub_datasets_bad_row_and_failure(monkeypatch):
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: [GSM_OK, {"question": "Q2"}])
    with pytest.raises(DataError, match=r"openai/gsm8k@e53f048856ff split test row 1: missing key 'answer'"):
        get_task("gsm8k").load("test")

    def offline(*a, **k):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match="ANCHORED_REASONING_DATA"):
        get_task("gsm8k").load("test")


def test_hub_files_path(monkeypatch, tmp_path):
    import huggingface_hub

    files = {
        "aime2025-I.jsonl": [{"question": "P1", "answer": "70"}],
        "aime2025-II.jsonl": [{"question": "P2", "answer": "588"}],
    }
    seen = []

    def fake_download(repo_id, filename, repo_type=None, revision=None):
        seen.append((repo_id, filename, repo_type, revision))
        path = tmp_path / filename
        _write_jsonl(path, files[filename])
        return str(path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    examples = get_task("aime25").load("test")
    assert [e.answer for e in examples] == ["70", "588"] and [e.id for e in examples] == ["test-0", "test-1"]
    assert {s[0] for s in seen} == {"opencompass/AIME2025"} and {s[2] for s in seen} == {"dataset"}
    assert {s[3] for s in seen} == {get_task("aime25").hub["revision"]}


def test_hub_urls_path_checks_sha256(monkeypatch, tmp_path):
    import hashlib
    import urllib.request

    payload = json.dumps([PROSQA_OK]).encode()

    class FakeResponse(io.BytesIO):
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    requested = []

    def fake_urlopen(request, timeout=None):
        requested.append(request.full_url)
        return FakeResponse(payload)

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    monkeypatch.setenv("ANCHORED_REASONING_CACHE", str(tmp_path / "cache"))
    task = get_task("prosqa")
    with pytest.raises(DataError, match="differs from the pinned"):
        task.load("test")  # the fake payload is not the published file
    entry = task.hub["splits"]["test"][0]
    original = entry["sha256"]
    entry["sha256"] = hashlib.sha256(payload).hexdigest()
    try:
        (ex,) = task.load("test")
        assert ex.meta["answer_concept"] == "b"
        assert requested[-1].startswith("https://raw.githubusercontent.com/facebookresearch/coconut/")
    finally:
        entry["sha256"] = original


def test_prontoqa_has_no_remote_source_and_says_how_to_get_it():
    with pytest.raises(DataError, match="asaparov/prontoqa"):
        get_task("prontoqa").load("test")


# ----------------------------------------------------------------------------- prompts


def test_render_question_and_prompts():
    task = get_task("gpqa_diamond")
    ex = Example(id="1", question="Which?", answer="B", choices=["one", "two", "three", "four"])
    assert format_choices(ex.choices) == "A) one\nB) two\nC) three\nD) four"
    assert task.render_question(ex) == "Which?\n\nA) one\nB) two\nC) three\nD) four"
    prompt = task.format_prompt("cot", ex)
    assert "Which?\n\nA) one\nB) two" in prompt and "Answer: $LETTER" in prompt
    # a template that places {choices} itself gets the bare question in {question}
    task2 = get_task("gpqa_diamond")
    saved = dict(task2.prompts)
    task2.prompts["custom"] = "Q: {question}\nOptions:\n{choices}\nAnswer:"
    try:
        assert task2.format_prompt("custom", ex) == "Q: Which?\nOptions:\nA) one\nB) two\nC) three\nD) four\nAnswer:"
    finally:
        task2.prompts.clear()
        task2.prompts.update(saved)
    aime = get_task("aime24").format_prompt("cot", Example(id="1", question="P", answer="1"))
    assert aime.startswith("P\n\n") and "\\boxed{}" in aime
    with pytest.raises(ConfigError, match="no prompt template"):
        task.format_prompt("acot", ex)


def test_templates_agree_with_the_instruct_methods():
    from anchored_reasoning.methods import get_method

    ex = Example(id="1", question="Which?", answer="B", choices=["one", "two", "three", "four"])
    for name in BUILTIN:
        task = get_task(name)
        example = ex if name == "gpqa_diamond" else Example(id="1", question="Q {x}", answer="1", meta={"entry_point": "f"})
        for method in ("nocot", "cot"):
            assert get_method(method).prompt(example, task).text == task.format_prompt(method, example)


HOOK_MODULE = """
from anchored_reasoning.types import Example


def strict_hook(row, ctx):
    # fails with a plain KeyError on a row without "a"
    return Example(id=str(row["id"]), question=row["q"], answer=str(row["a"]))
"""


def test_user_hook_by_import_path_and_its_errors(tmp_path, monkeypatch):
    (tmp_path / "my_hooks_mod.py").write_text(HOOK_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    tasks_dir = tmp_path / "tasks"
    tasks_dir.mkdir()
    spec = USER_TASK.format(name="hooked").replace("loader: fields", "loader: 'my_hooks_mod:strict_hook'")
    (tasks_dir / "hooked.yaml").write_text(spec)
    _write_jsonl(tmp_path / "data" / "mine" / "test.jsonl", [{"id": 1, "q": "Q", "a": 2}])
    monkeypatch.setenv("ANCHORED_REASONING_TASKS_DIR", str(tasks_dir))
    (ex,) = get_task("hooked").load("test", data_dir=tmp_path / "data")
    assert (ex.id, ex.answer) == ("1", "2")
    _write_jsonl(tmp_path / "data" / "mine" / "test.jsonl", [{"id": 1, "q": "Q", "a": 2}, {"id": 2, "q": "Q"}])
    with pytest.raises(DataError, match=r"test.jsonl:2: the row loader failed with KeyError"):
        get_task("hooked").load("test", data_dir=tmp_path / "data")
