"""A run's ``run_config.json``: the recipe a training run was started with, and whether a rerun may resume it.

:func:`check_run_config` compares a rerun's recipe with the recorded one, outside :data:`VOLATILE_KEYS`
(where and how often a run saves and logs), and refuses a difference with a :class:`ResumeError` naming
each key (:func:`~anchored_reasoning.eval.records.diff_settings`); :func:`extension_problem` says when a
finished run may instead go on to a larger ``max_steps`` (``training.extend_max_steps``). Also here: the
recipe defaults for saving (:data:`SAVE_DEFAULTS`), the fingerprint of examples given in code, and the
atomic updates of ``run_config.json`` as checkpoints are saved and the run completes. Used by
:mod:`anchored_reasoning.train.checkpointing`, which re-exports these names; see docs/checkpoints.md.
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import os
from pathlib import Path
from typing import Any, Mapping

from anchored_reasoning.errors import ResumeError
from anchored_reasoning.files import atomic_write
from anchored_reasoning.train.checkpoint_files import list_checkpoints

logger = logging.getLogger(__name__)

RUN_CONFIG = "run_config.json"
#: Recipe defaults for saving (a recipe's own ``training`` values win).
SAVE_DEFAULTS: dict[str, Any] = {
    "save_strategy": "steps",
    "save_steps": 500,
    "save_total_limit": 2,
    "save_every_minutes": 30.0,
}
#: Recipe keys a rerun may change without being refused: where and how often it saves and logs.
VOLATILE_KEYS = frozenset({
    "output_dir", "description",
    "training.save_strategy", "training.save_steps", "training.save_total_limit", "training.save_every_minutes",
    "training.logging_steps", "training.disable_tqdm", "training.log_level", "training.report_to",
    "training.dataloader_num_workers", "training.dataloader_pin_memory", "training.resume_from_checkpoint",
    "training.extend_max_steps",
})
#: Learning-rate schedules whose first N steps do not depend on ``max_steps`` (a run may be extended).
STEP_FREE_SCHEDULES = ("constant", "constant_with_warmup")


def with_save_defaults(training: Mapping[str, Any]) -> dict[str, Any]:
    """``training`` with :data:`SAVE_DEFAULTS` under it."""
    return {**SAVE_DEFAULTS, **dict(training)}


def utc_now() -> str:
    """The time now (UTC, ISO 8601, seconds), as ``run_config.json`` records it."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _atomic_json(path: Path, data: Any) -> None:
    atomic_write(path, json.dumps(data, indent=2, default=str) + "\n")


