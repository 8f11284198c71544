"""Run untrusted (model-written) Python programs, each in its own isolated, limited process.

This module is the ONLY place in anchored-reasoning where model-written code is executed.
Nothing here ever ``exec``s a program in the calling interpreter: every program is written to a
throwaway directory and run by a fresh Python interpreter inside the strongest isolation layer
this machine offers (see ``docs/sandbox.md`` for the exact guarantees of each layer):

``bwrap``    bubblewrap: new PID, network, IPC, UTS and mount namespaces; a minimal read-only
             filesystem (system libraries + the Python installation only) with the work dir as
             the only writable place (mounted at /tmp); as root, the program runs as a fresh
             unprivileged uid.
``unshare``  util-linux ``unshare``: new PID, network, IPC, UTS and mount namespaces; the host
             filesystem stays visible, but /tmp is the work dir, /dev/shm and /var/tmp are private
             and, as root, the program runs as a fresh unprivileged uid (so it can write only
             world-writable places).
``plain``    no namespaces: a new session, rlimits, a fresh uid when root, and a best-effort
             in-interpreter network guard (an audit hook). Used only when neither of the above
             works; logged as a warning.

Every layer applies rlimits (CPU seconds, address space, file size, processes, open files, no
core dumps), a wall-clock timeout that SIGKILLs the whole process tree, capped stdout/stderr and
a clean environment whose HOME and TMPDIR point into the work dir, deleted afterwards.

"Ran to the end" is decided by a channel the program cannot reach by accident: the harness
sends a fresh random nonce on stdin, then replaces stdin with /dev/null before the program
runs; the harness writes a start marker ``b"S"`` on a separate pipe before the program runs
and the nonce only after the program's last statement has returned. ``status == "ok"`` needs
exactly ``b"S" + nonce`` on that pipe AND exit code 0, so ``sys.exit(0)``, ``os._exit(0)``, a signal, an exception, or printing anything
to stdout are all failures.

Public API::

    run_program(source, config=None, **overrides) -> ExecResult
    run_programs(sources, config=None, workers=None, **overrides) -> list[ExecResult]
    SandboxConfig, ExecResult, detect_layer(), sandbox_info()
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from anchored_reasoning.errors import ConfigError

logger = logging.getLogger(__name__)

LAYERS = ("bwrap", "unshare", "plain")
# Where the work dir appears inside the namespaced layers.
_SANDBOX_WORKDIR = "/tmp"
_PROGRAM_NAME = "program.py"
# Fresh uids for dropped privileges are drawn from [_UID_BASE, _UID_BASE + _UID_SPAN): far above
# any real account, so RLIMIT_NPROC counts only this run's processes and kill() reaches nothing else.
_UID_BASE = 1_000_000_000
_UID_SPAN = 1_000_000_000
# Exit codes the in-sandbox harness uses for its own failures (before the program runs).
_HARNESS_SETUP_FAILED = 121


@dataclass(frozen=True)
class SandboxConfig:
    """Limits and isolation for one program run.

    ``timeout_s``: wall-clock limit; past it the whole process tree is SIGKILLed.
    ``cpu_s``: RLIMIT_CPU (default ``ceil(timeout_s) + 1``). ``memory_mb``: RLIMIT_AS.
    ``file_size_mb``: RLIMIT_FSIZE (largest file the program may write).
    ``max_processes``: RLIMIT_NPROC for the program's uid (processes + threads; only enforced
    for a non-root uid, i.e. when privileges are dropped or the caller is not root).
    ``max_open_files``: RLIMIT_NOFILE. ``max_output_bytes``: stdout and stderr together; past it
    the program is killed (status ``output_limit``).
    ``isolation``: "auto" (strongest available; ``$ANCHORED_REASONING_SANDBOX`` may override),
    or one of "bwrap", "unshare", "plain" (ConfigError if unavailable).
    ``drop_privileges``: when running as root, run the program as a fresh unprivileged uid.
    ``network_guard``: also install an in-interpreter audit hook refusing socket connect/bind
    (the only network barrier in the ``plain`` layer; defence in depth elsewhere).
    ``site_packages``: let the program import installed third-party packages (numpy, ...).
    ``python``: interpreter to run (default: the current one).
    ``work_root``: where the throwaway work dirs are created (default: the system temp dir).
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
    network_guard: bool = True
    site_packages: bool = True
    python: str | None = None
    work_root: str | None = None

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


