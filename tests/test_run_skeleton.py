"""The one run skeleton (train/pipelines/skeleton.py) and the recipe sections (train/recipes/sections.py): a run resolves
its recipe and builds its trainer config once and passes those objects down; every section refuses an
unknown key at construction, naming a close match; the slot count ``k`` has one rule."""
from __future__ import annotations

import json

import pytest

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.train.pipelines import skeleton as pipeline
from anchored_reasoning.train import recipes
from anchored_reasoning.train.recipes.sections import RECIPES, build, key_tree, recipe_class

BASE = ["training.max_steps=1", "training.curriculum=false", "training.generation_eval=false",
        "training.save_steps=100", "data.train.n=8", "data.valid.n=2"]


def test_a_run_applies_the_overrides_and_builds_its_config_once(tmp_path, monkeypatch):
    from anchored_reasoning.train.pipelines import ar

    calls = {"overrides": 0, "config": 0}
    apply, make_config = recipes.apply_overrides, ar.make_config

    def counted_apply(*a, **kw):
        calls["overrides"] += 1
        return apply(*a, **kw)

    def counted_config(*a, **kw):
        calls["config"] += 1
        return make_config(*a, **kw)

    monkeypatch.setattr(recipes, "apply_overrides", counted_apply)
    monkeypatch.setattr(ar, "make_config", counted_config)
    seen = {}
    complete = pipeline.complete

    def spy(pipe, run):
        seen["run"] = run
        return complete(pipe, run)

    monkeypatch.setattr(pipeline, "complete", spy)
    out = ar.run("tiny_test", [*BASE, f"output_dir={tmp_path / 'out'}"])
    assert calls == {"overrides": 1, "config": 1}
    run = seen["run"]
    assert run.trainer.args is run.config  # the one config object reaches the trainer
    assert run.config.max_steps == 1 and run.recipe["training"]["max_steps"] == 1
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["recipe"]["training"]["max_steps"] == 1 and summary["global_steps"] == 1


def test_the_train_command_leaves_the_overrides_to_the_one_resolve(monkeypatch, capsys):
    from anchored_reasoning.cli import main

    calls = []
    apply = recipes.apply_overrides
    monkeypatch.setattr(recipes, "apply_overrides", lambda *a, **kw: calls.append(a) or apply(*a, **kw))
    assert main(["train", "tiny_test", "--dry-run", "training.learning_rate=3e-4", "trainer=ar"]) == 0
    assert len(calls) == 1
    assert json.loads(capsys.readouterr().out)["training"]["learning_rate"] == 3e-4


@pytest.mark.parametrize("trainer", sorted(RECIPES))
def test_an_unknown_key_in_every_section_fails_at_construction_with_a_close_match(trainer):
    cls = recipe_class(trainer)
    tree = key_tree(trainer)
    build(cls, {"trainer": trainer, "model": {"name": "x"}, "training": {"max_steps": 1}})  # known keys pass
    with pytest.raises(ConfigError, match=r"unknown recipe key 'tsak'; did you mean 'task'\?"):
        build(cls, {"tsak": "prosqa"})
    for section, keys in tree.items():
        if keys == "training":
            with pytest.raises(ConfigError, match=rf"'{section}\.max_stesp'; did you mean 'max_steps'\?"):
                build(cls, {section: {"max_stesp": 3}})
        elif isinstance(keys, dict):
            key = sorted(keys)[0]
            typo = key[:-1] + key[-1] * 2 + "x"  # a near miss of a real key
            with pytest.raises(ConfigError, match=rf"unknown recipe key '{section}\.{typo}'; did you mean '{key}'\?"):
                build(cls, {section: {typo: 1}})
    if "train" in tree.get("data", {}):
        with pytest.raises(ConfigError, match=r"'data\.train\.mix\[0\]\.generatr'; did you mean 'generator'\?"):
            build(cls, {"data": {"train": {"mix": [{"generatr": "prosqa"}]}}})


def test_each_trainer_has_its_own_sections():
    assert "rewards" in key_tree("grpo") and "rewards" not in key_tree("ar")
    assert "base" in key_tree("tadm")["model"] and "base" not in key_tree("diffusion")["model"]
    assert "revision" in key_tree("ar")["model"]
    with pytest.raises(ConfigError, match=r"unknown recipe key 'model\.base'"):
        recipes.resolve({"trainer": "diffusion", "model": {"base": "x"}}, trainer="diffusion")


def test_k_given_twice_and_disagreeing_is_refused():
    recipe = {"trainer": "ar", "task": "prosqa", "model": {"preset": "gpt2-tiny"}, "method": {"name": "acot"}}
    with pytest.raises(ConfigError, match=r"slot count twice: method\.options\.k=2 and training\.num_anchor_slots=3"):
        recipes.resolve(recipe, ["method.options.k=2", "training.num_anchor_slots=3"])
    recipes.resolve(recipe, ["method.options.k=3", "training.num_anchor_slots=3"])  # agreeing: one value
    from anchored_reasoning.train.pipelines.method_setup import trained_method

    assert trained_method("acot", {}, 5).k == 5  # num_anchor_slots is the default ...
    assert trained_method("acot", {"k": 2}, 5).k == 2  # ... the method's options win when the recipe sets only them
