"""Math answer equivalence through math-verify, with a deadline that works from any thread.

math-verify's own timeout uses ``signal.alarm`` and therefore works only in the main
thread of the main interpreter. :func:`check_math` picks one of two paths:

* **in-process** (main thread, POSIX): math-verify runs with its own timeouts switched
  off, under our ``setitimer`` deadline (sub-second resolution). The deadline exception
  derives from ``BaseException`` so math-verify's ``except Exception`` cannot swallow it.
* **worker process** (any other thread, or ``mode="process"``): the comparison is sent to
  a small pool of long-lived worker processes (``_worker_main``) over pipes. The caller waits at most ``timeout`` (+ a start-up allowance); a worker that
  misses its deadline is killed and replaced, so a pathological input never hangs the
  caller. The worker itself uses the in-process path, so most timeouts are reported by
  the worker without being killed.

A comparison that runs out of time is reported as ``MathCheck(equal=False, error="timeout")``;
the graders turn it into a graded-wrong :class:`~anchored_reasoning.types.Grade` with
``details["error"] = "timeout"``. An unparseable *gold* answer raises
:class:`~anchored_reasoning.errors.DataError`: it is never a free pass.

Limit: a signal can only interrupt Python bytecode, not one long C call (a pathological
regular expression inside math-verify, for instance). ``mode="process"`` (or
``ANCHORED_REASONING_MATH_ISOLATION=process``) gives a hard, kill-based deadline for that case.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from anchored_reasoning.errors import DataError

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 5.0
# Allowance for a fresh worker to import math-verify and sympy before its first answer.
_STARTUP_ALLOWANCE = 20.0


@dataclass
class MathCheck:
    """Outcome of one comparison. ``error`` is None, "timeout" or "pred_unparseable"."""

    equal: bool
    error: str | None = None
    value: str | None = None  # the prediction as math-verify parsed it (str of the sympy object)
    is_integer: bool | None = None  # whether the parsed prediction is an integer (AIME range checks)
    integer: int | None = None


class _Deadline(BaseException):
    """Raised by our timer; a BaseException so math-verify's ``except Exception`` lets it through."""


def _silence_math_verify_timeout_warning() -> None:
    # We switch math-verify's signal timeouts off on purpose (ours replace them); its
    # one-time "timeout is disabled" warning would only confuse users.
    import math_verify.grader
    import math_verify.parser

    math_verify.parser.TIMEOUT_WARNING_SHOWN = True
    math_verify.grader.TIMEOUT_WARNING_SHOWN = True


@lru_cache(maxsize=1)
def _mv():
    import math_verify
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    _silence_math_verify_timeout_warning()
    return math_verify, [LatexExtractionConfig(), ExprExtractionConfig()]


def _parse(text: str) -> list:
    mv, config = _mv()
    text = text.strip()
    # A bare answer ("1,000", "\\frac{1}{2}", "9^{9}") is parsed as one math expression;
    # without delimiters math-verify's LaTeX extractor may pick a fragment of it.
    if "$" not in text and "\\(" not in text and "\\[" not in text and "\\boxed" not in text:
        text = f"${text}$"
    return mv.parse(text, extraction_config=config, parsing_timeout=None, raise_on_error=False)


@lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> tuple:
    # Cached: the same gold answer is compared against many samples. Only called inside a
    # deadline; an exception (including _Deadline) is not cached by lru_cache.
    return tuple(_parse(gold))


def _integer_of(parsed: list) -> tuple[bool, int | None]:
    import sympy

    for item in parsed:
        if isinstance(item, sympy.Basic):
            try:
                if isinstance(item, sympy.Integer):
                    return True, int(item)
                if item.is_number:
                    value = sympy.nsimplify(item)
                    if value.is_integer:
                        return True, int(value)
                    return False, None
            except (TypeError, ValueError, AttributeError):
                return False, None
    return False, None


def _compare_unguarded(gold: str, pred: str, want_integer: bool = False) -> MathCheck:
    gold_parsed = _parse_gold(gold)
    if not gold_parsed:
        raise DataError(
            f"gold answer {gold!r} cannot be parsed by math-verify; fix the data row "
            "(an unparseable gold answer is an error, never a free pass)"
        )
    pred_parsed = _parse(pred)
    if not pred_parsed:
        return MathCheck(equal=False, error="pred_unparseable")
    mv, _ = _mv()
    equal = bool(mv.verify(list(gold_parsed), pred_parsed, timeout_seconds=None, raise_on_error=False))
    check = MathCheck(equal=equal, value=str(pred_parsed[0]))
    if want_integer:
        check.is_integer, check.integer = _integer_of(pred_parsed)
    return check


