"""Training resumes: a run killed with SIGKILL and rerun with the same command ends where an
uninterrupted run ends (same optimizer steps, same final loss), and says from which step it resumed;
a half-written checkpoint falls back to the previous one; a changed recipe or lost checkpoints are
refused with a message that names the problem."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from anchored_reasoning.errors import ResumeError
from anchored_reasoning.train import checkpointing, get_trainer

ROOT = Path(__file__).resolve().parents[1]

# 12 steps through the curriculum stages of the tiny ACoT recipe, a checkpoint every 4 steps, a
# validation at each stage switch (best from stage 0 on: at this size the first one stays the best)
AR = ["training.max_steps=12", "training.save_steps=4", "training.curriculum_min_steps_per_stage=1",
      "training.generation_eval_samples=2", "training.best_from_stage=0"]
DIFFUSION = ["training.max_steps=12", "training.save_steps=4", "training.save_strategy=steps"]

# Runs the CLI in a process that SIGKILLs itself at a checkpoint save: after writing checkpoint-N
# (``after``) or in the middle of writing it, once the weights are on disk (``during``).
KILLER = textwrap.dedent("""
    import os, signal, sys
    from transformers import Trainer

    mode, step, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    save = Trainer._save_checkpoint

    def killing_save(self, model, trial):
        if self.state.global_step == step and mode == "during":
            self._save_optimizer_and_scheduler = lambda out: os.kill(os.getpid(), signal.SIGKILL)
        save(self, model, trial)
        if self.state.global_step == step and mode == "after":
            os.kill(os.getpid(), signal.SIGKILL)

    Trainer._save_checkpoint = killing_save
    from anchored_reasoning.cli import main
    sys.exit(main(argv))
