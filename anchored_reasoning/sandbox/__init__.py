"""Run untrusted (model-written) Python programs, each in its own isolated, limited process.

This package is the ONLY place in anchored-reasoning where model-written code is executed.
Nothing here ever ``exec``s a program in the calling interpreter. Programs run inside *worker
sandboxes*: long-lived isolated processes, one per parallel worker, each holding a small server
(a separate Python interpreter) that forks a FRESH child process per program. Namespace and
interpreter start-up are paid once per worker; every program still gets its own process, its own
fresh uid, its own work dir and its own limits. The isolation layer is the strongest this machine
offers (exact guarantees per layer in ``docs/sandbox.md``):

``bwrap``    bubblewrap: new PID, network, IPC, UTS, cgroup and mount namespaces; a minimal
             read-only filesystem (system libraries + the Python installation only), a private
             size-capped /tmp, the work dir at /sandbox; as root, each program runs as a fresh
             unprivileged uid.
``unshare``  util-linux ``unshare``: the same namespaces (no cgroup ns) and the same filesystem view,
             built by a setup script (a tmpfs root with read-only binds, then ``pivot_root``); as root,
             each program runs as a fresh uid; as a normal user, as uid 0 of a user namespace with
             every capability dropped.
``plain``    no namespaces: rlimits, a fresh uid when root (and the interpreter and work dir are
             reachable by other users), a best-effort in-interpreter network guard (an audit hook).

The interpreter's directories are bound read-only at their own paths under parents the fresh uid can
enter, so a virtualenv under /tmp or pyenv under a 0700 /root work on both namespaced layers.
**Fail closed** (``policy``): where programs would not be isolated (``plain`` as a normal user, or root
with no way to a fresh uid), every run raises ``UnisolatedCodeError`` before the first program starts,
unless the user opted in (``SandboxConfig(allow_unisolated=True)``,
``$ANCHORED_REASONING_ALLOW_UNISOLATED_CODE=1``, ``anchored-reasoning eval --confirm-run-unsafe-code``).
``preflight()`` checks that before a job generates anything.

Every layer applies rlimits (CPU seconds, address space, file size, processes, open files, no
core dumps), a wall-clock timeout, capped stdout/stderr and a clean environment whose HOME and
TMPDIR are the run's own directory. After every program the server kills everything it left:
all processes of its uid (``kill(-1)`` as that uid) and, as a child subreaper, every descendant
that was re-parented to it (``setsid`` + double fork); scratch dirs are emptied. On a timeout or
an output flood the whole worker sandbox is torn down (its PID namespace with it) and restarted
on demand.

"Ran to the end" is decided by a channel the program cannot reach by accident: the parent sends
a fresh random nonce with the request; the program's process writes a start marker ``b"S"`` on a
dedicated status pipe (fd 3) before the program runs and the nonce only after the program's last
statement has returned. ``status == "ok"`` needs exactly ``b"S" + nonce`` on that pipe AND exit
code 0, so ``sys.exit(0)``, ``os._exit(0)``, a signal, an exception, or printing anything to
stdout are all failures.

Public API (everything else is internal)::

    run_program(source, config=None, **overrides) -> ExecResult
    run_programs(sources, config=None, workers=None, **overrides) -> list[ExecResult]
    preflight(config=None) -> dict        (UnisolatedCodeError where programs would not be isolated)
    SandboxConfig, ExecResult, SandboxPool, detect_layer(), assess(), sandbox_info(), shutdown()

Modules: ``config`` (SandboxConfig, ExecResult, shared constants), ``server`` (the programs that run
inside a worker sandbox and their protocol), ``layers`` (bwrap / unshare / plain: detection, start
commands, uid dropping, rlimits), ``policy`` (what counts as isolated, the refusal, the opt-in),
``worker`` (one worker sandbox, parent side), ``pool`` (worker pools, run_program, run_programs, preflight). The package imports nothing from the rest of anchored-reasoning but
``errors``: task code (HumanEval grading, ``anchored_reasoning.tasks.code_exec``) builds programs and
hands them here.
"""
from __future__ import annotations

from anchored_reasoning.sandbox.config import LAYERS, ExecResult, SandboxConfig
from anchored_reasoning.sandbox.layers import detect_layer
from anchored_reasoning.sandbox.policy import ALLOW_ENV, assess, sandbox_info
from anchored_reasoning.sandbox.pool import SandboxPool, default_workers, preflight, run_program, run_programs, shutdown

__all__ = [
    "ALLOW_ENV",
    "LAYERS",
    "ExecResult",
    "SandboxConfig",
    "assess",
    "SandboxPool",
    "default_workers",
    "detect_layer",
    "preflight",
    "run_program",
    "run_programs",
    "sandbox_info",
    "shutdown",
]
