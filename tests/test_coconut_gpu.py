"""benchmarks/coconut_gpu.py: the one-GPU ProsQA protocol's schedules, its GGUF parts, and its dry run on the CPU."""
from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import pytest

from benchmarks import coconut_gpu


def args_for(**over):
    base = {"schedule": "short", "dry_run": False, "train_n": None, "tokens_per_anchor": 4, "seed": 0,
            "train_seconds": 360.0}
    return SimpleNamespace(**{**base, **over})


@pytest.mark.parametrize("label", list(coconut_gpu.METHODS))
def test_both_schedules_fit_every_method_before_training(label, tmp_path):
    """Coconut's full schedule (50 epochs, 5 per stage, batch 128) and the short one (a time budget whose stages
    are 1/14 of it each) are accepted by the curriculum check for every method, as the run will check them."""
    from anchored_reasoning.train.callbacks.curriculum import curriculum_plan_for
    from anchored_reasoning.train.pipelines.ar import make_config
    from anchored_reasoning.train.pipelines.method_setup import trained_method

    for schedule, n in (("full", 17886), ("short", 6000)):
        recipe = coconut_gpu.recipe_for(label, args_for(schedule=schedule), "m", tmp_path / label, {"split": "test"})
        config = make_config(recipe, tmp_path / label)
        method = trained_method(recipe["method"]["name"], recipe["method"]["options"], config.num_anchor_slots)
        if config.curriculum:
            plan = curriculum_plan_for(config, method, n)
            assert len(plan.stages) == 8  # stages 0..6 and the last, as in Coconut's ProsQA run
            if schedule == "full":
                assert plan.ends[:2] == (0.1, 0.2) and config.gradient_accumulation_steps == 4
            else:
                assert config.max_train_seconds == 360.0 and abs(plan.ends[0] - 1 / 14) < 1e-9


def test_gguf_parts_are_joined_only_when_whole_and_unchanged(tmp_path):
    from anchored_reasoning.errors import ConfigError

    data = bytes(range(256)) * 10
    parts = [data[:1000], data[1000:]]
    (tmp_path / "part0").write_bytes(parts[0])
    manifest = {"file": "x.gguf", "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                "parts": [{"name": f"part{i}", "bytes": len(p)} for i, p in enumerate(parts)]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match=r"parts \['part1'\] are not here"):
        coconut_gpu.model_from_parts(tmp_path, tmp_path / "work")
    (tmp_path / "part1").write_bytes(parts[1][:-1] + b"!")
    with pytest.raises(ConfigError, match="do not match the manifest's SHA-256"):
        coconut_gpu.model_from_parts(tmp_path, tmp_path / "work")


def test_dry_run_trains_the_latent_methods_in_parallel_processes_and_writes_json_and_table(tmp_path, monkeypatch):
    monkeypatch.setenv("ANCHORED_REASONING_DATA", str(tmp_path / "no-data"))  # generated test problems
    out = tmp_path / "coconut_gpu.json"
    code = coconut_gpu.main(["--dry-run", "--methods", "coconut", "pause_as_thought", "--work", str(tmp_path / "w"),
                             "--out", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["dry_run"] and result["chance"] == 0.5 and result["test"].startswith("500 generated")
    for label in ("coconut", "pause_as_thought"):
        r = result["methods"][label]
        assert r["steps"] == 16 and r["final_stage"] == r["stages_planned"] - 1 == 3 and r["n"] == 16
    assert "coconut - pause_as_thought" in result["paired"]
    assert out.with_suffix(".md").read_text().startswith("| method | accuracy")
