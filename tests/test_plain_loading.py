"""Saved checkpoints load with plain transformers in an interpreter that never imported the library:
the documented block of docs/training.md, run as written on a run trained from logic-gpt2-search
(its final model and its checkpoint-N folder), and every diffusion model through its copied code."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
DOC_PATH = "runs/prosqa_gpt2_acot"  # the folder the documented block names
IDS = [5, 17, 42, 9, 3, 4, 30]

#: appended to each loading block: one JSON line with what was loaded and its last-position logits
REPORT = """
import json as _json, sys as _sys, torch as _torch
with _torch.no_grad():
    _logits = model(_torch.tensor([{ids}])).logits[0, -1, :8].tolist()
print(_json.dumps({{"module": type(model).__module__, "logits": _logits,
                   "library": sorted(m for m, mod in _sys.modules.items() if m.startswith("anchored_reasoning") and mod)}}))
"""


def documented_block() -> str:
    """The python block of docs/training.md that says how to load a run with plain transformers."""
    text = (ROOT / "docs" / "training.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "trust_remote_code=True" in b]
    assert len(blocks) == 1, "docs/training.md should have exactly one python block loading with trust_remote_code"
    assert DOC_PATH in blocks[0]
    return blocks[0]


def fresh_interpreter(code: str, tmp_path: Path) -> list[dict]:
    """Run ``code`` in a new interpreter (transformers' module cache in tmp, no stdin); the JSON lines it printed."""
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "hf_modules"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                          stdin=subprocess.DEVNULL, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Do you wish to run the custom code" not in proc.stdout + proc.stderr  # nothing to answer
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def search_run(tmp_path_factory):
    """One optimizer step of the CPU ProsQA recipe from logic-gpt2-search, saving checkpoint-1."""
    from anchored_reasoning.train.pipelines import ar

    out = tmp_path_factory.mktemp("plain") / "run"
    ar.run("prosqa_logic_cpu", [
        "model.name=logic-gpt2-search", f"output_dir={out}", "data.train.n=4", "training.max_steps=1",
        "training.per_device_train_batch_size=2", "training.save_steps=1", "training.warmup_steps=0"])
    return out


def test_a_run_from_logic_gpt2_search_loads_with_the_documented_block(search_run, tmp_path):
    from transformers import AutoModelForCausalLM

    import anchored_reasoning.models  # noqa: F401  (the library's own load gives the reference logits)

    folders = [search_run, search_run / "checkpoint-1"]
    for folder in folders:
        config = json.loads((folder / "config.json").read_text())
        assert config["model_type"] == "shift-gpt2"
        assert config["auto_map"]["AutoModelForCausalLM"] == "shift.ShiftGPT2LMHeadModel"
        assert (folder / "shift.py").read_bytes() == (ROOT / "anchored_reasoning/models/shift.py").read_bytes()
    # the block as written, once per folder, in one interpreter that never imports the library
    code = "".join(documented_block().replace(DOC_PATH, str(folder)) + REPORT.format(ids=IDS) for folder in folders)
    results = fresh_interpreter(code, tmp_path)
    assert len(results) == len(folders)
    for folder, got in zip(folders, results):
        assert got["library"] == [], f"loading imported {got['library']}"
        assert got["module"].startswith("transformers_modules.") and got["module"].endswith(".shift")
        reference = AutoModelForCausalLM.from_pretrained(folder).eval()
        assert type(reference).__module__ == "anchored_reasoning.models.shift"  # imported: no copied code used
        with torch.no_grad():
            want = reference(torch.tensor([IDS])).logits[0, -1, :8]
        assert torch.allclose(torch.tensor(got["logits"]), want, atol=1e-5)


def test_diffusion_models_load_from_their_copied_code_without_the_library(tmp_path):
    from anchored_reasoning import models

    classes = {"mdlm": (models.MDLM, models.MDLMConfig), "adlm": (models.ADLM, models.ADLMConfig),
               "tadm": (models.TADM, models.TADMConfig)}
    # the library made unimportable in the new interpreter: the copied files must stand alone
    code = "import sys\nsys.modules['anchored_reasoning'] = None\nfrom transformers import AutoModelForMaskedLM\n"
    wanted = []
    for name, (cls, config_cls) in classes.items():
        torch.manual_seed(0)
        extra = {"token_shift": 2} if name == "mdlm" else {}  # MDLM's shift imports shift.py lazily: it travels too
        model = cls(config_cls.from_preset("tiny", vocab_size=60, mask_token_id=4, **extra)).eval()
        folder = tmp_path / name
        model.save_pretrained(folder)
        config = json.loads((folder / "config.json").read_text())
        assert config["auto_map"] == {"AutoConfig": f"{name}.{config_cls.__name__}",
                                      "AutoModelForMaskedLM": f"{name}.{cls.__name__}"}
        with torch.no_grad():
            wanted.append(model(torch.tensor([IDS])).logits[0, -1, :8])
        code += (f"model = AutoModelForMaskedLM.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()\n"
                 + REPORT.format(ids=IDS))
    results = fresh_interpreter(code, tmp_path)
    assert len(results) == len(classes)
    for name, got, want in zip(classes, results, wanted):
        assert got["module"].endswith(f".{name}") and got["library"] == []
        assert torch.allclose(torch.tensor(got["logits"]), want, atol=1e-5), name