""")


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               CUDA_VISIBLE_DEVICES="")
    return env


def _cli(args: list[str], tmp_path: Path, kill: tuple[str, int] | None = None) -> subprocess.CompletedProcess:
    if kill is None:
        cmd = [sys.executable, "-m", "anchored_reasoning.cli", "train", *args]
    else:
        script = tmp_path / "killer.py"
        script.write_text(KILLER)
        cmd = [sys.executable, str(script), kill[0], str(kill[1]), "train", *args]
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)


def _summary(out: Path) -> dict:
    return json.loads((out / "train_summary.json").read_text())


def _last_loss(summary: dict) -> float:
    return [h["loss"] for h in summary["log_history"] if "loss" in h][-1]


def _reference(recipe: str, overrides: list[str], out: Path) -> dict:
    torch.set_num_threads(1)
    get_trainer("ar" if recipe == "tiny_test" else "diffusion")(recipe, [*overrides, f"output_dir={out}"])
    return _summary(out)


def test_ar_run_killed_after_a_checkpoint_resumes_to_the_same_end(tmp_path):
    ref = _reference("tiny_test", AR, tmp_path / "ref")
    out = tmp_path / "run"
    args = ["tiny_test", *AR, f"output_dir={out}"]
    killed = _cli(args, tmp_path, kill=("after", 8))
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (out / "checkpoint-8" / "trainer_state.json").is_file() and not (out / "train_summary.json").exists()

    rerun = _cli(args, tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resuming from checkpoint-8 (step 8" in rerun.stderr
    assert "resuming from checkpoint-8 (step 8" in (out / "train.log").read_text()
    summary = _summary(out)
    assert summary["global_steps"] == ref["global_steps"] == 12
    assert summary["resumed_from_step"] == 8 and summary["session"] == 2
    assert _last_loss(summary) == pytest.approx(_last_loss(ref), rel=1e-4)
    # the curriculum came back at the stage it was saved in and went on through the same switches
    stages = lambda s: [(h["step"], h["stage"]) for h in s["curriculum_history"] if h["event"] == "stage"]  # noqa: E731
    assert stages(summary) == stages(ref) and summary["final_stage"] == ref["final_stage"]
    assert summary["optimizer_resets"] == ref["optimizer_resets"]
    # the best validated checkpoint survived rotation and its weights were restored at the end, as without the kill
    from safetensors.torch import load_file

    best = ref["best"]["step"]
    assert 0 < best < 8 and summary["best"]["step"] == best and (out / f"checkpoint-{best}").is_dir()
    final, ref_final = load_file(str(out / "model.safetensors")), load_file(str(tmp_path / "ref" / "model.safetensors"))
    assert all(torch.equal(final[k], ref_final[k]) for k in ref_final)
    # both sessions' per-step logs are in the run folder
    lines = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert {rec.get("session") for rec in lines} == {1, 2}
    assert [rec["step"] for rec in lines if rec.get("event") == "train_begin"] == [0, 8]


def test_diffusion_run_killed_during_a_save_falls_back_to_the_previous_checkpoint(tmp_path):
    ref = _reference("diffusion_tiny_test", DIFFUSION, tmp_path / "ref")
    out = tmp_path / "run"
    args = ["diffusion_tiny_test", *DIFFUSION, f"output_dir={out}"]
    killed = _cli(args, tmp_path, kill=("during", 8))
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (out / "checkpoint-8" / "model.safetensors").is_file()
    assert not (out / "checkpoint-8" / "trainer_state.json").exists()  # half written

    rerun = _cli(args, tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "checkpoint-8: no trainer_state.json" in rerun.stderr and "falling back" in rerun.stderr
    assert "resuming from checkpoint-4 (step 4" in rerun.stderr
    assert (out / "incomplete-checkpoint-8" / "model.safetensors").is_file()  # moved aside, not deleted
    summary = _summary(out)
    assert summary["global_steps"] == ref["global_steps"] == 12 and summary["resumed_from_step"] == 4
    # the diffusion loss draws random masks and times: equal only if the RNG state came back too
    assert _last_loss(summary) == pytest.approx(_last_loss(ref), rel=1e-4)


def test_a_run_killed_after_its_last_checkpoint_is_finished_without_another_step(tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "run"
    args = ["tiny_test", "training.max_steps=5", "training.save_steps=2", "training.curriculum=false",
            f"output_dir={out}"]
    killed = _cli(args, tmp_path, kill=("after", 5))  # the last checkpoint is written, the final model is not
    assert killed.returncode == -9 and not (out / "model.safetensors").exists()
    rerun = _cli(args, tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resuming from checkpoint-5 (step 5" in rerun.stderr
    summary = _summary(out)
    assert summary["global_steps"] == 5 and max(h["step"] for h in summary["log_history"]) == 5
    final, last = load_file(str(out / "model.safetensors")), load_file(str(out / "checkpoint-5" / "model.safetensors"))
    assert all(torch.equal(final[k], last[k]) for k in last)


def test_a_changed_recipe_is_refused_naming_the_key(tmp_path):
    out = tmp_path / "run"
    base = ["training.max_steps=4", "training.save_steps=2", "training.generation_eval=false",
            "training.curriculum=false", f"output_dir={out}"]
    get_trainer("ar")("tiny_test", base)
    with pytest.raises(ResumeError) as info:
        get_trainer("ar")("tiny_test", [*base, "training.learning_rate=0.01"])
    assert "training.learning_rate: 0.001 (in the run) != 0.01 (asked for)" in str(info.value)
    # where and how often it saves or logs may change: this rerun finds the run finished
    assert get_trainer("ar")("tiny_test", [*base, "training.logging_steps=2", "training.save_steps=3"]) == out


def test_cli_refuses_a_changed_recipe(tmp_path):
    out = tmp_path / "run"
    base = ["training.max_steps=2", "training.save_steps=1", "training.generation_eval=false",
            "training.curriculum=false", f"output_dir={out}"]
    get_trainer("ar")("tiny_test", base)
    proc = _cli(["tiny_test", *base, "method.options.k=3"], tmp_path)
    assert proc.returncode == 1 and "method.options.k: 2 (in the run) != 3 (asked for)" in proc.stderr


def test_lost_checkpoints_are_an_error_not_a_restart(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    recipe = {"trainer": "ar", "seed": 0}
    (out / checkpointing.RUN_CONFIG).write_text(json.dumps({"recipe": recipe, "last_checkpoint_step": 8}))
    with pytest.raises(ResumeError, match="saved checkpoint-8, but no usable checkpoint is left"):
        checkpointing.plan_resume(out, recipe, trainer="ar")
    with pytest.raises(ResumeError, match="resume_from_checkpoint='/nowhere'"):
        checkpointing.plan_resume(tmp_path / "other", {**recipe, "training": {"resume_from_checkpoint": "/nowhere"}},
                                  trainer="ar")


def test_checkpoints_without_a_run_config_are_refused(tmp_path):
    (tmp_path / "checkpoint-4").mkdir()
    with pytest.raises(ResumeError, match="no run_config.json"):
        checkpointing.plan_resume(tmp_path, {"trainer": "ar"}, trainer="ar")


def _fake_checkpoint(folder: Path, step: int) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    save_file({"w": torch.arange(64, dtype=torch.float32)}, str(folder / "model.safetensors"))
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.save({"x": torch.ones(32)}, folder / name)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 100}))
    return folder


@pytest.mark.parametrize("damage, problem", [
    (lambda f: (f / "trainer_state.json").unlink(), "no trainer_state.json"),
    (lambda f: (f / "trainer_state.json").write_text('{"global_st'), "trainer_state.json is unreadable"),
    (lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:-40]), "model.safetensors"),
    (lambda f: (f / "optimizer.pt").write_bytes((f / "optimizer.pt").read_bytes()[:100]), "optimizer.pt"),
    (lambda f: (f / "scheduler.pt").unlink(), "no scheduler.pt"),
])
def test_a_damaged_checkpoint_is_detected_and_the_previous_one_used(tmp_path, damage, problem):
    _fake_checkpoint(tmp_path / "checkpoint-4", 4)
    newest = _fake_checkpoint(tmp_path / "checkpoint-8", 8)
    assert checkpointing.checkpoint_problem(newest) is None
    damage(newest)
    assert problem in checkpointing.checkpoint_problem(newest)
    chosen, skipped = checkpointing.newest_good_checkpoint(tmp_path)
    assert chosen == tmp_path / "checkpoint-4" and problem in skipped[0]
    assert (tmp_path / "incomplete-checkpoint-8").is_dir() and not newest.exists()


def test_fsdp_checkpoint_layouts_are_accepted_and_a_cut_short_shard_is_not(tmp_path):
    full = _fake_checkpoint(tmp_path / "checkpoint-4", 4)  # FSDP FULL_STATE_DICT: *_fsdp.bin, optimizer.bin
    (full / "optimizer.pt").rename(full / "optimizer.bin")
    torch.save({"w": torch.ones(4)}, full / "pytorch_model_fsdp.bin")
    assert checkpointing.checkpoint_problem(full) is None
    sharded = _fake_checkpoint(tmp_path / "checkpoint-8", 8)  # SHARDED_STATE_DICT: folders written by DCP
    (sharded / "optimizer.pt").unlink()
    (sharded / "optimizer_0").mkdir()
    (sharded / "pytorch_model_fsdp_0").mkdir()
    (sharded / "pytorch_model_fsdp_0" / ".metadata").write_bytes(b"x")
    assert "optimizer_0/ has no .metadata" in checkpointing.checkpoint_problem(sharded)
    (sharded / "optimizer_0" / ".metadata").write_bytes(b"x")
    assert checkpointing.checkpoint_problem(sharded) is None


def test_a_time_boxed_run_carries_the_time_spent(tmp_path):
    ckpt = _fake_checkpoint(tmp_path / "checkpoint-4", 4)
    state = json.loads((ckpt / "trainer_state.json").read_text())
    state["stateful_callbacks"] = {"RunState": {"args": {}, "attributes": {"seconds_spent": 70.0, "stopped": False}}}
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    recipe = {"trainer": "ar", "training": {"max_train_seconds": 100}}
    (tmp_path / checkpointing.RUN_CONFIG).write_text(json.dumps({"recipe": recipe, "last_checkpoint_step": 4}))
    plan = checkpointing.plan_resume(tmp_path, recipe, trainer="ar")
    assert plan.step == 4 and plan.seconds_spent == 70.0 and not plan.complete
    from anchored_reasoning.train.callbacks.curriculum import TimeBudgetCallback

    budget = TimeBudgetCallback(100)
    budget.spent_before = plan.seconds_spent
    assert budget.elapsed() == pytest.approx(70.0)
    # a budget already spent: the checkpoint is the end of training
    state["stateful_callbacks"]["RunState"]["attributes"]["seconds_spent"] = 100.5
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    assert checkpointing.plan_resume(tmp_path, recipe, trainer="ar").complete


def test_run_state_saves_by_wall_time_at_a_stop_and_at_a_new_best():
    import time

    from transformers import TrainerControl

    args = SimpleNamespace(save_strategy="steps")
    state = SimpleNamespace(global_step=3, max_steps=100, best_global_step=None, best_metric=None,
                            is_world_process_zero=True)
    curriculum = SimpleNamespace(best=None, export_state=lambda: {"stage": 1})
    run_state = checkpointing.RunState(None, curriculum=curriculum, save_every_minutes=0.001)  # 60 ms
    run_state.on_train_begin(args, state, TrainerControl())
    control = run_state.on_step_end(args, state, TrainerControl())
    assert not control.should_save
    time.sleep(0.08)
    assert run_state.on_step_end(args, state, TrainerControl()).should_save  # wall time since the last save
    run_state.on_save(args, state, TrainerControl())
    assert not run_state.on_step_end(args, state, TrainerControl()).should_save
    # a time budget stopped the run: save where it stopped, and remember it was stopped
    stopping = TrainerControl(should_training_stop=True)
    assert run_state.on_step_end(args, state, stopping).should_save and run_state.stopped
    # a new best validation at this step: keep its checkpoint as the Trainer's best
    curriculum.best = {"step": 3, "accuracy": 0.75}
    assert run_state.on_step_end(args, state, TrainerControl()).should_save
    assert (state.best_global_step, state.best_metric) == (3, 0.75)
    assert run_state.state()["attributes"] == {"seconds_spent": pytest.approx(run_state.seconds_spent(), abs=0.1),
                                              "stopped": True, "curriculum": {"stage": 1}}
    # with saving off, nothing asks for a save
    off = SimpleNamespace(save_strategy="no")
    assert not run_state.on_step_end(off, state, TrainerControl(should_training_stop=True)).should_save


def test_a_finished_run_extended_to_more_steps_ends_as_a_run_started_with_them(tmp_path):
    from safetensors.torch import load_file

    base = ["training.save_steps=4", "training.generation_eval=false", "training.curriculum=false",
            "training.lr_scheduler_type=constant_with_warmup", "training.warmup_steps=2"]
    ref = _reference("tiny_test", [*base, "training.max_steps=12"], tmp_path / "ref")
    out = tmp_path / "run"
    get_trainer("ar")("tiny_test", [*base, "training.max_steps=8", f"output_dir={out}"])
    assert _summary(out)["global_steps"] == 8
    with pytest.raises(ResumeError, match="add training.extend_max_steps=true"):  # not without asking
        get_trainer("ar")("tiny_test", [*base, "training.max_steps=12", f"output_dir={out}"])
    get_trainer("ar")("tiny_test", [*base, "training.max_steps=12", "training.extend_max_steps=true", f"output_dir={out}"])
    summary = _summary(out)
    assert summary["global_steps"] == ref["global_steps"] == 12 and summary["resumed_from_step"] == 8
    assert _last_loss(summary) == _last_loss(ref)
    final, ref_final = load_file(str(out / "model.safetensors")), load_file(str(tmp_path / "ref" / "model.safetensors"))
    assert all(torch.equal(final[k], ref_final[k]) for k in ref_final)
    config = json.loads((out / checkpointing.RUN_CONFIG).read_text())
    assert config["recipe"]["training"]["max_steps"] == 12 and config["completed_step"] == 12
    assert config["sessions"][-1]["extended_from_max_steps"] == 8
    # extended once, the run is finished at its new length: the same command does nothing more
    get_trainer("ar")("tiny_test", [*base, "training.max_steps=12", "training.extend_max_steps=true", f"output_dir={out}"])
    assert _summary(out)["global_steps"] == 12


@pytest.mark.parametrize("change, problem", [
    (["training.max_steps=2"], "max_steps must grow from the run's 4; asked for 2"),
    (["training.max_steps=8", "training.learning_rate=0.01"], "training.learning_rate: 0.001 (in the run) != 0.01"),
])
def test_an_extension_that_changes_more_than_the_length_is_refused(tmp_path, change, problem):
    out = tmp_path / "run"
    base = ["training.save_steps=2", "training.generation_eval=false", "training.curriculum=false",
            "training.extend_max_steps=true", f"output_dir={out}"]
    get_trainer("ar")("tiny_test", [*base, "training.max_steps=4"])
    with pytest.raises(ResumeError, match="cannot extend this run") as info:
        get_trainer("ar")("tiny_test", [*base, *change])
    assert problem in str(info.value)


def test_extension_problem_names_what_depends_on_the_length():
    old = {"training": {"max_steps": 100, "lr_scheduler_type": "constant", "curriculum": False}}
    diffs = ["training.max_steps: 100 (in the run) != 300 (asked for)"]

    def problem(**training):
        return checkpointing.extension_problem(old, {"training": {**old["training"], "max_steps": 300, **training}}, diffs)

    assert problem() is None and problem(lr_scheduler_type="constant_with_warmup", warmup_steps=20) is None
    assert "lr_scheduler_type 'linear' depends on max_steps" in problem(lr_scheduler_type="linear")
    assert "lr_scheduler_type 'linear'" in checkpointing.extension_problem(
        {"training": {"max_steps": 100}}, {"training": {"max_steps": 300}}, diffs)  # the Trainer's default schedule
    assert "warmup_ratio" in problem(warmup_ratio=0.1) and "warmup_ratio" in problem(warmup_steps=0.05)
    assert "curriculum's stages are shares of max_steps" in problem(curriculum=True)


def test_extending_a_run_whose_checkpoints_are_gone_is_an_error(tmp_path):
    out = tmp_path / "run"
    base = ["training.save_steps=2", "training.generation_eval=false", "training.curriculum=false",
            "training.extend_max_steps=true", f"output_dir={out}"]
    get_trainer("ar")("tiny_test", [*base, "training.max_steps=4"])
    for folder in out.glob("checkpoint-*"):
        import shutil

        shutil.rmtree(folder)
    with pytest.raises(ResumeError, match="no checkpoint is left to continue from"):
        get_trainer("ar")("tiny_test", [*base, "training.max_steps=6"])
