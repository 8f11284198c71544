"""Worker sandboxes shared by many programs (:class:`SandboxPool`), one pool per layer and interpreter in
each process, and the two calls most code needs: :func:`run_program` and :func:`run_programs`.
"""
from __future__ import annotations

import atexit
import dataclasses
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from anchored_reasoning.errors import ConfigError, UnisolatedCodeError
from anchored_reasoning.sandbox.config import ExecResult, SandboxConfig
from anchored_reasoning.sandbox.layers import interpreter
from anchored_reasoning.sandbox.policy import require_isolation, sandbox_info
from anchored_reasoning.sandbox.worker import Worker


class SandboxPool:
    """Worker sandboxes, started on demand and reused: namespace and interpreter start-up are paid once
    per worker, and each program still runs in its own freshly forked process, as its own fresh uid.

    Thread-safe; ``run`` blocks only on the program itself. Use as a context manager or ``close()``.
    ``run`` refuses (UnisolatedCodeError) where the pool's layer cannot isolate programs, unless opted in.
    """

    def __init__(self, layer: str, python: str, site_packages: bool = True, work_root: str | None = None,
                 tmp_mb: int = 64) -> None:
        self.layer, self.python, self.site_packages = layer, python, site_packages
        self.work_root, self.tmp_mb = work_root, tmp_mb
        self._idle: list[Worker] = []
        self._all: set[Worker] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()  # a forked child must not drive (or kill) its parent's workers

    def run(self, source: str, cfg: SandboxConfig) -> ExecResult:
        require_isolation(dataclasses.replace(cfg, isolation=self.layer, python=self.python, work_root=self.work_root))
        with self._lock:
            if self._closed:
                raise ConfigError("this SandboxPool is closed; create a new one")
            if os.getpid() != self._pid:
                raise ConfigError("this SandboxPool belongs to the parent of this forked process; "
                                  "create a new SandboxPool (run_program/run_programs do so automatically)")
            worker = self._idle.pop() if self._idle else None
            if worker is None:
                worker = Worker(self.layer, self.python, self.site_packages, self.work_root, self.tmp_mb)
                self._all.add(worker)
        try:
            return worker.run(source, cfg)
        except BaseException:
            worker.kill()
            raise
        finally:
            with self._lock:
                if self._closed:
                    worker.kill()
                else:
                    self._idle.append(worker)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers, self._all, self._idle = list(self._all), set(), []
        if os.getpid() != self._pid:
            return  # inherited through fork: the parent still owns these workers
        for w in workers:
            w.kill()

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_POOLS: dict[tuple, SandboxPool] = {}
_POOLS_LOCK = threading.Lock()


def _pool_for(cfg: SandboxConfig) -> SandboxPool:
    python = interpreter(cfg)
    layer = require_isolation(cfg).layer  # fail closed: before any program of this config runs
    key = (os.getpid(), layer, python, cfg.site_packages, cfg.work_root)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = SandboxPool(layer, python, cfg.site_packages, cfg.work_root)
        return pool


def shutdown() -> None:
    """Stop every worker sandbox this process started (also runs at interpreter exit)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.close()


atexit.register(shutdown)


def _resolve(config: SandboxConfig | None, overrides: dict[str, Any]) -> SandboxConfig:
    cfg = config or SandboxConfig()
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


def run_program(source: str, config: SandboxConfig | None = None, **overrides: Any) -> ExecResult:
    """Run ``source`` as a Python program in the sandbox and report what happened.

    ``overrides`` are SandboxConfig fields (``timeout_s=3``, ``memory_mb=512``, ...) applied on top
    of ``config``. Never raises for anything the program does; ConfigError for a bad config.
    """
    cfg = _resolve(config, overrides)
    return _pool_for(cfg).run(source, cfg)


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


def run_programs(sources: Sequence[str], config: SandboxConfig | None = None, *,
                 workers: int | None = None, **overrides: Any) -> list[ExecResult]:
    """Run many programs on ``workers`` parallel worker sandboxes (default: the CPU count).

    Results come back in the order of ``sources``; each program runs in its own process.
    """
    cfg = _resolve(config, overrides)
    pool = _pool_for(cfg)
    n = min(workers or default_workers(), max(1, len(sources)))
    if n <= 1:
        return [pool.run(s, cfg) for s in sources]
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="ar-sandbox") as executor:
        return list(executor.map(lambda s: pool.run(s, cfg), sources))


# Needs a stdlib module that is not preloaded (read from the interpreter's directory as the program's uid).
_CANARY = "import os, fractions\nprint(os.geteuid(), fractions.Fraction(1, 2))\n"


def preflight(config: SandboxConfig | None = None) -> dict[str, Any]:
    """Check, before a job produces any model-written code, that its programs will run isolated here.

    Raises UnisolatedCodeError (what is missing, every layer tried, how to opt in) when they would not be
    and the user has not opted in; then runs one known program in the sandbox and raises ConfigError if
    it does not work (e.g. the fresh uid cannot read the interpreter) and UnisolatedCodeError if it ran as
    root where a fresh uid was promised. Returns :func:`sandbox_info`.
    Entry points that grade by execution (evaluation of a code task, GRPO with code rewards) call this.
    """
    cfg = config or SandboxConfig()
    iso = require_isolation(cfg)
    result = run_program(_CANARY, cfg)
    if result.status != "ok" or not result.stdout.strip().endswith("1/2"):
        raise ConfigError(f"code sandbox: a trivial program failed on the {iso.layer!r} layer (status "
                          f"{result.status!r}); programs could not be graded. Its output: "
                          f"{(result.stdout + result.stderr).strip()[-1500:]!r}")
    if iso.fresh_uid and result.stdout.split()[0] == "0":
        raise UnisolatedCodeError(f"code sandbox: a program ran as root on the {iso.layer!r} layer although it "
                                  "should have run as a fresh unprivileged uid; refusing to grade code")
    return sandbox_info(cfg)