def _can_use_signals() -> bool:
    return (
        os.name == "posix"
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    )


def _compare_in_process(gold: str, pred: str, timeout: float, want_integer: bool = False) -> MathCheck:
    fired = False
    active = True

    def _on_alarm(signum, frame):  # noqa: ARG001
        nonlocal fired
        if active:  # once we are unwinding, late re-fires are ignored
            fired = True
            raise _Deadline()

    previous = signal.signal(signal.SIGALRM, _on_alarm)
    # The interval re-fires the alarm every 50 ms after the deadline: code that swallows the
    # first exception with a bare ``except:`` is interrupted again until the call unwinds.
    signal.setitimer(signal.ITIMER_REAL, max(timeout, 1e-3), 0.05)
    try:
        result = _compare_unguarded(gold, pred, want_integer)
    except _Deadline:
        active = False
        result = MathCheck(equal=False, error="timeout")
    except DataError:
        active = False
        if not fired:
            raise
        # the deadline hit while the gold was parsed and something swallowed it
        result = MathCheck(equal=False, error="timeout")
    finally:
        active = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    if fired:
        return MathCheck(equal=False, error="timeout")
    return result


# ----------------------------------------------------------------------------- worker pool


class _Worker:
    def __init__(self) -> None:
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from anchored_reasoning.tasks.mathcheck import _worker_main; _worker_main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        self.fresh = True
        self._buffer = b""

    def ask(self, request: dict[str, Any], deadline: float) -> dict[str, Any] | None:
        """Send one request; the reply, or None if the deadline passed (the worker is then dead)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # worker died
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        self.fresh = False
        return json.loads(line)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        self.proc.wait()

    def alive(self) -> bool:
        return self.proc.poll() is None


class _Pool:
    """Idle workers are reused; each caller thread borrows one for one request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._all: list[_Worker] = []

    def borrow(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
            worker = _Worker()
            self._all.append(worker)
            return worker

    def give_back(self, worker: _Worker) -> None:
        with self._lock:
            self._idle.append(worker)

    def discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            if worker in self._all:
                self._all.remove(worker)

    def close(self) -> None:
        with self._lock:
            workers, self._all, self._idle = self._all, [], []
        for worker in workers:
            worker.kill()


_POOL = _Pool()
atexit.register(_POOL.close)


def _compare_in_worker(gold: str, pred: str, timeout: float, want_integer: bool = False) -> MathCheck:
    worker = _POOL.borrow()
    allowance = _STARTUP_ALLOWANCE if worker.fresh else 1.0
    reply = worker.ask({"gold": gold, "pred": pred, "timeout": timeout, "want_integer": want_integer}, time.monotonic() + timeout + allowance)
    if reply is None:
        logger.warning("math-verify worker missed its deadline (%.1fs); killed it", timeout)
        _POOL.discard(worker)
        return MathCheck(equal=False, error="timeout")
    _POOL.give_back(worker)
    if reply.get("gold_error"):
        raise DataError(reply["gold_error"])
    return MathCheck(**reply["result"])


def close_workers() -> None:
    """Stop the worker processes (they also die with this process)."""
    _POOL.close()


def check_math(
    gold: str,
    pred: str,
    timeout: float = DEFAULT_TIMEOUT,
    mode: str | None = None,
    want_integer: bool = False,
) -> MathCheck:
    """Is ``pred`` mathematically equal to ``gold``? Never hangs longer than about ``timeout``.

    With ``want_integer`` the result also says whether the parsed prediction is an integer
    (and which), for tasks whose answers must be integers in a range (AIME).

    ``mode`` is "auto" (default: in-process in the main thread, worker otherwise) or
    "process" (always a worker process with a kill-based deadline).
    """
    mode = mode or os.environ.get("ANCHORED_REASONING_MATH_ISOLATION", "auto")
    if mode not in ("auto", "process"):
        from anchored_reasoning.errors import ConfigError

        raise ConfigError(f"math isolation mode {mode!r} is not one of 'auto', 'process'")
    if mode == "auto" and _can_use_signals():
        return _compare_in_process(gold, pred, timeout, want_integer)
    return _compare_in_worker(gold, pred, timeout, want_integer)


def _worker_main() -> None:
    """Serve JSON-line requests on stdin: {"gold", "pred", "timeout"} -> {"result"} | {"gold_error"}."""
    _mv()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            result = _compare_in_process(
                request["gold"], request["pred"], float(request["timeout"]), bool(request.get("want_integer"))
            )
            reply: dict[str, Any] = {"result": result.__dict__}
        except DataError as exc:
            reply = {"gold_error": str(exc)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()

