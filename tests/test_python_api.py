"""The Python API: ``import anchored_reasoning as ar`` exposes the library lazily, the trainer assembles a method's
training as the recipe path does, and the Python blocks of the README and docs/python-api.md run as written."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import anchored_reasoning as ar
from anchored_reasoning.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "trl", "datasets")
PUBLIC = [
    "AnchoredSFTConfig", "AnchoredSFTTrainer", "DiffusionSFTConfig", "DiffusionSFTTrainer", "TADMTrainingConfig",
    "TADMTrainer", "AnchoredGRPOConfig", "AnchoredGRPOTrainer", "DiffusionGRPOConfig", "DiffusionGRPOTrainer",
    "get_task", "list_tasks", "Task", "get_method", "list_methods", "get_backend", "list_backends", "run_eval",
    "compare_runs", "generate", "model_path", "Example", "SamplingSpec", "Completion", "Prompt", "Grade",
    "AnchoredReasoningError", "ConfigError", "DataError", "BackendError", "ResumeError",
]
SIZE = dict(num_nodes=12, min_hops=2, max_hops=2, neg_depth="match")


def _run(code: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env_code = "import os; os.environ.setdefault('OMP_NUM_THREADS', '1')\n" + code
    return subprocess.run([sys.executable, "-c", env_code], cwd=cwd, capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------------------------
# the package's names

def test_import_is_lazy_and_a_name_loads_its_module(tmp_path):
    probe = (f"import sys\nimport anchored_reasoning as ar\nheavy = {HEAVY!r}\n"
             "print([m for m in heavy if m in sys.modules])\n"
             "ar.get_task\nprint([m for m in heavy if m in sys.modules])\n"
             "ar.AnchoredSFTConfig\nprint(sorted(m for m in ('torch', 'trl') if m in sys.modules))\n")
    out = _run(probe, tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    before, after_task, after_trainer = out.stdout.strip().splitlines()[-3:]
    assert before == "[]"  # import anchored_reasoning pulls in none of torch, transformers, trl, datasets
    assert "'trl'" not in after_task and "'torch'" not in after_task  # the task registry needs no torch
    assert after_trainer == "['torch', 'trl']"


def test_public_names_are_listed_documented_and_unknown_names_fail():
    for name in PUBLIC:
        assert name in ar.__all__ and name in dir(ar), name
        obj = getattr(ar, name)
        assert (obj.__doc__ or "").strip(), f"{name} has no docstring"
    assert set(ar._LAZY) <= set(ar.__all__)  # every lazily loaded name is listed
    assert ar.AnchoredSFTTrainer.__module__ == "anchored_reasoning.train.trainers.acot_trainer"
    assert ar.run_eval.__module__ == "anchored_reasoning.eval.runner"
    with pytest.raises(AttributeError, match="no attribute 'AnchoredTrainer'"):
        ar.AnchoredTrainer  # noqa: B018


def test_model_path_resolves_an_alias_and_registers_the_architecture():
    from transformers import AutoConfig

    path = ar.model_path("logic-gpt2-search")
    assert Path(path).is_dir() and (Path(path) / "model.safetensors").is_file()
    assert AutoConfig.from_pretrained(path).model_type == "shift-gpt2"  # known without trust_remote_code
    with pytest.raises(ConfigError, match="logic-gpt2-search"):
        ar.model_path("logic-gpt2-serch")  # a near miss names the alias


def test_generate_applies_the_trace_and_refuses_bad_options_before_work():
    plain = ar.generate("prosqa", n=4, seed=0, **SIZE)
    dfs = ar.generate("prosqa", n=4, seed=0, trace="dfs", **SIZE)
    assert [ex.question for ex in plain] == [ex.question for ex in dfs]  # same problems, seeded
    assert all(ex.meta["trace"] == "dfs" for ex in dfs) and all("trace" not in ex.meta for ex in plain)
    assert any(s.startswith("Back to ") for ex in ar.generate("prosqa", n=20, seed=0, trace="dfs", **SIZE) for s in ex.steps)
    assert len(ar.generate("prontoqa", n=3, seed=0, hops=3)) == 3
    with pytest.raises(ConfigError, match="unknown option.*nodes"):
        ar.generate("prosqa", n=4, nodes=12)
    with pytest.raises(ConfigError, match="trace 'backward' is defined for prontoqa"):
        ar.generate("prosqa", n=4, trace="backward")
    with pytest.raises(ConfigError, match="no generator for task 'gsm8k'"):
        ar.generate("gsm8k", n=4)
    with pytest.raises(ConfigError, match="positive int"):
        ar.generate("prosqa", n=0)


# ---------------------------------------------------------------------------------------------
# the trainer, given a method

@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    """A tiny causal LM whose tokenizer has none of the format's special tokens."""
    from anchored_reasoning.testing import make_tiny_causal_lm

    texts = [ex.question + " " + " ".join(ex.steps) for ex in ar.generate("prosqa", n=40, seed=3, **SIZE)]
    return make_tiny_causal_lm(tmp_path_factory.mktemp("tiny"), texts=texts, hidden_size=32, vocab_size=400)


