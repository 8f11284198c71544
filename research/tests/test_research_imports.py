"""Every archived script still imports against today's library and benchmarks (frozen is not broken): a
research module whose import fails names the module and the error."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

RESEARCH = Path(__file__).resolve().parents[1]
MODULES = sorted(".".join(p.relative_to(RESEARCH.parent).with_suffix("").parts)
                 for p in RESEARCH.glob("*/*.py") if p.parent.name != "tests" and p.stem != "__init__")


def test_the_archive_has_its_scripts():
    assert "research.backbones.backbone" in MODULES and "research.ladder.trace_order" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_research_module_imports(name):
    module = importlib.import_module(name)
    assert module.__doc__, f"{name} has no module docstring (the question it asks and its command)"
