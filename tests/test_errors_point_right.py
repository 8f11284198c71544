"""Errors that point the right way (issue 49 items 3 and 9): a missing local path or a mistyped alias is
named as such (not "couldn't connect to huggingface.co"), a diffusion checkpoint picks its backend, a GRPO
run without its start checkpoint says so, eval's own flags fail before any model loads, and
``anchored-reasoning models`` (which docs/lm-eval.md points to) lists the aliases."""
from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path

import pytest

from anchored_reasoning import backends
from anchored_reasoning.cli import main
from anchored_reasoning.errors import ConfigError
from anchored_reasoning.models import zoo

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Work in an empty folder holding ``runs/`` with one run, as a user's project does; the Hub allowed."""
    (tmp_path / "runs" / "prosqa_acot").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    return tmp_path


@pytest.fixture
def no_loading(monkeypatch):
    """Any backend construction (model loading) fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"a backend was built (the model loaded) for {args}: the check came too late")
    monkeypatch.setattr(backends, "get_backend", refuse)


# -- the model reference -------------------------------------------------------------------------

@pytest.mark.parametrize("name, says", [
    ("runs/does_not_exist", r"model path 'runs/does_not_exist' does not exist \(runs/ has no 'does_not_exist'\)"),
    ("runs/prosqa_act", "close matches in runs/: prosqa_acot"),
    ("./nowhere", "model path './nowhere' does not exist"),
    ("runs/prosqa_acot/checkpoint-9", "runs/prosqa_acot/ has no 'checkpoint-9'"),
])
def test_a_missing_local_path_is_named(in_tmp, name, says):
    with pytest.raises(ConfigError, match=says):
        zoo.resolve_model(name)


@pytest.mark.parametrize("name, alias", [
    ("smollm2-135M", "smollm2-135m"), ("SmolLM2-135M", "smollm2-135m"), ("logic-gpt3", "logic-gpt2"),
    ("logic-gtp2-shift", "logic-gpt2-shift"), ("logic-mdlm-shfit", "logic-mdlm-shift"),
])
def test_a_mistyped_alias_names_the_close_match(in_tmp, name, alias):
    with pytest.raises(ConfigError, match=f"unknown model alias '{name}'; did you mean '{alias}'"):
        zoo.resolve_model(name)


def test_hub_ids_still_go_to_the_hub(in_tmp):
    for name in ("HuggingFaceTB/SmolLM2-135M-Instruct", "gpt2", "distilgpt2", "openai-community/gpt2"):
        assert zoo.resolve_model(name) == name  # from_pretrained fetches it, as before


def test_an_uncached_hub_id_offline_says_offline(in_tmp, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(in_tmp / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE.*huggingface-cli download org/model"):
        zoo.check_model_reference("org/model")
    (in_tmp / "hub" / "models--org--model").mkdir(parents=True)  # cached: offline loading works
    zoo.check_model_reference("org/model")


@pytest.mark.parametrize("model, says", [
    ("runs/does_not_exist", "model path 'runs/does_not_exist' does not exist"),
    ("smollm2-135M", "did you mean 'smollm2-135m'"),
])
def test_cli_eval_names_the_bad_model_before_loading(in_tmp, no_loading, capsys, model, says):
    rc = main(["eval", "--task", "prosqa", "--model", model, "--method", "cot", "--out", "out"])
    err = capsys.readouterr().err
    assert rc == 1 and says in err and "huggingface.co" not in err


# -- eval's own flags come first ------------------------------------------------------------------

@pytest.mark.parametrize("flags, says", [
    (["--method", "cto"], "unknown --method 'cto'; did you mean cot?"),
    (["--method", "cot", "--split", "tset"], "task 'prosqa' has no split 'tset'; --split takes one of: train, valid, test"),
    (["--method", "cot", "--limit", "0"], "--limit 0: must be >= 1"),
])
def test_method_split_limit_are_checked_before_the_model_loads(in_tmp, no_loading, monkeypatch, capsys, flags, says):
    def no_materialize():
        raise AssertionError("the alias was materialised: the check came too late")
    monkeypatch.setitem(zoo.ALIASES, "smollm2-135m", zoo.ModelAlias("smollm2-135m", "x", no_materialize))
    rc = main(["eval", "--task", "prosqa", "--model", "smollm2-135m", *flags, "--out", "out"])
    assert rc == 1 and says in capsys.readouterr().err


def test_good_flags_pass_the_early_checks(in_tmp, no_loading):
    for method in ("cot", "trained:cot"):  # the early check lets the trained-style names through
        with pytest.raises(AssertionError, match="backend was built"):
            main(["eval", "--task", "prosqa", "--model", "openai-community/gpt2", "--method", method, "--split", "valid",
                  "--limit", "3", "--out", "out"])


# -- a diffusion checkpoint -----------------------------------------------------------------------

@pytest.fixture
def diffusion_ckpt(tmp_path):
    """The shipped logic-mdlm as a checkpoint our diffusion trainer wrote (its anchored_reasoning.json)."""
    ckpt = tmp_path / "diffusion_sft"
    shutil.copytree(zoo.LOGIC_DIFFUSION_DIRS["logic-mdlm"], ckpt)
    (ckpt / "anchored_reasoning.json").write_text(json.dumps(
        {"backend": "diffusion", "mode": "sft", "arch": "mdlm", "task": "prosqa", "method": "cot",
         "method_options": {}, "style": "trained"}))
    return ckpt


def test_a_diffusion_checkpoint_is_evaluated_with_the_diffusion_backend(diffusion_ckpt, tmp_path, monkeypatch, caplog):
    from anchored_reasoning.eval import runner

    seen = {}

    def fake_run_eval(task, backend, method, **kwargs):
        seen.update(backend=backend, method=method)
        return {"task": "prosqa", "method": "cot", "accuracy": 0.0}
    monkeypatch.setattr(runner, "run_eval", fake_run_eval)
    monkeypatch.setattr("anchored_reasoning.eval.report.markdown_table", lambda rows: "")
    caplog.set_level("INFO", logger="anchored_reasoning.commands.eval")
    assert main(["eval", "--task", "prosqa", "--model", str(diffusion_ckpt), "--out", str(tmp_path / "o"),
                 "--backend-arg", "device=cpu"]) == 0
    assert seen["backend"].name == "diffusion"  # loaded for real: the hf backend would crash on an MDLM
    assert seen["method"].name == "cot" and seen["method"].style == "trained"
    assert "is a diffusion checkpoint" in caplog.text and "--backend diffusion" in caplog.text


def test_a_diffusion_checkpoint_with_backend_hf_is_refused_in_one_line(diffusion_ckpt, tmp_path, no_loading, capsys):
    assert main(["eval", "--task", "prosqa", "--model", str(diffusion_ckpt), "--backend", "hf",
                 "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is a diffusion checkpoint" in err and "use --backend diffusion" in err
    assert '"backend": "diffusion"' in err


def test_a_diffusion_gemma_checkpoint_picks_its_backend_or_refuses_another(tmp_path, no_loading, capsys):
    folder = tmp_path / "dg"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "diffusion_gemma"}))
    assert zoo.checkpoint_kind(folder) == ("diffusion_gemma", "config.json model_type 'diffusion_gemma'")
    for backend in ("hf", "diffusion"):
        assert main(["eval", "--task", "prosqa", "--model", str(folder), "--method", "cot", "--backend", backend,
                     "--out", str(tmp_path / "o")]) == 1
        assert "use --backend diffusion_gemma" in capsys.readouterr().err
    from anchored_reasoning.commands.eval import _choose_backend

    args = type("Args", (), {"backend": None})()
    _choose_backend(args, str(folder))
    assert args.backend == "diffusion_gemma"


def test_checkpoint_kind_from_config_without_metadata(tmp_path):
    shutil.copytree(zoo.LOGIC_DIFFUSION_DIRS["logic-adlm"], tmp_path / "adlm")
    assert zoo.checkpoint_kind(tmp_path / "adlm")[0] == "diffusion"
    assert zoo.checkpoint_kind(zoo.LOGIC_BACKBONE_DIR) == ("AR", "config.json model_type 'gpt2'")
    assert zoo.checkpoint_kind(tmp_path / "missing") == (None, "")


# -- training -------------------------------------------------------------------------------------

def test_train_with_a_mistyped_alias_fails_before_data_loads(in_tmp, monkeypatch, capsys):
    from anchored_reasoning.train.data import data_sources

    def refuse(*args, **kwargs):
        raise AssertionError("data loaded before the model name was checked")
    monkeypatch.setattr(data_sources, "load_split", refuse)
    rc = main(["train", "tiny_test", "model.name=logic-gpt3", "model.preset=null", "model.tokenizer=null"])
    assert rc == 1 and "unknown model alias 'logic-gpt3'; did you mean 'logic-gpt2'" in capsys.readouterr().err
    from anchored_reasoning.train.pipelines import grpo

    with pytest.raises(ConfigError, match="runs/ has no 'prosqa_logic_cpu'"):  # its SFT start not trained yet
        grpo.resolve_recipe(ROOT / "train" / "grpo_prosqa_logic_cpu.yaml")


@pytest.mark.parametrize("override, says", [
    ("model.name=elsewhere/prosqa_sft", "the start checkpoint 'elsewhere/prosqa_sft' does not exist here"),
    ("model.name=null", "model.name is not set; give the start checkpoint"),
])
def test_grpo_without_its_start_checkpoint_says_so(in_tmp, override, says):
    from anchored_reasoning.train.pipelines import grpo

    with pytest.raises(ConfigError, match=f"recipe needs 'task': {says}"):
        grpo.prepare("grpo_tiny_test", [override, f"output_dir={in_tmp / 'out'}"])


# -- anchored-reasoning models --------------------------------------------------------------------

def test_models_command_lists_every_alias(capsys):
    assert main(["models"]) == 0
    table = capsys.readouterr().out
    for alias in zoo.ALIASES.values():
        row = next(line for line in table.splitlines() if line.startswith(alias.name + " "))
        assert alias.kind in row and alias.size in row
    assert "smollm2-135m (default)" in table
    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == set(zoo.ALIASES)
    assert {n for n, r in rows.items() if r["kind"] == "diffusion"} == {
        "logic-mdlm", "logic-adlm", "logic-mdlm-shift", "logic-adlm-shift"}


def test_shipped_alias_sizes_match_their_weights():
    folders = {"logic-gpt2": zoo.LOGIC_BACKBONE_DIR, "logic-gpt2-shift": zoo.LOGIC_SHIFT_DIR,
               "logic-gpt2-search": zoo.LOGIC_SEARCH_DIR, **zoo.LOGIC_DIFFUSION_DIRS}
    for name, folder in folders.items():
        raw = (folder / "model.safetensors").read_bytes()
        header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
        params = sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
        assert zoo.ALIASES[name].size == f"{params / 1e6:.2f}M", name


def test_lm_eval_doc_points_to_a_command_and_aliases_that_exist():
    from anchored_reasoning.cli import SUBCOMMANDS

    doc = (ROOT / "docs" / "lm-eval.md").read_text()
    assert "`anchored-reasoning models`" in doc and "models" in SUBCOMMANDS
    row = next(line for line in doc.splitlines() if line.startswith("| `pretrained` |"))
    named = {a for a in zoo.ALIASES if f"`{a}`" in row}
    assert named == {a for a, m in zoo.ALIASES.items() if m.kind == "diffusion"}  # the class loads diffusion models only
