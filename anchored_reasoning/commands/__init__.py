"""The ``anchored-reasoning`` subcommands (one module each, see ``anchored_reasoning/cli.py``)."""
from __future__ import annotations

import logging


def quiet_console() -> None:
    """``--quiet``: the console shows warnings and errors only (files in the run folder keep INFO), and no
    model-loading or download bars (transformers' ``Loading weights``, the Hub's)."""
    import huggingface_hub.utils
    from transformers.utils import logging as hf_logging

    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.WARNING)
    hf_logging.disable_progress_bar()
    huggingface_hub.utils.disable_progress_bars()
