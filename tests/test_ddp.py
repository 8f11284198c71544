"""Two-process DDP on CPU trains the tiny recipe to the same losses as one process with the same global batch.

`accelerate launch --cpu --num_processes 2` quietly starts ONE process on a single machine; the
config train/accelerate/ddp_cpu.yaml uses the MULTI_GPU launcher, which starts two real workers that
form a gloo group (the trainer sets use_cpu when no accelerator exists). The test asserts the world
size the trainer saw, so a launch that silently degrades to one process fails.

The launch helpers here are shared with tests/test_fsdp.py (FSDP2 on the same two CPU processes).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from anchored_reasoning.resources import builtin_dir

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["training.generation_eval=false", "training.max_steps=6", "training.logging_steps=1"]
needs_accelerate = pytest.mark.skipif(shutil.which("accelerate") is None, reason="the accelerate launcher is not on PATH")


def launch_env() -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = ""  # CPU processes even on a GPU machine
    return env


def run_training(cmd: list[str], out: Path) -> dict:
    """Run a training command; its train_summary.json."""
    proc = subprocess.run(cmd, cwd=ROOT, env=launch_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "train_summary.json").read_text())


def one_process(out: Path, batch: int, *overrides: str) -> dict:
    """The tiny recipe in this interpreter's process alone, ``batch`` examples per step."""
    return run_training(
        [sys.executable, "-m", "anchored_reasoning.cli", "train", "tiny_test", f"output_dir={out}",
         f"training.per_device_train_batch_size={batch}", *COMMON, *overrides],
        out,
    )


def two_processes(config: str, out: Path, batch: int, *overrides: str) -> dict:
    """The tiny recipe under ``accelerate launch`` with train/accelerate/<config>, ``batch`` per process."""
    return run_training(
        ["accelerate", "launch", "--config_file", str(builtin_dir("train") / "accelerate" / config),
         "--main_process_port", str(free_port()), "-m", "anchored_reasoning.cli", "train", "tiny_test",
         f"output_dir={out}", f"training.per_device_train_batch_size={batch}", *COMMON, *overrides],
        out,
    )


def losses(summary: dict) -> list[float]:
    return [h["loss"] for h in summary["log_history"] if "loss" in h]


def stages(summary: dict) -> list[int]:
    return [h["stage"] for h in summary["curriculum_history"] if h["event"] == "stage"]


def free_port() -> int:
    """A free loopback port, so the rendezvous never collides with another run's default 29500."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def assert_same_training(single: dict, multi: dict, rel: float) -> None:
    """A 2-process run took the steps of the 1-process run with the same global batch."""
    assert single["world_size"] == 1
    assert multi["world_size"] == 2, "the launch did not form a 2-process group"
    assert single["global_steps"] == multi["global_steps"] == 6
    a, b = losses(single), losses(multi)
    assert len(a) == len(b) == 6
    # same global batch, token-count normalisation across processes: the same gradient steps
    assert b == pytest.approx(a, rel=rel)
    # the curriculum moved both runs through the same stages, and the anchor loss was trained in both
    assert stages(single) == stages(multi) and len(stages(multi)) > 1
    assert any("anchor_loss" in h for h in multi["log_history"])


@needs_accelerate
def test_two_process_ddp_matches_one_process(tmp_path):
    single = one_process(tmp_path / "one", 8)
    ddp = two_processes("ddp_cpu.yaml", tmp_path / "two", 4)
    assert ddp["distributed"]["type"] == "MULTI_CPU"  # accelerate's name for DDP over gloo
    assert_same_training(single, ddp, rel=1e-3)
