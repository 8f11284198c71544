"""What a sandboxed run may do (:class:`SandboxConfig`) and what happened to it (:class:`ExecResult`).

Also the constants the layers, the worker and the in-sandbox server agree on (where the work dir
appears, the program's file name, the range fresh uids are drawn from).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from anchored_reasoning.errors import ConfigError

LAYERS = ("bwrap", "unshare", "plain")
# Where the work dir appears inside the namespaced layers (both also get a private, size-capped /tmp).
SANDBOX_WORKDIR = "/sandbox"
PROGRAM_NAME = "program.py"
# Fresh uids for dropped privileges are drawn from [UID_BASE, UID_BASE + UID_SPAN): far above
# any real account, so RLIMIT_NPROC counts only this run's processes and kill() reaches nothing else.
UID_BASE = 1_000_000_000
UID_SPAN = 1_000_000_000
# How long a worker may take to start the program's process before its own timeout begins.
STARTUP_ALLOWANCE_S = 15.0


@dataclass(frozen=True)
class SandboxConfig:
    """Limits and isolation for one program run.

    ``timeout_s``: wall-clock limit; past it the program and everything it spawned are SIGKILLed.
    ``cpu_s``: RLIMIT_CPU (default ``ceil(timeout_s) + 1``). ``memory_mb``: RLIMIT_AS.
    ``file_size_mb``: RLIMIT_FSIZE (largest file the program may write).
    ``max_processes``: RLIMIT_NPROC for the program's uid (processes + threads; only enforced
    for a non-root uid, i.e. when privileges are dropped or the caller is not root).
    ``max_open_files``: RLIMIT_NOFILE. ``max_output_bytes``: stdout and stderr together; past it
    the program is killed (status ``output_limit``).
    ``isolation``: "auto" (strongest available; ``$ANCHORED_REASONING_SANDBOX`` may override),
    or one of "bwrap", "unshare", "plain" (ConfigError if unavailable).
    ``drop_privileges``: when running as root, run the program as a fresh unprivileged uid.
    ``allow_unisolated``: run programs even where they cannot be isolated (no namespaces, or root with no
    way to drop to an unprivileged uid). False by default: such runs are refused with UnisolatedCodeError
    before any program starts, unless this is set or ``$ANCHORED_REASONING_ALLOW_UNISOLATED_CODE=1``.
    ``network_guard``: also install an in-interpreter audit hook refusing socket connect/bind
    (the only network barrier in the ``plain`` layer; defence in depth elsewhere).
    ``site_packages``: let the program import installed third-party packages (numpy, ...): their
    directories are put on sys.path (``.pth`` files are not processed; the site module is not run).
    ``python``: interpreter to run (default: the current one).
    ``work_root``: where the throwaway work dirs are created (default: the system temp dir).
    ``module_name``: the program's ``__name__`` (HumanEval grading uses another name, as the
    reference harness does, so ``if __name__ == "__main__":`` demo blocks do not run).
    """

    timeout_s: float = 10.0
    cpu_s: float | None = None
    memory_mb: int = 1024
    file_size_mb: int = 16
    max_processes: int = 64
    max_open_files: int = 256
    max_output_bytes: int = 1 << 20
    isolation: str = "auto"
    drop_privileges: bool = True
    allow_unisolated: bool = False
    network_guard: bool = True
    site_packages: bool = True
    python: str | None = None
    work_root: str | None = None
    module_name: str = "__main__"

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ConfigError(f"SandboxConfig.timeout_s must be > 0 seconds, got {self.timeout_s!r}")
        if self.cpu_s is not None and not self.cpu_s > 0:
            raise ConfigError(f"SandboxConfig.cpu_s must be > 0 or None, got {self.cpu_s!r}")
        for name in ("memory_mb", "file_size_mb", "max_processes", "max_open_files", "max_output_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"SandboxConfig.{name} must be a positive integer, got {value!r}")
        if self.max_open_files < 16:
            raise ConfigError("SandboxConfig.max_open_files must be >= 16 (the interpreter itself needs some)")
        if not self.module_name.isidentifier():
            raise ConfigError(f"SandboxConfig.module_name must be a Python identifier, got {self.module_name!r}")
        if self.isolation not in ("auto", *LAYERS):
            raise ConfigError(
                f"SandboxConfig.isolation must be 'auto' or one of {', '.join(LAYERS)}, got {self.isolation!r}"
            )

    @property
    def cpu_limit_s(self) -> int:
        return int(math.ceil(self.cpu_s if self.cpu_s is not None else self.timeout_s + 1))


@dataclass
class ExecResult:
    """What happened to one program.

    ``status``: "ok" (ran to its last statement and exited 0, confirmed by the harness channel),
    "failed" (raised or exited non-zero), "early_exit" (exited 0 before reaching its end, e.g.
    ``sys.exit(0)`` / ``os._exit(0)``), "timeout", "output_limit", "killed" (by a signal, e.g. an
    rlimit), or "error" (the sandbox itself could not start the program; see ``stderr``).
    """

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    layer: str
    output_truncated: bool = False
    uid: int | None = None
    run_id: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def stderr_tail(self, n_chars: int = 2000) -> str:
        return self.stderr[-n_chars:]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
