"""The ``anchored-reasoning`` subcommands (one module each, see ``anchored_reasoning/cli.py``)."""
from __future__ import annotations

import logging


def quiet_console() -> None:
    """``--quiet``: the console shows warnings and errors only (files in the run folder keep INFO)."""
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.WARNING)
