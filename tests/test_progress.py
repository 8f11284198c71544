"""The terminal: one bar per long phase, no raw log dicts, --quiet, and the full log in the run folder."""
from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
import torch

from anchored_reasoning.train import get_trainer
from anchored_reasoning.train.callbacks.progress import TRAIN_LOG, TRAIN_LOG_JSONL, TrainProgress, console_logging

TINY = ["training.max_steps=6", "training.logging_steps=1", "training.curriculum_min_steps_per_stage=1",
        "training.generation_eval_samples=2"]


def _bar_lines(err: str, prefix: str) -> list[str]:
    return [line for line in err.replace("\r", "\n").splitlines() if line.startswith(prefix)]


def test_training_shows_one_bar_and_writes_every_log_dict_to_the_run_folder(tmp_path, capsys):
    torch.set_num_threads(1)
    out = get_trainer("ar")("tiny_test", [*TINY, "training.disable_tqdm=false", f"output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    bars = _bar_lines(err, "train:")
    assert bars and "6/6" in bars[-1] and "loss" in bars[-1] and "anchor_acc" in bars[-1]
    assert "{'loss'" not in err and "'grad_norm'" not in err and "Writing model shards" not in err
    records = [json.loads(line) for line in (out / TRAIN_LOG_JSONL).read_text().splitlines()]
    steps = [r["step"] for r in records if "loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert all("anchor_accuracy" in r or r["step"] < 3 for r in records if "loss" in r)  # stage 0 has no anchors
    assert any("train_runtime" in r for r in records) and records[-1]["event"] == "train_end"
    assert "curriculum: stage 0 -> 1" in (out / TRAIN_LOG).read_text()


def test_cli_quiet_shows_no_bar_and_keeps_the_log(tmp_path, capsys):
    from anchored_reasoning.cli import main

    levels = [(h, h.level) for h in logging.getLogger().handlers]
    try:
        assert main(["train", "tiny_test", *TINY, f"output_dir={tmp_path / 'run'}", "--quiet"]) == 0
    finally:
        for handler, level in levels:
            handler.setLevel(level)
    captured = capsys.readouterr()
    assert not _bar_lines(captured.err, "train:") and "checkpoint:" in captured.out
    assert (tmp_path / "run" / TRAIN_LOG_JSONL).read_text().count('"loss"') >= 6


def test_a_time_boxed_run_shows_minutes_of_its_budget(tmp_path, capsys):
    spent = [30.0]
    progress = TrainProgress(tmp_path / "log.jsonl", budget_seconds=120, clock=lambda: spent[0])
    state = SimpleNamespace(is_world_process_zero=True, global_step=10, max_steps=1000, epoch=0.1)
    progress.on_train_begin(None, state, None)
    spent[0], state.global_step = 60.0, 20
    progress.on_log(None, state, None, logs={"loss": 1.23456, "anchor_accuracy": 0.5})
    progress.on_step_end(None, state, None)
    progress.on_train_end(None, state, None)
    last = _bar_lines(capsys.readouterr().err, "train:")[-1]
    assert "1.0/2.0 min" in last and "loss 1.235" in last and "anchor_acc 0.5" in last
    assert "step 20" in last and "/1000" not in last  # the budget ends the run: the step ceiling is noise
    lines = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert lines[1]["loss"] == pytest.approx(1.23456) and lines[1]["step"] == 20


def test_console_logging_writes_the_run_log_and_restores_handlers(tmp_path):
    root_handlers = list(logging.getLogger().handlers)
    log = logging.getLogger("anchored_reasoning.train.somewhere")
    with console_logging(tmp_path):
        log.info("inside the run")
    log.info("after the run")
    text = (tmp_path / TRAIN_LOG).read_text()
    assert "inside the run" in text and "after the run" not in text
    assert logging.getLogger().handlers == root_handlers


def test_eval_runner_shows_a_generation_and_a_grading_bar(tmp_path, capsys):
    from anchored_reasoning.eval.runner import run_eval
    from anchored_reasoning.methods.prompting import NoCoT
    from test_runner import FakeBackend, FakeTask  # tests/ is on sys.path under pytest

    run_eval(FakeTask(count=8), FakeBackend(), NoCoT(), out_dir=tmp_path / "e", progress=True)
    err = capsys.readouterr().err
    gen = _bar_lines(err, "fake/nocot generate")
    grade = _bar_lines(err, "fake/nocot grade")
    assert gen and "8/8" in gen[-1] and "tok/s" in gen[-1]
    assert grade and "8/8" in grade[-1] and "acc 0.500" in grade[-1]
