"""What a training run shows in the terminal, and the full log it keeps in the run folder.

    train:  40%|████      | 8/20 [00:02<00:03, 3.61step/s, loss 2.731, anchor_acc 0.312]

* One tqdm bar per run (main process): steps done / ``max_steps``, or, for a time-boxed run
  (``max_train_seconds``), minutes spent / the budget (the step count goes in the postfix); the latest
  loss and anchor accuracy (where the trainer logs one) beside tqdm's rate and ETA. A resumed run's
  bar starts where the checkpoint was.
* No raw log dicts on the console: transformers' ``ProgressCallback`` / ``PrinterCallback`` are
  replaced; each log dict becomes one JSON line of ``<run>/train_log.jsonl`` (with step, epoch,
  session and time), which also keeps the lines of a session that was killed.
* ``<run>/train.log``: every ``logging`` message of the library at INFO and above, whatever the console
  shows: during training (:func:`console_logging`), and, inside :func:`run_log` (every trainer that
  :func:`anchored_reasoning.train.get_trainer` returns), from the run's start -- data, model, warnings,
  held until training names the folder -- to its end (``saved ...``). Console log lines are written
  through ``tqdm.write`` so they never break the bar.
* ``training.disable_tqdm: true`` (``anchored-reasoning train --quiet``) turns the bar off; both files
  are still written.

Used through :func:`anchored_reasoning.train.checkpointing.attach` / ``train``; a trainer outside
this package calls :func:`install_progress` and wraps ``trainer.train()`` in :func:`console_logging`
(and its whole run in :func:`run_log`).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from tqdm.auto import tqdm
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

TRAIN_LOG_JSONL = "train_log.jsonl"
TRAIN_LOG = "train.log"
#: Log keys shown in the bar's postfix, in this order, with their short names.
POSTFIX_KEYS = {"loss": "loss", "anchor_accuracy": "anchor_acc", "nelbo": "nelbo", "eval_loss": "eval_loss"}


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


class TrainProgress(TrainerCallback):
    """The bar and the JSONL log (see the module docstring). ``clock()`` returns the wall seconds the
    run has spent so far, earlier sessions included (for the time-budget bar)."""

    def __init__(self, log_path: str | os.PathLike, *, show: bool = True, budget_seconds: float | None = None,
                 clock: Callable[[], float] | None = None, session: int = 1) -> None:
        self.log_path = Path(log_path)
        self.show = show
        self.budget_seconds = budget_seconds
        self.clock = clock
        self.session = session
        self.bar = None
        self._file = None
        self.postfix: dict[str, str] = {}

    def _timed(self) -> bool:
        return bool(self.budget_seconds) and self.clock is not None

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps({k: _jsonable(v) for k, v in record.items()}) + "\n")
            self._file.flush()

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.log_path, "a", encoding="utf-8")
        self._write({"event": "train_begin", "session": self.session, "step": state.global_step,
                     "max_steps": state.max_steps, "time": _now()})
        if not self.show:
            return
        if self._timed():
            total = self.budget_seconds / 60.0
            self.bar = tqdm(total=total, initial=min(self.clock() / 60.0, total), desc="train", dynamic_ncols=True,
                            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} min "
                                       "[{elapsed}<{remaining}{postfix}]")
        else:
            self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc="train", unit="step",
                            dynamic_ncols=True)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is None:
            return
        if self._timed():  # the budget ends the run: max_steps is only a ceiling (often a placeholder)
            self.postfix["step"] = str(state.global_step)
            self.bar.set_postfix_str(self._postfix_text(), refresh=False)
            self.bar.update(min(self.clock() / 60.0, self.bar.total) - self.bar.n)
        else:
            self.bar.update(state.global_step - self.bar.n)

    def _postfix_text(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.postfix.items())

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        self._write({"session": self.session, "step": state.global_step, "epoch": state.epoch, "time": _now(), **logs})
        for key, short in POSTFIX_KEYS.items():
            if isinstance(logs.get(key), (int, float)):
                self.postfix[short] = f"{logs[key]:.4g}"
        if self.bar is not None:
            self.bar.set_postfix_str(self._postfix_text())

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self._write({"event": "train_end", "session": self.session, "step": state.global_step, "time": _now()})
        if self._file is not None:
            self._file.close()
            self._file = None


def install_progress(trainer, output_dir: str | os.PathLike, *, budget_seconds: float | None = None,
                     clock: Callable[[], float] | None = None, quiet: bool | None = None,
                     session: int = 1) -> TrainProgress:
    """Replace transformers' console callbacks on ``trainer`` by :class:`TrainProgress`. ``quiet``
    (default: ``trainer.args.disable_tqdm``) hides the bar."""
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    hide = bool(trainer.args.disable_tqdm) if quiet is None else quiet
    progress = TrainProgress(Path(output_dir) / TRAIN_LOG_JSONL, show=not hide, budget_seconds=budget_seconds,
                             clock=clock, session=session)
    trainer.add_callback(progress)
    return progress


class _TqdmHandler(logging.StreamHandler):
    """A console handler that writes through ``tqdm.write`` (the bar is redrawn below the line)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


def _is_console(handler: logging.Handler) -> bool:
    return type(handler) is logging.StreamHandler and getattr(handler, "stream", None) in (sys.stderr, sys.stdout)


