"""benchmarks/gpu_check.sh on a machine without CUDA: every CUDA part is skipped with its reason, the
toy-size dry run exercises the ACoT and diffusion code paths, and one JSON is written."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA behaviour; on a GPU run the script itself")


def run_check(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(SCRIPT), "--out", str(out), *args], capture_output=True, text=True, env=env,
                          timeout=600, cwd=tmp_path)
    assert out.is_file(), proc.stdout + proc.stderr
    return proc, json.loads(out.read_text())


def test_without_cuda_every_cuda_part_is_skipped_with_the_reason(tmp_path):
    proc, result = run_check(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CUDA: none (CUDA parts will be skipped)" in proc.stdout
    parts = result["parts"]
    assert set(parts) == {"vllm_backend", "acot_step", "diffusion_step", "grpo_vllm"}
    for name, entry in parts.items():
        assert entry["status"] == "skipped", (name, entry)
        assert "CUDA" in entry["reason"] or "grpo.py" in entry["reason"], entry
    assert result["dry_run"] is False and result["environment"]["cuda"] is False
    for key in ("date", "machine", "threads", "command"):
        assert result[key] not in (None, "")


def test_dry_run_runs_the_diffusion_part_on_the_cpu(tmp_path):
    proc, result = run_check(tmp_path, "--dry-run", "--parts", "diffusion_step,vllm_backend")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    diff = result["parts"]["diffusion_step"]
    assert diff["status"] == "ok" and diff["device"] == "cpu" and diff["dtype"] == "bfloat16"
    assert diff["generated_shape"] == [2, 16 + 8] and diff["no_mask_left"] is True
    assert result["parts"]["vllm_backend"]["status"] == "skipped" and "dry run" in result["parts"]["vllm_backend"]["reason"]
    assert set(result["parts"]) == {"diffusion_step", "vllm_backend"}


@pytest.mark.slow
def test_dry_run_acot_step_trains_with_the_anchor_loss(tmp_path):
    pytest.importorskip("trl")
    proc, result = run_check(tmp_path, "--dry-run", "--parts", "acot_step")
    entry = result["parts"]["acot_step"]
    assert proc.returncode == 0 and entry["status"] == "ok", entry
    assert entry["steps"] == 2 and len(entry["losses"]) == 2 and entry["anchor_loss_logged"] is True


def test_unknown_part_is_an_error_naming_it(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT), "--parts", "warp_drive", "--out", str(tmp_path / "x.json")],
                          capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable}, timeout=120)
    assert proc.returncode != 0 and "warp_drive" in proc.stderr
