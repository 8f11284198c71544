"""The documentation site builds in strict mode (a broken link, a page missing from the nav or an unknown
anchor fails), every object the API reference renders has a docstring, and the reference covers the public API."""
from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference.md"


def _reference_targets() -> list[str]:
    return re.findall(r"^::: ([\w.]+)\s*$", REFERENCE.read_text(), flags=re.M)


def _resolve(dotted: str):
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def test_site_builds_strictly(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "index.html").is_file()
    results = (tmp_path / "site" / "results" / "index.html").read_text()
    assert "Real ProsQA test" in results  # RESULTS.md itself, put in place by docs/_hooks.py


def test_every_reference_object_and_its_public_members_have_docstrings():
    missing = []
    for dotted in _reference_targets():
        obj = _resolve(dotted)
        if not inspect.getdoc(obj):
            missing.append(dotted)
        if inspect.isclass(obj):
            for name, member in vars(obj).items():
                if name.startswith("_") or not callable(member):
                    continue
                if getattr(member, "__module__", obj.__module__) == obj.__module__ and not inspect.getdoc(member):
                    missing.append(f"{dotted}.{name}")
    assert not missing, f"no docstring: {missing}"


def test_the_reference_covers_the_public_api():
    import anchored_reasoning

    covered = {t.rsplit(".", 1)[-1] for t in _reference_targets()} | {
        name for t in _reference_targets() for name in getattr(_resolve(t), "__all__", [])}
    public = [n for n in anchored_reasoning.__all__ if not n.startswith("_")]
    missing = sorted(set(public) - covered)
    assert not missing, f"docs/reference.md lacks ::: entries for {missing}"
