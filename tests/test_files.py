"""``anchored_reasoning.files.atomic_write``: the one whole-file writer the runner, regrading, checkpointing,
the model zoo's cards and the benchmarks' result files share."""
from __future__ import annotations

import pytest

from anchored_reasoning.files import atomic_write


def test_a_write_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "summary.json"
    atomic_write(path, "old\n")
    atomic_write(path, "new\n")
    assert path.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_a_failed_write_keeps_the_old_content_and_cleans_up(tmp_path):
    path = tmp_path / "records.jsonl"
    atomic_write(path, "kept\n")
    with pytest.raises(TypeError):
        atomic_write(path, b"not text")  # fails inside the write, after the temporary file exists
    assert path.read_text() == "kept\n"
    assert [p.name for p in tmp_path.iterdir()] == ["records.jsonl"]
