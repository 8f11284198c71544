"""The metadata file our trainers write into every checkpoint directory, and its reader.

``anchored_reasoning.json`` (``CHECKPOINT_META``) says how a checkpoint was trained: the method and
its options, the prompt style, the task, and for diffusion fine-tuning the response window
(``gen_length``). The trainers write it; the eval runner, the backends and ``ppl`` read it through
:func:`read_checkpoint_meta`. Kept at the bottom of the package so every layer may import it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from anchored_reasoning.errors import ConfigError

CHECKPOINT_META = "anchored_reasoning.json"


def read_checkpoint_meta(model_path: str | os.PathLike | None) -> dict[str, Any] | None:
    """The ``anchored_reasoning.json`` of a checkpoint directory written by our trainer, or None.

    None when ``model_path`` is empty or holds no such file (a Hub id, a model we did not train);
    ConfigError when the file is not a JSON object with a string ``method`` key.
    """
    if not model_path:
        return None
    path = Path(model_path) / CHECKPOINT_META
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}); rewrite it or remove it") from exc
    if not isinstance(meta, dict) or not isinstance(meta.get("method"), str):
        raise ConfigError(f"{path} must be a JSON object with a string 'method' key")
    return meta
