"""Two-process DDP on CPU trains the tiny recipe to the same losses as one process with the same global batch.

`accelerate launch --cpu --num_processes 2` quietly starts ONE process on a single machine; the
config train/accelerate/ddp_cpu.yaml uses the MULTI_GPU launcher, which starts two real workers that
form a gloo group (the trainer sets use_cpu when no accelerator exists). The test asserts the world
size the trainer saw, so a launch that silently degrades to one process fails.
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


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["CUDA_VISIBLE_DEVICES"] = ""  # CPU DDP even on a GPU machine
    return env


def _run(cmd: list[str], out: Path) -> dict:
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "train_summary.json").read_text())


def _losses(summary: dict) -> list[float]:
    return [h["loss"] for h in summary["log_history"] if "loss" in h]


def _free_port() -> int:
    """A free loopback port, so the rendezvous never collides with another run's default 29500."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.skipif(shutil.which("accelerate") is None, reason="the accelerate launcher is not on PATH")
def test_two_process_ddp_matches_one_process(tmp_path):
    one = tmp_path / "one"
    two = tmp_path / "two"
    single = _run(
        [sys.executable, "-m", "anchored_reasoning.cli", "train", "tiny_test", f"output_dir={one}",
         "training.per_device_train_batch_size=8", *COMMON],
        one,
    )
    config = builtin_dir("train") / "accelerate" / "ddp_cpu.yaml"
    ddp = _run(
        ["accelerate", "launch", "--config_file", str(config), "--main_process_port", str(_free_port()), "-m", "anchored_reasoning.cli", "train", "tiny_test",
         f"output_dir={two}", "training.per_device_train_batch_size=4", *COMMON],
        two,
    )
    assert single["world_size"] == 1
    assert ddp["world_size"] == 2, "the launch did not form a 2-process group"
    assert single["global_steps"] == ddp["global_steps"] == 6
    a, b = _losses(single), _losses(ddp)
    assert len(a) == len(b) == 6
    # same global batch, token-count normalisation across processes: the same gradient steps
    assert b == pytest.approx(a, rel=1e-3)
    # the curriculum moved both runs through the same stages, and the anchor loss was trained in both
    stages = lambda s: [h["stage"] for h in s["curriculum_history"] if h["event"] == "stage"]  # noqa: E731
    assert stages(single) == stages(ddp) and len(stages(ddp)) > 1
    assert any("anchor_loss" in h for h in ddp["log_history"])
