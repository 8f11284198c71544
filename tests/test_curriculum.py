"""Curriculum stage plans: the paper's schedule scaled to the run, and the floor per stage."""
from __future__ import annotations

from pathlib import Path

import pytest

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.methods import get_method
from anchored_reasoning.train import recipes
from anchored_reasoning.train.callbacks.curriculum import curriculum_plan_for, plan_curriculum


def prosqa_acot_stages() -> int:
    return get_method("acot", style="trained", k=6, remove_steps_per_stage=1).num_stages


def test_a_paper_length_run_switches_at_the_papers_epochs():
    # ProsQA ACoT: 8 stages, 5 epochs each but the last, 50 epochs; 140 steps an epoch
    plan = plan_curriculum(num_stages=prosqa_acot_stages(), epochs_per_stage=5, schedule_epochs=50,
                           total_steps=50 * 140, min_steps_per_stage=50)
    assert plan.stages == tuple(range(8))
    assert plan.steps == [700] * 7 + [2100]
    assert [plan.stage_at(step / 7000) for step in (0, 699, 700, 4899, 4900, 6999)] == [0, 0, 1, 6, 7, 7]


@pytest.mark.parametrize("total", [1000, 2400, 7000])
def test_a_shorter_run_gives_each_stage_the_papers_share(total):
    plan = plan_curriculum(num_stages=prosqa_acot_stages(), epochs_per_stage=5, schedule_epochs=50, total_steps=total)
    steps = plan.steps
    assert sum(steps) == total
    assert all(n == pytest.approx(total / 10, abs=1) for n in steps[:-1])  # 5 of 50 epochs each
    assert steps[-1] == pytest.approx(total * 15 / 50, abs=7)


def test_gsm8k_schedule_one_then_two_anchors_then_on_to_epoch_25():
    acot = get_method("acot", style="trained", k=2)
    plan = plan_curriculum(num_stages=acot.num_stages, epochs_per_stage=3, schedule_epochs=25, first_stage=1,
                           total_steps=25 * 55)
    assert plan.stages == (1, 2)
    assert plan.steps == [165, 1210]  # epochs 1-3 one [ANT], then two to the end


def test_a_budget_below_the_floor_is_refused_with_the_numbers():
    with pytest.raises(ConfigError) as info:
        plan_curriculum(num_stages=prosqa_acot_stages(), schedule="fraction", total_steps=200, min_steps_per_stage=50)
    text = str(info.value)
    assert "200 optimizer steps for 8 stages" in text and "floor of 50 steps" in text
    assert "curriculum_min_steps_per_stage" in text
    needed = int(text.split("needs about ")[1].split()[0])
    assert min(plan_curriculum(num_stages=8, schedule="fraction", total_steps=needed).steps) >= 50
    assert min(plan_curriculum(num_stages=8, schedule="fraction", total_steps=needed - 10).steps) < 50


def test_stages_that_do_not_fit_the_schedule_are_refused():
    with pytest.raises(ConfigError, match="7 stages of 5 epochs"):
        plan_curriculum(num_stages=8, epochs_per_stage=5, schedule_epochs=30)
    with pytest.raises(ConfigError, match="curriculum_first_stage=3"):
        plan_curriculum(num_stages=3, schedule_epochs=30, first_stage=3)


def test_a_recipe_whose_curriculum_cannot_fit_is_refused_before_any_model_is_built(tmp_path, monkeypatch):
    from anchored_reasoning.train.pipelines import ar

    def boom(*a, **k):  # pragma: no cover - reaching it is the failure
        raise AssertionError("the model was built before the curriculum was checked")

    monkeypatch.setattr(ar, "build_model_and_tokenizer", boom)
    with pytest.raises(ConfigError, match=r"4 optimizer steps for 4 stages.*floor of 2 steps"):
        ar.run("tiny_test", [f"output_dir={tmp_path}", "training.curriculum_min_steps_per_stage=2"])


PAPER = {"prosqa": 17886, "prontoqa": 9000, "gsm8k": 7473 - 500}


@pytest.mark.parametrize("name", sorted(p.stem for p in Path(recipes.find_recipe("tiny_test")).parent.glob("*_gpt2_*.yaml")))
def test_paper_recipes_walk_the_papers_schedule(name, monkeypatch):
    """Each paper recipe, on its data size: Coconut's effective batch 128, and stages that switch
    every 5 epochs (logic) or 3 epochs (GSM8K) of a 50 / 25-epoch run."""
    from anchored_reasoning.train.pipelines.ar import make_config

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # offline, a Hub id not in the cache is refused at once;
        monkeypatch.delenv(var, raising=False)             # these recipes name GPT-2 on the Hub, as a GPU user has it

    recipe = recipes.resolve(name)
    assert recipe["model"]["name"] == "openai-community/gpt2" and len(recipe["model"]["revision"]) == 40
    config = make_config(recipe, Path("/tmp/unused"))
    assert config.per_device_train_batch_size * config.gradient_accumulation_steps * config.world_size == 128
    assert config.learning_rate == 1e-4
    assert config.num_train_epochs == (25 if recipe["task"] == "gsm8k" else 50)
    method = get_method(recipe["method"]["name"], style="trained", **(recipe["method"].get("options") or {}))
    if not config.curriculum:
        return
    n = PAPER[recipe["task"]]
    plan = curriculum_plan_for(config, method, n)
    per_epoch = plan.total_steps // int(config.num_train_epochs)
    stage_epochs = config.epochs_per_stage
    assert all(abs(s - stage_epochs * per_epoch) <= stage_epochs for s in plan.steps[:-1])
    if recipe["task"] == "gsm8k" and method.name in ("acot", "pause"):
        assert plan.stages == (1, 2)  # one anchor for epochs 1-3, two from epoch 4 on
