"""Every recipe value's type and range is checked before any data or model loads (issue 49 item 2):
the error names the key, the value and what the key accepts, for all four trainers, through the CLI and
through the Python API."""
from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.resources import builtin_dir
from anchored_reasoning.train.recipes import values as recipe_values
from anchored_reasoning.train import recipes

#: a recipe of each trainer that the tests can start from
RECIPES = {"ar": "tiny_test", "diffusion": "diffusion_tiny_test", "tadm": "tadm_pretrain_tiny", "grpo": "grpo_tiny_test"}

#: the issue's examples: override -> what the error must say besides the key and value
ISSUE_EXAMPLES = {
    "training.max_steps=-5": ("training.max_steps=-5", "expected an integer >= 1, or -1 (-1: train for num_train_epochs"),
    "training.max_steps=abc": ("training.max_steps='abc' (a string)", "expected an integer >= 1"),
    "training.learning_rate=1e-3e": ("training.learning_rate='1e-3e' (a string)", "expected a number > 0"),
    "training.per_device_train_batch_size=0": ("training.per_device_train_batch_size=0", "expected an integer >= 1"),
}


def _boom(*args, **kwargs):  # pragma: no cover - reaching it is the failure
    raise AssertionError("data or a model was loaded before the recipe's values were checked")


@pytest.fixture
def no_work(monkeypatch):
    """Every data loader and model / tokenizer builder of the four trainers fails the test if called."""
    import transformers

    from anchored_reasoning.models import zoo
    from anchored_reasoning.train import checkpointing
    from anchored_reasoning.train.data import data_sources
    from anchored_reasoning.train.pipelines import ar, diffusion, grpo, tadm

    for module, names in [
        (data_sources, ["load_split", "generate_examples"]),
        (ar, ["load_split", "build_model_and_tokenizer"]),
        (diffusion, ["build_tokenizer", "build_model", "pretrain_rows"]),
        (tadm, ["build_model"]),
        (grpo, ["start_meta", "load_policy"]),
        (zoo, ["resolve_model"]),
        (checkpointing, ["plan_resume", "check_run_config"]),
    ]:
        for name in names:
            monkeypatch.setattr(module, name, _boom)
    for cls in (transformers.AutoModelForCausalLM, transformers.AutoModelForMaskedLM, transformers.AutoTokenizer):
        monkeypatch.setattr(cls, "from_pretrained", _boom)


@pytest.mark.parametrize("trainer", sorted(RECIPES))
@pytest.mark.parametrize("override", sorted(ISSUE_EXAMPLES))
def test_issue_examples_fail_in_the_cli_before_any_data_or_model(override, trainer, no_work, tmp_path, capsys):
    from anchored_reasoning.cli import main

    out = tmp_path / "run"
    # a start model that does not exist: the value error must come first
    args = ["train", RECIPES[trainer], override, f"output_dir={out}", "model.name=/no/such/checkpoint"]
    if trainer != "grpo":
        args[-1] = "seed=0"
    assert main(args) == 1
    err = capsys.readouterr().err
    for part in ISSUE_EXAMPLES[override]:
        assert part in err, err
    assert not out.exists()


@pytest.mark.parametrize("trainer", sorted(RECIPES))
@pytest.mark.parametrize("override", sorted(ISSUE_EXAMPLES))
def test_issue_examples_fail_in_the_python_api(override, trainer, no_work):
    from anchored_reasoning.train import get_trainer

    recipe = recipes.load_recipe(RECIPES[trainer])  # a dict, as a Python user would build
    key, expected = ISSUE_EXAMPLES[override]
    with pytest.raises(ConfigError) as info:
        get_trainer(trainer)(recipe, [override])
    assert key in str(info.value) and expected in str(info.value)
    # the same dict with the bad value set in Python, not through an override
    section, _, name = override.partition("=")[0].partition(".")
    raw = recipes.parse_override(override)[1]
    with pytest.raises(ConfigError, match=key.split("=")[0].replace(".", r"\.")):
        get_trainer(trainer)({**recipe, section: {**recipe.get(section, {}), name: raw}})


