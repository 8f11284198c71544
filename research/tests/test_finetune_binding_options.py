"""research/binding/finetune_binding.py's method options: how ``--option`` values are read and where a run is written."""
from __future__ import annotations

import pytest

from research.binding import finetune_binding


def test_options_are_read_as_json_values_and_strings_stay_strings():
    got = finetune_binding.method_options(["answer_line=false", "k=3", "backup_word=B", 'step_separator=" "'])
    assert got == {"answer_line": False, "k": 3, "backup_word": "B", "step_separator": " "}


@pytest.mark.parametrize("bad", ["answer_line", "=false"])
def test_an_option_without_key_or_value_stops_before_any_work(bad):
    with pytest.raises(SystemExit, match="key=value"):
        finetune_binding.main(["--option", bad, "--out", "/nonexistent/never_written.json"])


def test_the_demo_cot_keeps_its_run_folder_and_other_setups_get_their_own():
    assert finetune_binding.run_name("cot", [], 1e-4, 120) == "lr0.0001_steps120"
    a = finetune_binding.run_name("cot", ["answer_line=false"], 1e-4, 120)
    b = finetune_binding.run_name("anchor_chain", ["revisits=true", "mark_backups=true"], 1e-4, 120)
    assert len({a, b, "lr0.0001_steps120"}) == 3 and "=" not in a + b
    # the options' order on the command line does not make a second run of the same setup
    assert b == finetune_binding.run_name("anchor_chain", ["mark_backups=true", "revisits=true"], 1e-4, 120)
    # a value with a space, quotes or a slash stays one plain folder name, and distinct values stay distinct
    spaced = finetune_binding.run_name("cot", ['step_separator=" "'], 1e-4, 120)
    assert not set(' "/\\') & set(spaced) and spaced.startswith("cot_step_separator-")
    assert spaced != finetune_binding.run_name("cot", ['step_separator="\\n"'], 1e-4, 120)
    assert (finetune_binding.run_name("cot", ["a=b-c"], 1e-4, 120)
            != finetune_binding.run_name("cot", ["a=b=c"], 1e-4, 120))
