"""Recipe data sections: a ``mix`` of sources concatenated in order, ``exclude_split``, and the errors."""
from __future__ import annotations

import json

import pytest

from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.generators.prontoqa import generate_dataset, generate_rows
from anchored_reasoning.train import recipes
from anchored_reasoning.train.data.data_sources import load_split
from benchmarks import prontoqa_mirror as mirror


def _source(n, hops, seed=100, **extra):
    return {"generator": "prontoqa", "n": n, "seed": seed, "params": {"hops": hops, "mirror_distractor": True}, **extra}


def test_a_mix_is_its_sources_in_order_with_unique_ids():
    got = load_split({"mix": [_source(3, 2), _source(2, 3)]}, "prontoqa", 0)
    want = generate_dataset(3, seed=100, hops=2, mirror_distractor=True) + generate_dataset(2, seed=100, hops=3, mirror_distractor=True)
    assert [e.question for e in got] == [e.question for e in want]
    assert [e.answer for e in got] == [e.answer for e in want]
    assert len({e.id for e in got}) == 5  # generated ids tagged per source: gen-train0-*, gen-train1-*
    assert {e.id.rsplit("-", 1)[0] for e in got} == {"gen-train0", "gen-train1"}


def test_exclude_split_drops_the_questions_of_that_split(tmp_path):
    rows = generate_rows(6, seed=101, hops=2)
    (tmp_path / "prontoqa").mkdir()
    (tmp_path / "prontoqa" / "test.json").write_text(json.dumps([rows[1], rows[4]]))
    spec = {"generator": "prontoqa", "n": 6, "seed": 101, "params": {"hops": 2}, "exclude_split": "test",
            "data_dir": str(tmp_path)}
    kept = load_split(spec, "prontoqa", 0)
    assert [e.question for e in kept] == [e.question for i, e in enumerate(load_split(dict(spec, exclude_split=None),
                                                                                        "prontoqa", 0)) if i not in (1, 4)]
    mixed = load_split({"mix": [_source(2, 2), spec]}, "prontoqa", 0)  # per source, inside a mix
    assert len(mixed) == 2 + 4
    with pytest.raises(ConfigError, match="exclude_split needs a top-level 'task'"):
        load_split(spec, None, 0)


@pytest.mark.parametrize("section, error, match", [
    ({"mix": []}, ConfigError, "non-empty list"),
    ({"mix": [_source(2, 2)], "n": 5}, ConfigError, "n belong inside its sources"),
    ({"mix": [_source(2, 2), "prontoqa"]}, ConfigError, r"mix\[1\] must be a mapping"),
    ({"mix": [{"mix": [_source(2, 2)]}]}, ConfigError, "cannot contain another mix"),
    ({"mix": [{"split": "test", "limit": 2}, {"split": "test", "limit": 2}]}, DataError, "comes from two sources"),
    ({"mix": [_source(2, 2), {"split": "test", "limit": 2, "exclude_split": "test"}]}, DataError, r"mix\[1\] produced no"),
])
def test_a_bad_mix_is_refused_with_its_place(section, error, match):
    with pytest.raises(error, match=match):
        load_split(section, "prontoqa", 0)


def test_recipe_validation_reaches_inside_a_mix():
    recipe = recipes.load_recipe("prontoqa_real_cpu")
    recipes.validate(recipe)
    recipe["data"]["train"]["mix"][1]["sede"] = 3
    with pytest.raises(ConfigError, match=r"data\.train\.mix\[1\]\.sede"):
        recipes.validate(recipe)
    recipe["data"]["train"]["mix"] = {"generator": "prontoqa"}
    with pytest.raises(ConfigError, match="non-empty list of data sources"):
        recipes.validate(recipe)


def test_the_real_test_recipe_trains_on_the_benchmarks_data():
    """train/prontoqa_real_cpu.yaml is the run behind the README's real-test 0.915: same sources, same order."""
    mix = recipes.load_recipe("prontoqa_real_cpu")["data"]["train"]["mix"]
    assert mix == mirror.train_sources(5, [2, 3, 4, 5], 9000, 1800)
    assert recipes.load_recipe("prontoqa_real_cpu")["training"]["max_steps"] >= 2000


def test_a_named_source_gets_its_own_id_prefix():
    got = load_split({"mix": [_source(2, 2, name="mtrain2"), _source(2, 3)]}, "prontoqa", 0)
    assert [e.id for e in got] == ["mtrain2-0", "mtrain2-1", "gen-train1-0", "gen-train1-1"]
    assert [e.question for e in got[:2]] == [e.question for e in load_split(_source(2, 2), "prontoqa", 0)]


@pytest.mark.parametrize("section, match", [
    (_source(2, 2, name=""), "a word without spaces"),
    (_source(2, 2, name="m train"), "a word without spaces"),
    (_source(2, 2, name=3), "a word without spaces"),
    ({"split": "test", "limit": 2, "name": "t"}, "on a source with no generator"),
])
def test_a_bad_source_name_is_refused(section, match):
    with pytest.raises(ConfigError, match=match):
        load_split(section, "prontoqa", 0)


def test_the_benchmarks_training_ids_are_those_of_its_runs_before_mixes():
    """Work dirs of prontoqa_mirror.py made before its data became a mix resume and extend: the data
    fingerprint hashes the ids, which were ``mtrain-*`` (the evaluated depth), ``mtrain<h>-*`` and ``strain-*``."""
    train = load_split({"mix": mirror.train_sources(3, [2, 3], 7, 2)}, "prontoqa", 0)
    before = (generate_dataset(3, seed=100, split="mtrain2", hops=2, mirror_distractor=True)
              + generate_dataset(2, seed=100, split="mtrain", hops=3, mirror_distractor=True)
              + generate_dataset(2, seed=101, split="strain", hops=3))
    assert [(e.id, e.question, e.answer) for e in train] == [(e.id, e.question, e.answer) for e in before]


def test_a_trace_on_the_mix_applies_to_every_source():
    from anchored_reasoning.generators.traces import apply_trace

    got = load_split({"mix": [_source(2, 2), _source(2, 3)], "trace": "backward"}, "prontoqa", 0)
    plain = load_split({"mix": [_source(2, 2), _source(2, 3)]}, "prontoqa", 0)
    assert [e.steps for e in got] == [e.steps for e in apply_trace(plain, "prontoqa", "backward")]
    assert all(e.meta["trace"] == "backward" for e in got)
    with pytest.raises(ConfigError, match="in one place"):
        load_split({"mix": [_source(2, 2, trace="backward")], "trace": "backward"}, "prontoqa", 0)
    with pytest.raises(ConfigError, match="trace must be one of"):
        load_split({"mix": [_source(2, 2)], "trace": "sideways"}, "prontoqa", 0)