def identity(recipe: Mapping[str, Any], *, examples: bool = True) -> dict[str, Any]:
    """The recipe without internal (``_``) and :data:`VOLATILE_KEYS` entries; ``_examples`` (the
    fingerprint of examples given in code) stays unless ``examples`` is false."""
    def strip(node: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        out = {}
        for key, value in node.items():
            dotted = f"{prefix}{key}"
            if (str(key).startswith("_") and not (examples and key == "_examples")) or dotted in VOLATILE_KEYS:
                continue
            out[key] = strip(value, dotted + ".") if isinstance(value, Mapping) else value
        return out

    return strip(json.loads(json.dumps(dict(recipe), default=str)), "")


def examples_fingerprint(*splits) -> str:
    """A short hash of examples handed to a trainer in code (their ids, questions, steps, answers), so
    that a rerun on other examples is refused like a changed recipe."""
    import hashlib

    digest = hashlib.sha256()
    for split in splits:
        for ex in split:
            digest.update(json.dumps([str(ex.id), ex.question, list(ex.steps or []), str(ex.answer)],
                                     default=str).encode())
        digest.update(b"|")
    return digest.hexdigest()[:16]


def check_run_config(output_dir: str | os.PathLike, recipe: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``run_config.json`` of an earlier run in ``output_dir`` (None if none); :class:`ResumeError`
    naming every key where ``recipe`` differs from it, or when checkpoints exist without it. Writes
    nothing (a trainer may call it before loading data, then
    :func:`~anchored_reasoning.train.checkpointing.plan_resume`)."""
    from anchored_reasoning.eval.records import diff_settings

    out = Path(output_dir)
    config_path = out / RUN_CONFIG
    if not config_path.is_file():
        if list_checkpoints(out):
            raise ResumeError(f"{out} holds checkpoint folders but no {RUN_CONFIG}; cannot tell what produced them. "
                              "Use a new output_dir or delete the old checkpoints.")
        return None
    try:
        old = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise ResumeError(f"{config_path} is unreadable ({exc}); use a new output_dir or delete {out}") from exc
    with_examples = "_examples" in recipe
    diffs = diff_settings(identity(old.get("recipe") or {}, examples=with_examples), identity(recipe, examples=with_examples))
    if diffs and not (list_checkpoints(out) or old.get("completed_step")):
        logger.warning("%s: an earlier run with other settings (%s) saved nothing; starting over with these",
                       out, "; ".join(diffs))
        return None
    if diffs and (recipe.get("training") or {}).get("extend_max_steps"):
        problem = extension_problem(old.get("recipe") or {}, recipe, diffs)
        if problem:
            raise ResumeError(f"{out}: cannot extend this run (training.extend_max_steps): {problem}")
        logger.info("%s: extending the run from max_steps %s to %s", out,
                    old["recipe"]["training"]["max_steps"], recipe["training"]["max_steps"])
        return old
    if diffs:
        hint = ("\nTo train a finished run longer, add training.extend_max_steps=true (constant learning rate, "
                "no curriculum; docs/checkpoints.md)." if [_key(d) for d in diffs] == ["training.max_steps"] else "")
        raise ResumeError(
            f"{out} holds a training run with different settings:\n  " + "\n  ".join(diffs)
            + f"\nRerun with the same settings to resume it, or give a new output_dir (or delete {out}).{hint}")
    return old


def _key(diff_line: str) -> str:
    return diff_line.split(":", 1)[0]


def extension_problem(old: Mapping[str, Any], new: Mapping[str, Any], diffs: list[str]) -> str | None:
    """Why a run recorded with recipe ``old`` cannot go on to ``new``'s larger ``max_steps`` as if it had
    been started with it (None when it can): only ``training.max_steps`` may differ and must grow, and
    nothing may depend on the run's length (the learning-rate schedule and warm-up, the curriculum's stages)."""
    others = [d for d in diffs if _key(d) != "training.max_steps"]
    if others:
        return "only training.max_steps may change, and these differ too:\n  " + "\n  ".join(others)
    t_old, t_new = old.get("training") or {}, new.get("training") or {}
    before, after = t_old.get("max_steps"), t_new.get("max_steps")
    if not (isinstance(before, int) and isinstance(after, int) and 0 < before < after):
        return f"training.max_steps must grow from the run's {before!r}; asked for {after!r}"
    schedule = t_new.get("lr_scheduler_type", "linear")
    if schedule not in STEP_FREE_SCHEDULES:
        return (f"lr_scheduler_type {schedule!r} depends on max_steps, so the first {before} steps of a "
                f"{after}-step run differ from this run's; only {' or '.join(STEP_FREE_SCHEDULES)} can be extended")
    warmup = t_new.get("warmup_steps") or 0
    if t_new.get("warmup_ratio") or 0 < float(warmup) < 1:
        return "a warm-up given as a share of the run (warmup_ratio) depends on max_steps; give warmup_steps in steps"
    if t_new.get("curriculum"):
        return "the curriculum's stages are shares of max_steps; a longer run would switch stages at other steps"
    return None


def write_run_config(output_dir: Path, data: Mapping[str, Any]) -> None:
    """Write ``<output_dir>/run_config.json`` whole (atomically)."""
    _atomic_json(output_dir / RUN_CONFIG, dict(data))


def update_run_config(output_dir: Path, **values: Any) -> None:
    """Set ``values`` in ``<output_dir>/run_config.json`` (and its latest session's step records), if it exists."""
    path = output_dir / RUN_CONFIG
    if not path.is_file():
        return
    data = json.loads(path.read_text())
    data.update(values)
    if data.get("sessions"):
        data["sessions"][-1].update({k: v for k, v in values.items() if k in ("last_checkpoint_step", "completed_step")})
    _atomic_json(path, data)