def test_dry_run_checks_values_for_every_trainer(capsys):
    from anchored_reasoning.cli import main

    for trainer, name in RECIPES.items():
        assert main(["train", name, "training.per_device_train_batch_size=0", "--dry-run"]) == 1, trainer
        assert "training.per_device_train_batch_size=0" in capsys.readouterr().err
        assert main(["train", name, "training.per_device_train_batch_size=2", "--dry-run"]) == 0, trainer
        assert json.loads(capsys.readouterr().out)["training"]["per_device_train_batch_size"] == 2


@pytest.mark.parametrize(
    "override, accepted",
    [
        ("training.max_steps=-1", -1),  # TrainingArguments: -1 = train num_train_epochs
        ("training.max_steps=1", 1),
        ("training.learning_rate=1e-3", 1e-3),
        ("training.num_train_epochs=3", 3),  # an int for a float key
        ("training.curriculum=true", True),
        ("training.curriculum=yes", True),  # YAML's boolean
        ("training.lr_scheduler_type=cosine", "cosine"),
        ("training.max_grad_norm=0", 0),
        ("training.save_total_limit=null", None),
        ("training.warmup_steps=0.1", 0.1),
        ("training.report_to=[tensorboard]", ["tensorboard"]),
        ("seed=4294967295", 4294967295),
        ("data.train.n=1", 1),
        ("data.train.trace=forward", "forward"),
        ("model.dtype=bfloat16", "bfloat16"),
        ("method.options.k=3", 3),
    ],
)
def test_good_values_pass(override, accepted):
    keys, _ = recipes.parse_override(override)
    node = recipes.resolve("tiny_test", [override])
    for key in keys:
        node = node[key]
    assert node == accepted and type(node) is type(accepted)


@pytest.mark.parametrize(
    "override, says",
    [
        ("training.max_steps=0", "training.max_steps=0: expected an integer >= 1, or -1"),
        ("training.max_steps=2.5", "training.max_steps=2.5 (a float): expected an integer"),
        ("training.max_steps=null", "training.max_steps=null: expected an integer"),
        ("training.max_steps=true", "training.max_steps=true (a boolean): expected an integer"),
        ("training.num_train_epochs=0", "expected a number > 0"),
        ("training.curriculum=1", "training.curriculum=1: expected true or false"),
        ("training.curriculum=maybe", "training.curriculum='maybe' (a string): expected true or false"),
        ("training.learning_rate=-1e-4", "training.learning_rate=-0.0001: expected a number > 0"),
        ("training.learning_rate=[1]", "training.learning_rate=[1] (a list): expected a number > 0"),
        ("training.weight_decay=-0.1", "expected a number >= 0"),
        ("training.adam_beta2=1", "expected a number in [0, 1)"),
        ("training.gradient_accumulation_steps=0", "expected an integer >= 1"),
        ("training.lr_scheduler_type=cosin", "one of 'linear', 'cosine'"),
        ("training.lr_scheduler_type=cosin", "did you mean 'cosine'?"),
        ("training.optim=adam", "expected one of 'adamw_torch'"),
        ("training.eval_strategy=sometimes", "expected one of 'no', 'steps', 'epoch'"),
        ("training.curriculum_schedule=weekly", "expected one of 'epochs', 'fraction'"),
        ("training.stage_fraction=1.5", "expected a number in (0, 1]"),
        ("training.generation_eval_samples=0", "expected an integer >= 1"),
        ("training.logging_steps=0", "expected a number > 0"),
        ("seed=-1", "seed=-1: expected an integer in [0, 4294967295]"),
        ("seed=abc", "seed='abc' (a string): expected an integer"),
        ("task=prosqq", "did you mean 'prosqa'?"),
        ("output_dir=[a]", "output_dir=['a'] (a list): expected a string"),
        ("model.dtype=fp8", "model.dtype='fp8': expected one of 'float32', 'bfloat16'"),
        ("model.preset=gpt2-huge", "expected one of 'gpt2-tiny'"),
        ("model.tokenizer_vocab_size=0", "expected an integer >= 1"),
        ("method.name=acott", "did you mean 'acot'?"),
        ("method.options.k=abc", "method acot: option k must be an integer >= 0, got 'abc'"),
        ("data.train.n=0", "data.train.n=0: expected an integer >= 1"),
        ("data.train.n=ten", "data.train.n='ten' (a string)"),
        ("data.train.generator=prosq", "data.train.generator='prosq': expected one of"),
        ("data.train.trace=sideways", "expected one of 'forward', 'backward'"),
        ("data.valid.limit=0", "data.valid.limit=0: expected an integer >= 1, or null"),
        ("data.train.name='two words'", "expected a word without spaces"),
        ("data.train.params=3", "data.train.params=3: expected a mapping"),
        ("data.train.mix=[{generator: prosqa, n: 0}]", "data.train.mix[0].n=0: expected an integer >= 1"),
    ],
)
def test_bad_values_name_key_value_and_expectation(override, says, no_work):
    with pytest.raises(ConfigError) as info:
        recipes.resolve("tiny_test", [override])
    assert says in str(info.value)