@contextlib.contextmanager
def no_transformers_bars() -> Iterator[None]:
    """transformers' own small bars (``Writing model shards`` at every save) off for a while."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def _drop_mtime_notice(record: logging.LogRecord) -> bool:
    """Trainer's checkpoint rotation says this on many filesystems, then sorts by step, which is right."""
    return not str(record.msg).startswith("mtime may not be reliable")


#: The format of ``train.log`` lines.
FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class RunLog(logging.Handler):
    """The handler behind :func:`run_log`: keeps INFO+ records (at most ``limit``) until :meth:`open`
    names the run folder, then appends them, and every later one, to ``<folder>/train.log``."""

    def __init__(self, limit: int = 10_000) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter(FILE_FORMAT))
        self.limit = limit
        self.held: list[logging.LogRecord] = []
        self.file: logging.FileHandler | None = None

    def open(self, folder: str | os.PathLike) -> None:
        path = Path(folder) / TRAIN_LOG
        if self.file is not None and Path(self.file.baseFilename) == path.absolute():
            return
        self.close_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = logging.FileHandler(path, encoding="utf-8")
        self.file.setFormatter(self.formatter)
        for record in self.held:
            self.file.emit(record)
        self.held = []

    def emit(self, record: logging.LogRecord) -> None:
        if self.file is not None:
            self.file.emit(record)
        elif len(self.held) < self.limit:
            self.held.append(record)

    def close_file(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


class _BelowConsole(logging.Filter):
    """Keeps this library's records under the console's level off a console handler (the library logger
    was lowered to INFO for the run's files only)."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level or not record.name.startswith("anchored_reasoning")


def _active_run_log() -> RunLog | None:
    return next((h for h in logging.getLogger("anchored_reasoning").handlers if isinstance(h, RunLog)), None)


def _info_for_files(stack: contextlib.ExitStack) -> None:
    """Lower the library's logger to INFO until ``stack`` closes, for the run's files, without showing
    more on the console (its handlers drop this library's records under the level they showed before)."""
    ours = logging.getLogger("anchored_reasoning")
    console_level = max(logging.root.level, ours.getEffectiveLevel())
    if ours.getEffectiveLevel() > logging.INFO:
        stack.callback(ours.setLevel, ours.level)
        ours.setLevel(logging.INFO)
        guard = _BelowConsole(console_level)
        for handler in logging.root.handlers:
            if _is_console(handler):
                handler.addFilter(guard)
                stack.callback(handler.removeFilter, guard)


@contextlib.contextmanager
def run_log() -> Iterator[RunLog | None]:
    """The whole run's ``train.log``: the library's INFO+ records from now on, held until training opens
    its folder (:func:`console_logging` does), then appended there until the block ends. Inside an
    active ``run_log`` (a trainer calling another) this is the outer one; on ranks other than 0, nothing."""
    active = _active_run_log()
    if active is not None or int(os.environ.get("RANK", "0") or 0) != 0:
        yield active
        return
    with contextlib.ExitStack() as stack:
        _info_for_files(stack)
        handler = RunLog()
        ours = logging.getLogger("anchored_reasoning")
        ours.addHandler(handler)
        stack.callback(handler.close_file)
        stack.callback(ours.removeHandler, handler)
        yield handler


@contextlib.contextmanager
def console_logging(output_dir: str | os.PathLike) -> Iterator[None]:
    """During training: console log lines go through ``tqdm.write`` (same level, format and stream),
    every INFO+ message of this library goes to ``<output_dir>/train.log`` too (through the active
    :func:`run_log`, which keeps writing there after training), and transformers' own small bars (one
    per checkpoint write) are off, so the training bar is the only one."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(no_transformers_bars())
        rotation_logger = logging.getLogger("transformers.trainer_utils")
        rotation_logger.addFilter(_drop_mtime_notice)
        stack.callback(rotation_logger.removeFilter, _drop_mtime_notice)
        ours = logging.getLogger("anchored_reasoning")
        console_level = max(logging.root.level, ours.getEffectiveLevel())
        stack.callback(ours.setLevel, ours.level)
        active = _active_run_log()
        if active is not None:
            active.open(output_dir)
        elif int(os.environ.get("RANK", "0") or 0) == 0:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            file_handler = logging.FileHandler(Path(output_dir) / TRAIN_LOG, encoding="utf-8")
            file_handler.setLevel(logging.INFO)
            file_handler.setFormatter(logging.Formatter(FILE_FORMAT))
            ours.addHandler(file_handler)
            stack.callback(file_handler.close)
            stack.callback(ours.removeHandler, file_handler)
            if ours.getEffectiveLevel() > logging.INFO:
                ours.setLevel(logging.INFO)  # the file gets INFO; the console keeps the level it had
        for logger in (logging.root, logging.getLogger("transformers")):
            stack.callback(setattr, logger, "handlers", list(logger.handlers))
            logger.handlers = [_through_tqdm(h, console_level if logger is logging.root else logging.NOTSET)
                               if _is_console(h) else h for h in logger.handlers]
        yield


def _through_tqdm(handler: logging.Handler, default_level: int) -> logging.Handler:
    new = _TqdmHandler(handler.stream)
    new.setLevel(handler.level or default_level)
    new.setFormatter(handler.formatter)
    for f in handler.filters:
        new.addFilter(f)
    return new


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")