# --------------------------------------------------------------------------------------------
# The harness that runs INSIDE the sandbox (a separate interpreter), before and after the program.
# argv: status_fd program_path rlimits guard. stdin: the nonce line, then EOF.
_HARNESS = r'''
import os, sys
def _harness():
    import resource
    fd = int(sys.argv[1]); path = sys.argv[2]; limits = sys.argv[3]; guard = sys.argv[4] == "1"
    nonce = b""
    while not nonce.endswith(b"\n"):
        chunk = os.read(0, 128)
        if not chunk:
            os._exit(121)
        nonce += chunk
    nonce = nonce.strip()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for item in limits.split(","):
        name, value = item.split("=")
        resource.setrlimit(getattr(resource, name), (int(value), int(value)))
    os.write(fd, b"S")
    child = os.fork()
    if child:
        # Supervisor: the program's parent (PID 1 of the namespace under unshare). Reaps orphans,
        # relays the program's exit status, and keeps the caller out of os.getppid()'s reach.
        os.close(fd)
        status = 0
        while True:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            if pid == child:
                break
        if os.WIFSIGNALED(status):
            os._exit(128 + os.WTERMSIG(status))
        os._exit(os.waitstatus_to_exitcode(status) & 255)
    me = os.getpid()
    if guard:
        def _no_network(event, args):
            if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
                         "socket.getaddrinfo", "socket.gethostbyname"):
                raise PermissionError("network access is disabled in the anchored-reasoning sandbox")
        sys.addaudithook(_no_network)
    import types, traceback
    module = types.ModuleType("__main__")
    module.__file__ = path
    sys.modules["__main__"] = module
    sys.argv = [path]
    try:
        with open(path, "rb") as f:
            code = compile(f.read(), path, "exec")
        exec(code, module.__dict__)
    except SystemExit as e:
        try:
            sys.stderr.write("sandbox: the program called exit(%r) before reaching its end\n" % (e.code,))
            sys.stdout.flush(); sys.stderr.flush()
        finally:
            os._exit(0 if e.code in (None, 0) else 1)
    except BaseException:
        try:
            traceback.print_exc(); sys.stdout.flush(); sys.stderr.flush()
        finally:
            os._exit(1)
    if os.getpid() != me:
        os._exit(1)
    try:
        sys.stdout.flush(); sys.stderr.flush()
    except BaseException:
        os._exit(1)
    os.write(fd, nonce)
    os._exit(0)
_harness()
'''

# Runs as root inside the unshare layer's fresh mount namespace, then execs the interpreter.
# $1 work dir, $2 directory to hide ("" for none), $3 ':'-separated Python dirs to re-expose.
_UNSHARE_SETUP = r'''
set -e
w="$1"; hide="$2"; pydirs="$3"; shift 3
mount --make-rprivate /
mount --bind "$w" /tmp
for d in /dev/shm /var/tmp /run/lock; do
  if [ -d "$d" ]; then mount -t tmpfs -o size=1m,mode=1777 tmpfs "$d" 2>/dev/null || true; fi
done
if [ -n "$hide" ]; then
  IFS=:; i=0
  for d in $pydirs; do mkdir -p "/tmp/.ar_stage$i"; mount --rbind "$d" "/tmp/.ar_stage$i"; i=$((i+1)); done
  mount -t tmpfs -o mode=0755 tmpfs "$hide"
  i=0
  for d in $pydirs; do
    mkdir -p "$d"; mount --move "/tmp/.ar_stage$i" "$d"; rmdir "/tmp/.ar_stage$i"
    mount -o remount,bind,ro "$d" 2>/dev/null || true; i=$((i+1))
  done
  unset IFS
fi
cd /tmp
exec "$@"
'''


# --------------------------------------------------------------------------------------------
# Layer detection

def _is_root() -> bool:
    return os.geteuid() == 0


def _python(cfg: SandboxConfig) -> str:
    return os.path.realpath(cfg.python or sys.executable)