@pytest.mark.parametrize(
    "trainer, override, says",
    [
        ("diffusion", "training.bf16=auto", None),
        ("diffusion", "training.bf16=sometimes", "training.bf16='sometimes' (a string): expected true or false, or 'auto'"),
        ("diffusion", "training.diffusion_mode=finetune", "expected one of 'sft', 'pretrain'"),
        ("diffusion", "training.time_eps=1", "expected a number in (0, 1)"),
        ("diffusion", "model.arch=gpt2", "expected one of 'mdlm', 'adlm'"),
        ("diffusion", "model.preset=gpt2-tiny", "expected one of 'tiny', 'small', 'paper'"),
        ("diffusion", "data.max_length=0", "data.max_length=0: expected an integer >= 1"),
        ("diffusion", "data.overlong=truncate", "expected one of 'error', 'drop'"),
        ("tadm", "training.stale_k_choices=[1, 0]", "training.stale_k_choices=[1, 0]: expected a list, each item an integer >= 1"),
        ("tadm", "training.tadm_objective=both", "expected one of 't_anelbo', 'posttrain'"),
        ("tadm", "data.ppl_refresh_every=[0]", "expected a list, each item an integer >= 1"),
        ("grpo", "training.num_generations=1", "training.num_generations=1: expected an integer >= 2"),
        ("grpo", "training.temperature=0", "expected a number > 0"),
        ("grpo", "training.top_p=0", "expected a number in (0, 1]"),
        ("grpo", "training.vllm_mode=remote", "expected one of 'server', 'colocate'"),
        ("grpo", "rewards.correctness=high", "rewards.correctness='high' (a string): expected a number"),
        ("grpo", "rewards.tests_timeout_s=0", "expected a number > 0"),
        ("grpo", "sampler.steps=abc", "sampler.steps='abc' (a string): expected an integer"),
        ("grpo", "sampler.steps=0", "sampler"),  # SamplerConfig's own range check, named
        ("grpo", "sampler.kv_cache=both", "kv_cache"),
    ],
)
def test_other_trainers_check_their_own_keys(trainer, override, says, no_work):
    module = importlib.import_module(f"anchored_reasoning.train.pipelines.{trainer}")
    if says is None:
        module.resolve_recipe(RECIPES[trainer], [override])
        return
    with pytest.raises(ConfigError) as info:
        module.resolve_recipe(RECIPES[trainer], [override])
    assert says in str(info.value)


