"""Recipe loading, overrides and validation; the built-in recipes are all valid; the tiny recipe trains."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.resources import builtin_dir
from anchored_reasoning.train import recipes

BUILTIN = sorted(p for p in builtin_dir("train").glob("*.yaml") if not p.name.startswith("_"))


def test_overrides_parse_yaml_values_and_numbers():
    assert recipes.parse_override("training.learning_rate=3e-4") == (["training", "learning_rate"], 3e-4)
    assert recipes.parse_override("training.curriculum=true") == (["training", "curriculum"], True)
    assert recipes.parse_override("method.options.k=2") == (["method", "options", "k"], 2)
    assert recipes.parse_override("output_dir=/tmp/x") == (["output_dir"], "/tmp/x")
    with pytest.raises(ConfigError, match="key.sub=value"):
        recipes.parse_override("training.learning_rate")


def test_apply_overrides_creates_and_replaces():
    base = {"training": {"learning_rate": 1e-4}, "method": {"name": "cot"}}
    out = recipes.apply_overrides(base, ["training.learning_rate=1e-3", "method.options.k=4"])
    assert out["training"]["learning_rate"] == 1e-3 and out["method"]["options"] == {"k": 4}
    assert base["training"]["learning_rate"] == 1e-4  # input untouched
    with pytest.raises(ConfigError, match="is a value"):
        recipes.apply_overrides(base, ["method.name.x=1"])


@pytest.mark.parametrize(
    "override, named",
    [
        ("trainng.learning_rate=1", "trainng"),
        ("training.learning_rat=1", "training.learning_rat"),
        ("model.presett=gpt2-tiny", "model.presett"),
        ("data.train.generatr=prosqa", "data.train.generatr"),
    ],
)
def test_unknown_key_is_named(override, named):
    with pytest.raises(ConfigError) as info:
        recipes.resolve("tiny_test", [override])
    assert repr(named) in str(info.value)


def test_unknown_key_in_file_fails_before_training(tmp_path, monkeypatch):
    bad = tmp_path / "bad.yaml"
    bad.write_text((builtin_dir("train") / "tiny_test.yaml").read_text() + "\nbogus_section: 1\n")
    from anchored_reasoning.train.pipelines import ar

    def boom(*a, **k):  # pragma: no cover - reaching it is the failure
        raise AssertionError("model was built before the recipe was validated")

    monkeypatch.setattr(ar, "build_model_and_tokenizer", boom)
    monkeypatch.setattr(ar, "load_split", boom)
    with pytest.raises(ConfigError, match="'bogus_section'"):
        ar.run(str(bad))


def test_extends_merges_and_detects_cycles(tmp_path):
    (tmp_path / "base.yaml").write_text("trainer: ar\ntraining: {learning_rate: 0.1, max_steps: 5}\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\ntraining: {max_steps: 7}\n")
    r = recipes.load_recipe(tmp_path / "child.yaml")
    assert r["training"] == {"learning_rate": 0.1, "max_steps": 7}
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        recipes.load_recipe(tmp_path / "a.yaml")


def test_missing_recipe_lists_known():
    with pytest.raises(ConfigError, match="tiny_test"):
        recipes.find_recipe("no_such_recipe")


def test_bad_training_value_is_a_config_error(tmp_path):
    from anchored_reasoning.train.pipelines import ar

    with pytest.raises(ConfigError, match="curriculum_schedule"):
        ar.run("tiny_test", ["training.curriculum_schedule=weekly", f"output_dir={tmp_path}"])


@pytest.mark.parametrize("path", BUILTIN, ids=[p.stem for p in BUILTIN])
def test_builtin_recipes_are_valid(path, tmp_path, monkeypatch):
    from anchored_reasoning.train import TRAINERS

    monkeypatch.chdir(tmp_path)  # a recipe's runs/... start names a run of its own, not one in the caller's folder

    recipe = recipes.load_recipe(path)
    assert recipe.get("trainer") in TRAINERS, f"{path.name}: unknown trainer {recipe.get('trainer')!r}"
    if recipe["trainer"] != "ar":
        # every other trainer validates its own schema and builds its training config
        import importlib

        trainer = importlib.import_module(TRAINERS[recipe["trainer"]].partition(":")[0])
        resolved = trainer.resolve_recipe(recipe)
        trainer.make_config(resolved, Path("/tmp/unused"))
        return
    resolved = recipes.resolve(recipe)
    from anchored_reasoning.methods import get_method
    from anchored_reasoning.train.pipelines.ar import make_config

    get_method(resolved["method"]["name"], style="trained", **(resolved["method"].get("options") or {}))
    make_config(resolved, Path("/tmp/unused"))


def test_cli_dry_run_prints_the_resolved_recipe(capsys):
    from anchored_reasoning.cli import main

    assert main(["train", "tiny_test", "training.max_steps=3", "--dry-run"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["training"]["max_steps"] == 3
    assert main(["train", "tiny_test", "training.max_stepz=3", "--dry-run"]) == 1


def test_cli_overrides_may_follow_an_option(capsys):
    """argparse ends a positional list at the first option; the overrides after it are still applied."""
    from anchored_reasoning.cli import main

    assert main(["train", "tiny_test", "--dry-run", "training.max_steps=4", "seed=3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["training"]["max_steps"] == 4 and out["seed"] == 3
    with pytest.raises(SystemExit):
        main(["train", "tiny_test", "--dry-run", "--bogus"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


@pytest.mark.slow
def test_tiny_recipe_trains_and_saves_a_loadable_checkpoint(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anchored_reasoning.train import get_trainer

    torch.set_num_threads(1)
    out = get_trainer("ar")("tiny_test", [f"output_dir={tmp_path / 'ckpt'}"])
    meta = json.loads((out / "anchored_reasoning.json").read_text())
    assert meta["method"] == "acot" and meta["style"] == "trained" and meta["task"] == "prosqa"
    assert meta["method_options"]["k"] == 2
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["global_steps"] == 4 and summary["world_size"] == 1
    assert [h["stage"] for h in summary["curriculum_history"] if h["event"] == "stage"][0] == 0
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert "[ANT]" in tok.get_vocab() and model.get_input_embeddings().weight.shape[0] >= len(tok)


@pytest.mark.slow
def test_checkpoint_evaluates_through_the_runner_with_its_training_format(tmp_path):
    """train tiny -> plain from_pretrained through the HF backend -> run_eval with the checkpoint's method."""
    import torch

    from anchored_reasoning.backends import get_backend
    from anchored_reasoning.eval.methods import build_method
    from anchored_reasoning.eval.runner import run_eval
    from anchored_reasoning.generators.prosqa import generate_dataset
    from anchored_reasoning.train import get_trainer

    torch.set_num_threads(1)
    out = get_trainer("ar")("tiny_test", [f"output_dir={tmp_path / 'ckpt'}", "training.generation_eval=false"])
    method = build_method(None, out)
    assert method.name == "acot" and method.stage == method.num_stages - 1
    examples = generate_dataset(5, seed=7, split="e2e", num_nodes=6, min_hops=1, max_hops=2)
    summary = run_eval("prosqa", get_backend("hf", str(out), device="cpu"), method, out_dir=tmp_path / "eval",
                       examples=examples, max_new_tokens=8, progress=False)
    assert summary["accuracy"]["n"] == 5
    records = [json.loads(line) for line in (tmp_path / "eval" / "records.jsonl").read_text().splitlines()]
    for rec, ex in zip(records, examples):
        # the runner prompted exactly what training rendered at the final stage: two [ANT] slots, not decoded
        assert rec["prompt"] == method.render(ex, "prosqa").prompt
        assert rec["prompt"].endswith("[BoA][ANT][ANT][EoA][BoR]")
        assert 1 <= rec["tokens"] <= 8


def test_a_trainer_refuses_a_recipe_for_another_trainer():
    from anchored_reasoning.train.pipelines import diffusion
    from anchored_reasoning.train.pipelines import tadm

    for module in (diffusion, tadm):
        with pytest.raises(ConfigError, match="'ar'"):
            module.resolve_recipe({"trainer": "ar"})


@pytest.mark.parametrize("trainer", ["ar", "diffusion", "tadm"])
def test_recipes_save_checkpoints_by_default_and_a_recipe_can_change_it(trainer, tmp_path):
    import importlib

    module = importlib.import_module(f"anchored_reasoning.train.pipelines.{trainer}")
    name = {"ar": "tiny_test", "diffusion": "diffusion_pretrain_tiny_adlm", "tadm": "tadm_pretrain_tiny"}[trainer]
    resolve = recipes.resolve if trainer == "ar" else module.resolve_recipe
    config = module.make_config(resolve(name), tmp_path)
    assert (config.save_strategy, config.save_steps, config.save_total_limit, config.save_every_minutes) == ("steps", 500, 2, 30.0)
    config = module.make_config(resolve(name, ["training.save_steps=7", "training.save_every_minutes=null"]), tmp_path)
    assert config.save_steps == 7 and config.save_every_minutes is None
