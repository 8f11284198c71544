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
``unshare``  util-linux ``unshare``: new PID, network, IPC, UTS and mount namespaces; the host
             filesystem stays visible (read per normal permissions), /tmp is the work dir,
             /dev/shm and /var/tmp are private; as root, each program runs as a fresh uid (so it
             can write only world-writable places).
``plain``    no namespaces: rlimits, a fresh uid when root (and the interpreter is reachable),
             a best-effort in-interpreter network guard (an audit hook). Used only when neither of
             the above works; logged as a warning.

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
    SandboxConfig, ExecResult, SandboxPool, detect_layer(), sandbox_info(), shutdown()

Modules: ``config`` (SandboxConfig, ExecResult, shared constants), ``server`` (the programs that run
inside a worker sandbox and their protocol), ``layers`` (bwrap / unshare / plain: detection, start
commands, uid dropping, rlimits), ``worker`` (one worker sandbox, parent side), ``pool`` (worker pools,
run_program, run_programs). The package imports nothing from the rest of anchored-reasoning but
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