def test_numbers_in_a_recipe_file_are_read_as_yaml_and_overrides_read_them(tmp_path):
    """YAML 1.1 reads ``1e-4`` as a string; a number key takes it as the number. ``abc`` is refused."""
    src = (builtin_dir("train") / "tiny_test.yaml").read_text()
    good = tmp_path / "good.yaml"
    good.write_text(src.replace("learning_rate: 1.0e-3", "learning_rate: 1e-4"))
    assert recipes.load_recipe(good)["training"]["learning_rate"] == "1e-4"  # what YAML gives
    assert recipes.resolve(good)["training"]["learning_rate"] == 1e-4
    bad = tmp_path / "bad.yaml"
    bad.write_text(src.replace("max_steps: 4", "max_steps: abc"))
    with pytest.raises(ConfigError, match=r"training\.max_steps='abc' \(a string\): expected an integer >= 1"):
        recipes.resolve(bad)


def _leaves(schema, prefix=""):
    for key, sub in schema.items():
        if isinstance(sub, dict):
            yield from _leaves(sub, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", sub


def _schemas():
    from anchored_reasoning.train.recipes.sections import key_tree

    return {trainer: key_tree(trainer) for trainer in RECIPES}


@pytest.mark.parametrize("trainer", sorted(RECIPES))
def test_every_key_of_every_schema_has_a_value_spec(trainer):
    """A key added to a trainer's schema without a spec here would go unchecked: this names it."""
    specs = recipe_values.section_specs(trainer)
    training = recipe_values.training_specs(trainer)
    missing = []
    for path, sub in _leaves(_schemas()[trainer]):
        section, _, key = path.partition(".")
        if section == "training" or section == "sampler":
            continue
        node = specs
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if sub == "data_sources":
            node = node.section if isinstance(node, recipe_values.Many) else None
        if node is None:
            missing.append(path)
    assert not missing, f"{trainer}: no value spec for {missing}"
    loose = sorted(k for k, v in training.items() if {"object", "any"} & set(v.kinds) or not v.kinds)
    assert set(loose) <= {"parallelism_config", "report_to"}, loose


def test_training_ranges_match_the_code_they_describe():
    """The range table names real fields, and its choices are the ones the configs check."""
    from anchored_reasoning.train.pipelines import diffusion
    from anchored_reasoning.train.pipelines import tadm
    from anchored_reasoning.train.data.diffusion_data import OVERLONG_POLICIES
    from anchored_reasoning.train.trainers.diffusion_trainer import DIFFUSION_MODES

    fields = set().union(*(recipe_values.training_specs(t) for t in RECIPES))
    assert set(recipe_values.TRAINING_RANGES) <= fields
    ranges = recipe_values.TRAINING_RANGES
    assert set(ranges["diffusion_mode"]["choices"]) == set(DIFFUSION_MODES)
    assert set(ranges["tadm_objective"]["choices"]) == set(tadm.OBJECTIVES)
    specs = recipe_values.section_specs("diffusion")
    assert specs["data"]["overlong"].options() == OVERLONG_POLICIES
    assert specs["model"]["arch"].options() == diffusion.ARCHS


def test_field_types_come_from_the_library():
    """TrainingArguments' own annotations drive the check: an Enum field takes its Enum's values."""
    from transformers.trainer_utils import SchedulerType

    spec = recipe_values.training_specs("ar")["lr_scheduler_type"]
    assert set(spec.options()) == {s.value for s in SchedulerType}
    assert recipe_values.from_annotation(int | None) == recipe_values.Value(("int",), nullable=True)


@pytest.mark.parametrize("path", sorted(p for p in builtin_dir("train").glob("*.yaml") if not p.name.startswith("_")),
                         ids=lambda p: Path(p).stem)
def test_every_shipped_recipe_passes_the_value_checks(path):
    recipe = recipes.load_recipe(path)
    checked = recipe_values.check_values(recipe, recipe["trainer"])
    assert checked == recipe  # the shipped recipes spell every number as YAML reads it