@functools.lru_cache(maxsize=None)
def _python_dirs(python: str) -> tuple[str, ...]:
    """Directories the interpreter needs (prefix, base prefix, bin dir), minimal and de-duplicated."""
    probe = subprocess.run(
        [python, "-I", "-c", "import sys; print(sys.prefix); print(sys.base_prefix); print(sys.exec_prefix)"],
        capture_output=True, text=True, timeout=30,
    )
    dirs = {os.path.realpath(os.path.dirname(python))}
    if probe.returncode == 0:
        dirs.update(os.path.realpath(p) for p in probe.stdout.split("\n") if p.strip())
    keep = sorted(d for d in dirs if not any(d != o and d.startswith(o.rstrip("/") + "/") for o in dirs))
    return tuple(keep)


def _untraversable_ancestor(dirs: Sequence[str]) -> str | None:
    """The highest ancestor of ``dirs`` that other users cannot enter (e.g. /root for pyenv), if any."""
    found: set[str] = set()
    for d in dirs:
        parts = Path(d).parts
        for i in range(2, len(parts) + 1):
            p = str(Path(*parts[:i]))
            try:
                mode = os.stat(p).st_mode
            except OSError:
                break
            if not mode & stat.S_IXOTH:
                found.add(p)
                break
    if not found:
        return None
    if len(found) > 1:
        return "<multiple>"
    return found.pop()


def _bwrap_base(python_dirs: Sequence[str]) -> list[str]:
    cmd = ["bwrap"]
    if not _is_root():
        cmd.append("--unshare-user")
    cmd += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session"]
    for d in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
              "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
              "/etc/passwd", "/etc/group", "/etc/nsswitch.conf"):
        cmd += ["--ro-bind-try", d, d]
    for d in python_dirs:
        cmd += ["--ro-bind", d, d]
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    return cmd


def _unshare_base() -> list[str]:
    cmd = ["unshare"]
    if not _is_root():
        cmd += ["--user", "--map-root-user"]
    return cmd + ["--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc", "--uts"]