def _load(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def _args(out, **over):
    settings = dict(output_dir=str(out), max_steps=2, per_device_train_batch_size=4, learning_rate=1e-3,
                    logging_steps=1, disable_tqdm=True)
    return ar.AnchoredSFTConfig(**{**settings, **over})


def test_trainer_with_a_method_name_trains_saves_and_evaluates_in_its_trained_format(tiny_path, tmp_path):
    import torch

    from anchored_reasoning.eval.methods import method_for_backend
    from anchored_reasoning.methods.anchored import ANT, SPECIAL_TOKENS
    from anchored_reasoning.tasks import get_task
    from anchored_reasoning.train.data.collate import AnchoredCollator
    from anchored_reasoning.train.callbacks.curriculum import CurriculumCallback, TimeBudgetCallback

    torch.set_num_threads(1)
    model, tok = _load(tiny_path)
    assert ANT not in tok.get_vocab()
    before = model.get_input_embeddings().weight.shape[0]
    train = ar.generate("prosqa", n=16, seed=0, **SIZE)
    trainer = ar.AnchoredSFTTrainer(model=model, processing_class=tok, method="acot", task="prosqa",
                                    train_dataset=train, args=_args(tmp_path / "acot"))
    # the method's tokens are in the tokenizer, the embeddings grew to match, and k came from num_anchor_slots
    assert all(t in tok.get_vocab() for t in SPECIAL_TOKENS)
    assert model.get_input_embeddings().weight.shape[0] == len(tok) == before + len(SPECIAL_TOKENS)
    assert trainer.method.name == "acot" and trainer.method.k == trainer.args.num_anchor_slots == 6
    assert isinstance(trainer.data_collator, AnchoredCollator) and trainer.data_collator.task == "prosqa"
    kinds = {type(c) for c in trainer.callback_handler.callbacks}
    assert {CurriculumCallback, TimeBudgetCallback} <= kinds
    assert trainer.train_dataset.column_names == ["example"]  # the Examples, wrapped for the collator

    trainer.train()
    assert trainer.state.global_step == 2 and trainer.compute_loss_calls >= 2
    assert any("anchor_loss" in h for h in trainer.state.log_history)
    trainer.save_model()
    out = tmp_path / "acot"
    meta = json.loads((out / "anchored_reasoning.json").read_text())
    assert meta["method"] == "acot" and meta["style"] == "trained" and meta["task"] == "prosqa"
    assert meta["method_options"] == trainer.method.options
    assert ANT in _load(out)[1].get_vocab()  # the tokenizer was saved with the weights

    held = ar.generate("prosqa", n=3, seed=1, **SIZE)
    backend = ar.get_backend("hf", str(out))
    summary = ar.run_eval("prosqa", backend, None, examples=held, out_dir=tmp_path / "eval", max_new_tokens=4,
                          progress=False)
    assert summary["method"] == "acot" and summary["style"] == "trained"
    records = [json.loads(line) for line in (tmp_path / "eval" / "records.jsonl").read_text().splitlines()]
    cli_method = method_for_backend(None, backend)  # what `anchored-reasoning eval --model <out>` prompts with
    task = get_task("prosqa")
    by_id = {ex.id: ex for ex in held}
    assert len(records) == 3
    for rec in records:
        assert rec["prompt"] == cli_method.prompt(by_id[rec["id"]], task).text
        assert ANT * 6 in rec["prompt"]  # the trained format, slots and all
    with pytest.raises(ConfigError, match="trained with method 'acot'"):
        ar.run_eval("prosqa", backend, "cot", examples=held, out_dir=tmp_path / "eval-cot")


def test_trainer_initialises_an_added_token_as_the_recipe_path_does(tiny_path, tmp_path):
    """anchor_chain's one-token back-up marker starts from the word's embedding (prepare_for_method, shared)."""
    import torch

    model, tok = _load(tiny_path)
    ids = tok(" Back", add_special_tokens=False)["input_ids"]
    expected = model.get_input_embeddings().weight[ids].mean(0).detach().clone()
    trainer = ar.AnchoredSFTTrainer(
        model=model, processing_class=tok, method="anchor_chain", task="prosqa",
        method_options={"revisits": True, "mark_backups": True, "backup_marker": "token", "backup_marker_init": "word"},
        train_dataset=ar.generate("prosqa", n=8, seed=0, trace="dfs", **SIZE), args=_args(tmp_path / "chain"))
    row = tok.convert_tokens_to_ids("[Back]")
    assert trainer.method.added_tokens == ("[Back]",)
    assert torch.allclose(model.get_input_embeddings().weight[row], expected)


def test_trainer_takes_a_model_alias_and_sets_a_missing_pad_token(tmp_path):
    trainer = ar.AnchoredSFTTrainer(model="logic-gpt2-search", method="cot", task="prosqa",
                                    method_options={"step_separator": " "},
                                    train_dataset=ar.generate("prosqa", n=4, seed=0, trace="dfs", **SIZE),
                                    args=_args(tmp_path / "cot"))
    assert type(trainer.model).__name__ == "ShiftGPT2LMHeadModel"
    assert trainer.processing_class.pad_token is not None and trainer.method.step_separator == " "


def test_bad_trainer_input_fails_before_training(tiny_path, tmp_path):
    from trl import SFTConfig

    from anchored_reasoning.methods import get_method

    model, tok = _load(tiny_path)
    train = ar.generate("prosqa", n=4, seed=0, **SIZE)
    common = dict(model=model, processing_class=tok, train_dataset=train, args=_args(tmp_path / "bad"))
    cases = [
        (dict(common), "rendered by a method: pass method="),
        (dict(common, method="cot", train_dataset=[{"question": "q"}]), "must hold Examples"),
        (dict(common, method_options={"k": 3}), "method_options given without a method"),
        (dict(common, method=get_method("cot", style="trained"), method_options={"k": 3}), "method object"),
        (dict(common, method=get_method("cot")), "no training format"),
        (dict(common, method="completion"), "no training format"),
        (dict(common, method="acto"), "unknown method 'acto'"),
        (dict(common, method="cot", processing_class=None), "pass processing_class=tokenizer"),
        (dict(common, method="cot", args=SFTConfig(output_dir=str(tmp_path / "sft"), bf16=False, use_cpu=True)), "AnchoredSFTConfig"),
        (dict(common, method="cot", args=_args(tmp_path / "g", generation_eval=True)), "pass eval_dataset"),
        (dict(common, method="acot", method_options={"remove_steps_per_stage": 1},
              args=_args(tmp_path / "c", curriculum=True)), "curriculum: .* stages"),  # refused before training
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            ar.AnchoredSFTTrainer(**kwargs)


# ---------------------------------------------------------------------------------------------
# the documented blocks run as written

def python_blocks(text: str, heading: str | None = None) -> list[str]:
    """The ```python blocks of ``text`` (under ``heading`` only: up to the next heading of any level)."""
    if heading is not None:
        start = text.find(heading + "\n")
        if start < 0:
            return []
        rest = text[start + len(heading) + 1:]
        end = re.search(r"^#{1,6} ", rest, flags=re.M)
        text = rest[: end.start()] if end else rest
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)


def readme_snippet() -> str:
    """The README's "Fine-tune from Python" block (README.md, else the draft README.new.md)."""
    for name in ("README.md", "README.new.md"):
        path = ROOT / name
        if path.is_file():
            blocks = python_blocks(path.read_text(), "### Fine-tune from Python")
            if blocks:
                return blocks[0]
    pytest.fail("no ```python block under '### Fine-tune from Python' in README.md or README.new.md")


def _assert_prints_a_probability(out: subprocess.CompletedProcess, what: str) -> None:
    assert out.returncode == 0, f"{what} failed:\n{out.stderr[-4000:]}"
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    try:
        value = float(last)
    except ValueError:
        pytest.fail(f"{what} should print a float last, printed {last!r}")
    assert 0.0 <= value <= 1.0


def test_docs_blocks_parse():
    text = (ROOT / "docs" / "python-api.md").read_text()
    blocks = python_blocks(text)
    assert len(blocks) >= 2
    assert "ar.AnchoredSFTTrainer(" in blocks[0] and "ar.run_eval(" in blocks[0]
    assert "compare_runs" in "".join(blocks)
    for block in blocks:
        compile(block, "docs/python-api.md", "exec")
    for name in PUBLIC:  # the page names every public name
        assert f"`{name}`" in text or f"`{name}(" in text, name


@pytest.mark.slow
def test_readme_snippet_runs_as_written(tmp_path):
    snippet = readme_snippet()
    _assert_prints_a_probability(_run(snippet, tmp_path), "the README's Fine-tune from Python block")
    out = re.search(r'output_dir="([^"]+)"', snippet).group(1)  # the folder the snippet trains into
    assert (tmp_path / out / "anchored_reasoning.json").is_file()


@pytest.mark.slow
def test_docs_blocks_run_in_order(tmp_path):
    """docs/python-api.md's blocks, one process each, in one folder (a later block may read an earlier one's runs)."""
    for i, block in enumerate(python_blocks((ROOT / "docs" / "python-api.md").read_text())):
        _assert_prints_a_probability(_run(block, tmp_path), f"docs/python-api.md block {i + 1}")
