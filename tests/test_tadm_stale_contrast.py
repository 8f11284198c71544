"""benchmarks/tadm_stale_contrast.py's options: the contrast's sizes and refresh periods are checked before any model
is built (K = 1 is always measured, so --ks names the periods beside it), and the defaults are the recorded run's."""
from __future__ import annotations

import pytest

from benchmarks import tadm_stale_contrast


def test_defaults_are_the_recorded_runs_settings():
    args = tadm_stale_contrast.parse_args([])
    assert args.ks == [2, 3, 4, 8] and args.hidden == 128 and args.stale_steps == 400 and args.stale_window == 20
    assert args.out == "benchmarks/results/tadm_stale_contrast.json"
    assert tadm_stale_contrast.parse_args(["--stale-out", "x.json"]).out == "x.json"  # the old flag's name still works


@pytest.mark.parametrize("argv, message", [
    (["--ks", "1", "3"], "each at least 2"),
    (["--stale-steps", "0"], "--stale-steps must be at least 1"),
    (["--hidden", "-4"], "--hidden must be at least 1"),
])
def test_bad_options_are_refused_before_any_work(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(tadm_stale_contrast, "stale_contrast", lambda args: pytest.fail("work started"))
    with pytest.raises(SystemExit):
        tadm_stale_contrast.main(argv)
    assert message in capsys.readouterr().err