def _probe(cmd: list[str]) -> tuple[bool, str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    return proc.returncode == 0, proc.stderr.strip()[-300:]


@functools.lru_cache(maxsize=None)
def _layer_available(layer: str, python: str) -> tuple[bool, str]:
    if layer == "plain":
        return True, ""
    if layer == "bwrap":
        if shutil.which("bwrap") is None:
            return False, "bwrap not found (Debian/Ubuntu: apt-get install bubblewrap)"
        with tempfile.TemporaryDirectory(prefix="ar-sandbox-probe-") as tmp:
            return _probe(_bwrap_base(_python_dirs(python)) + ["--bind", tmp, "/tmp", "--", python, "-I", "-S", "-c", "pass"])
    if layer == "unshare":
        if shutil.which("unshare") is None:
            return False, "unshare (util-linux) not found"
        if _is_root() and shutil.which("setpriv") is None:
            return False, "setpriv (util-linux) not found"
        with tempfile.TemporaryDirectory(prefix="ar-sandbox-probe-") as tmp:
            return _probe(_unshare_base() + ["--", "/bin/sh", "-c", _UNSHARE_SETUP, "sh", tmp, "", "", "true"])
    raise ConfigError(f"unknown sandbox layer {layer!r}; choose one of {', '.join(LAYERS)}")


_logged_layers: set[str] = set()
_log_lock = threading.Lock()


def detect_layer(requested: str = "auto", python: str | None = None) -> str:
    """The isolation layer a run will use: the requested one, or the strongest available for "auto"."""
    python = os.path.realpath(python or sys.executable)
    if requested == "auto":
        requested = os.environ.get("ANCHORED_REASONING_SANDBOX", "auto") or "auto"
    if requested != "auto":
        if requested not in LAYERS:
            raise ConfigError(
                f"sandbox layer {requested!r} (from SandboxConfig.isolation or $ANCHORED_REASONING_SANDBOX) "
                f"is not one of auto, {', '.join(LAYERS)}"
            )
        ok, why = _layer_available(requested, python)
        if not ok:
            raise ConfigError(f"sandbox layer {requested!r} is not usable on this machine: {why}. "
                              "Use isolation='auto' to fall back to the strongest available layer.")
        chosen = requested
    else:
        chosen = "plain"
        reasons = []
        for layer in LAYERS[:-1]:
            ok, why = _layer_available(layer, python)
            if ok:
                chosen = layer
                break
            reasons.append(f"{layer}: {why}")
    with _log_lock:
        if chosen not in _logged_layers:
            _logged_layers.add(chosen)
            if chosen == "plain" and requested == "auto":
                logger.warning("code sandbox: no namespaces available (%s); using the 'plain' layer "
                               "(rlimits + process group only, see docs/sandbox.md)", "; ".join(reasons))
            else:
                logger.info("code sandbox: using the %r isolation layer", chosen)
    return chosen


def sandbox_info(config: SandboxConfig | None = None) -> dict[str, Any]:
    """What a run with ``config`` would use, for run metadata and logs."""
    cfg = config or SandboxConfig()
    python = _python(cfg)
    layer = detect_layer(cfg.isolation, python)
    return {
        "layer": layer,
        "drop_privileges": _will_drop(cfg, layer, python),
        "timeout_s": cfg.timeout_s,
        "cpu_s": cfg.cpu_limit_s,
        "memory_mb": cfg.memory_mb,
        "file_size_mb": cfg.file_size_mb,
        "max_processes": cfg.max_processes,
        "max_open_files": cfg.max_open_files,
        "max_output_bytes": cfg.max_output_bytes,
        "network_guard": cfg.network_guard,
        "python": python,
    }


def _will_drop(cfg: SandboxConfig, layer: str, python: str) -> bool:
    if not (cfg.drop_privileges and _is_root()):
        return False
    if layer == "bwrap":
        ok = shutil.which("setpriv") is not None
    else:
        hidden = _untraversable_ancestor(_python_dirs(python))
        # unshare can re-expose one hidden directory; plain needs the interpreter reachable as it is.
        ok = hidden != "<multiple>" if layer == "unshare" else hidden is None
    if not ok:
        _warn_once(f"root-{layer}", "code sandbox: running as root but cannot switch the %r layer to an "
                   "unprivileged uid (setpriv missing, or the interpreter lives in a directory other users "
                   "cannot enter); programs run as root, see docs/sandbox.md", layer)
    return ok


def _warn_once(key: str, msg: str, *args: Any) -> None:
    with _log_lock:
        if key not in _logged_layers:
            _logged_layers.add(key)
            logger.warning(msg, *args)


# --------------------------------------------------------------------------------------------
# Running

def _own_task_count() -> int:
    uid = os.getuid()
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    n += len(os.listdir(f"/proc/{entry}/task"))
            except OSError:
                pass
    return n


def _rlimits(cfg: SandboxConfig, dropped: bool) -> str:
    nproc = cfg.max_processes
    if not dropped and not _is_root():
        # Shared uid: RLIMIT_NPROC counts all of the caller's tasks, so allow the program this many more.
        nproc += _own_task_count()
    limits = {
        "RLIMIT_CPU": cfg.cpu_limit_s,
        "RLIMIT_AS": cfg.memory_mb * 1024 * 1024,
        "RLIMIT_FSIZE": cfg.file_size_mb * 1024 * 1024,
        "RLIMIT_NPROC": nproc,
        "RLIMIT_NOFILE": cfg.max_open_files,
        "RLIMIT_CORE": 0,
    }
    return ",".join(f"{k}={v}" for k, v in limits.items())


def _env(workdir: str, run_id: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "AR_SANDBOX_RUN": run_id,  # lets the plain layer find strays that left the process group
    }


def _build_command(cfg: SandboxConfig, layer: str, workdir: str, status_fd: int, uid: int | None,
                   python: str, limits: str) -> tuple[list[str], str]:
    """The argv and the in-sandbox work dir path."""
    inner_dir = workdir if layer == "plain" else _SANDBOX_WORKDIR
    py = [python, "-I"] + ([] if cfg.site_packages else ["-S"]) + [
        "-c", _HARNESS, str(status_fd), _PROGRAM_NAME, limits, "1" if cfg.network_guard else "0"]
    drop = ([] if uid is None else
            ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--"])
    if layer == "bwrap":
        cmd = _bwrap_base(_python_dirs(python)) + ["--bind", workdir, inner_dir, "--chdir", inner_dir, "--"]
        return cmd + drop + py, inner_dir
    if layer == "unshare":
        hide = _untraversable_ancestor(_python_dirs(python)) if uid is not None else None
        pydirs = ":".join(_python_dirs(python)) if hide else ""
        cmd = _unshare_base() + ["--", "/bin/sh", "-c", _UNSHARE_SETUP, "sh", workdir, hide or "", pydirs]
        return cmd + drop + py, inner_dir
    return py, inner_dir


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _sweep_strays(uid: int | None, run_id: str) -> None:
    """Plain layer only: kill processes that escaped the process group (setsid + double fork)."""
    marker = f"AR_SANDBOX_RUN={run_id}".encode()
    for _ in range(3):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            try:
                if uid is not None:
                    hit = os.stat(f"/proc/{entry}").st_uid == uid
                else:
                    with open(f"/proc/{entry}/environ", "rb") as f:
                        hit = marker in f.read().split(b"\0")
                if hit:
                    os.kill(pid, signal.SIGKILL)
                    found = True
            except OSError:
                continue
        if not found:
            break


def _rmtree(path: str) -> None:
    def onerror(func, p, _exc):  # a program may have made its own files read-only
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass
    shutil.rmtree(path, onerror=onerror)


def _read_into(fd: int, buf: bytearray, budget: list[int]) -> bool:
    """Read once from ``fd``; False at EOF. Keeps at most ``budget[0]`` more bytes overall."""
    try:
        chunk = os.read(fd, 65536)
    except BlockingIOError:
        return True
    except OSError:
        return False
    if not chunk:
        return False
    keep = chunk[: max(budget[0], 0)]
    buf += keep
    budget[0] -= len(chunk)
    return True


def run_program(source: str, config: SandboxConfig | None = None, **overrides: Any) -> ExecResult:
    """Run ``source`` as a Python program in the sandbox and report what happened.

    ``overrides`` are SandboxConfig fields (``timeout_s=3``, ``memory_mb=512``, ...) applied on top
    of ``config``. Never raises for anything the program does; ConfigError for a bad config.
    """
    cfg = dataclasses.replace(config or SandboxConfig(), **overrides) if overrides else (config or SandboxConfig())
    python = _python(cfg)
    layer = detect_layer(cfg.isolation, python)
    dropped = _will_drop(cfg, layer, python)
    uid = _UID_BASE + secrets.randbelow(_UID_SPAN) if dropped else None
    run_id = secrets.token_hex(8)
    nonce = secrets.token_hex(32).encode()
    start = time.monotonic()

    workdir = tempfile.mkdtemp(prefix="ar-sandbox-", dir=cfg.work_root)
    status_r = status_w = -1
    proc: subprocess.Popen | None = None
    try:
        prog = os.path.join(workdir, _PROGRAM_NAME)
        with open(prog, "w", encoding="utf-8") as f:
            f.write(source)
        os.chmod(prog, 0o644)
        os.chmod(workdir, 0o700)
        if uid is not None:
            os.chown(workdir, uid, uid)

        status_r, status_w = os.pipe()
        limits = _rlimits(cfg, dropped)
        cmd, inner_dir = _build_command(cfg, layer, workdir, status_w, uid, python, limits)
        popen_kw: dict[str, Any] = {}
        if layer == "plain" and uid is not None:
            popen_kw.update(user=uid, group=uid, extra_groups=[])
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(status_w,), start_new_session=True, cwd=workdir,
                env=_env(inner_dir, run_id), **popen_kw,
            )
        except OSError as exc:
            return ExecResult("error", None, "", f"sandbox: could not start {cmd[0]}: {exc}",
                              time.monotonic() - start, layer, uid=uid, run_id=run_id)
        os.close(status_w)
        status_w = -1
        try:
            proc.stdin.write(nonce + b"\n")
            proc.stdin.close()
        except OSError:
            pass

        out, err, status = bytearray(), bytearray(), bytearray()
        budget = [cfg.max_output_bytes]
        timed_out = over_output = exited = False
        deadline = start + cfg.timeout_s
        sel = selectors.DefaultSelector()
        streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
        for fd in streams:
            sel.register(fd, selectors.EVENT_READ)
        sel.register(status_r, selectors.EVENT_READ)
        pidfd = -1
        try:
            pidfd = os.pidfd_open(proc.pid)
            sel.register(pidfd, selectors.EVENT_READ)
        except (AttributeError, OSError):
            pidfd = -1
        open_fds = set(streams) | {status_r}

        def leader_exited() -> bool:
            try:
                info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return True
            return info is not None

        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            events = sel.select(min(remaining, 0.05) if pidfd < 0 else remaining)
            for key, _ in events:
                fd = key.fd
                if fd == pidfd:
                    exited = True
                    sel.unregister(fd)
                    continue
                target = status if fd == status_r else streams[fd]
                if fd == status_r:
                    alive = _read_into(fd, target, [1 << 16])
                else:
                    alive = _read_into(fd, target, budget)
                if not alive:
                    sel.unregister(fd)
                    open_fds.discard(fd)
            if budget[0] < 0:
                over_output = True
                break
            if exited or (pidfd < 0 and leader_exited()):
                exited = True
                break
        # The leader exited (or must die): kill the tree before reaping so its pgid cannot be reused.
        pgid = proc.pid
        _kill_group(pgid)
        if layer == "plain":
            _sweep_strays(uid, run_id)
        # Drain until every holder of the pipes is gone (namespace torn down), at most 2 s.
        grace = time.monotonic() + 2.0
        while open_fds and time.monotonic() < grace:
            for key, _ in sel.select(0.05):
                if key.fd == pidfd:
                    sel.unregister(pidfd)
                    continue
                fd = key.fd
                target = status if fd == status_r else streams[fd]
                if not _read_into(fd, target, [1 << 16] if fd == status_r else budget):
                    sel.unregister(fd)
                    open_fds.discard(fd)
        if budget[0] < 0 and not timed_out:
            over_output = True
        sel.close()
        if pidfd >= 0:
            os.close(pidfd)
        try:
            rc = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _kill_group(pgid)
            rc = proc.wait()
        duration = time.monotonic() - start

        started = status.startswith(b"S")
        completed = bytes(status) == b"S" + nonce
        if timed_out:
            result = "timeout"
        elif over_output:
            result = "output_limit"
        elif not started:
            result = "error"
        elif rc == 0 and completed:
            result = "ok"
        elif rc == 0:
            result = "early_exit"
        elif rc < 0 or rc > 128:
            result = "killed"
        else:
            result = "failed"
        stderr_text = err.decode("utf-8", "replace")
        if result == "error" and rc == _HARNESS_SETUP_FAILED:
            stderr_text += "\nsandbox: the harness did not receive its nonce"
        if result == "killed":
            sig = -rc if rc < 0 else rc - 128
            try:
                stderr_text += f"\nsandbox: killed by {signal.Signals(sig).name}"
            except ValueError:
                stderr_text += f"\nsandbox: exit status {rc}"
        return ExecResult(
            status=result, returncode=rc, stdout=out.decode("utf-8", "replace"), stderr=stderr_text,
            duration_s=duration, layer=layer, output_truncated=budget[0] < 0, uid=uid, run_id=run_id,
        )
    finally:
        if proc is not None and proc.poll() is None:
            _kill_group(proc.pid)
            proc.wait()
        for fd in (status_r, status_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        if proc is not None:
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        _rmtree(workdir)


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


def run_programs(sources: Sequence[str], config: SandboxConfig | None = None, *,
                 workers: int | None = None, **overrides: Any) -> list[ExecResult]:
    """Run many programs in parallel worker threads (each program still gets its own sandbox).

    Results come back in the order of ``sources``. ``workers`` defaults to the CPU count.
    """
    cfg = dataclasses.replace(config or SandboxConfig(), **overrides) if overrides else (config or SandboxConfig())
    detect_layer(cfg.isolation, _python(cfg))  # probe once, before the threads start
    n = min(workers or default_workers(), max(1, len(sources)))
    if n <= 1:
        return [run_program(s, cfg) for s in sources]
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="ar-sandbox") as pool:
        return list(pool.map(lambda s: run_program(s, cfg), sources))
