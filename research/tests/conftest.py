"""Every test here is marked ``research``: the archived scripts' tests, opt-in (``make test`` collects tests/
only). Run them with ``python -m pytest research/tests`` (add ``-m "research and not slow"`` for the quick ones)."""
from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.research)
