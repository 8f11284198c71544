"""Run untrusted (model-written) Python programs, each in its own isolated, limited process.

This module is the ONLY place in anchored-reasoning where model-written code is executed.
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

Public API::

    run_program(source, config=None, **overrides) -> ExecResult
    run_programs(sources, config=None, workers=None, **overrides) -> list[ExecResult]
    SandboxConfig, ExecResult, SandboxPool, detect_layer(), sandbox_info(), shutdown()
"""
from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import logging
import math
import os
import secrets
import selectors
import shutil
import signal
import socket
import stat
import struct
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
# Where the work dir appears inside the namespaced layers (bwrap also gets a private, size-capped /tmp).
_BWRAP_WORKDIR = "/sandbox"
_UNSHARE_WORKDIR = "/tmp"
_PROGRAM_NAME = "program.py"
# Fresh uids for dropped privileges are drawn from [_UID_BASE, _UID_BASE + _UID_SPAN): far above
# any real account, so RLIMIT_NPROC counts only this run's processes and kill() reaches nothing else.
_UID_BASE = 1_000_000_000
_UID_SPAN = 1_000_000_000
# How long a worker may take to start the program's process before its own timeout begins.
_STARTUP_ALLOWANCE_S = 15.0


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


# --------------------------------------------------------------------------------------------
# The worker server that runs INSIDE the sandbox (its own interpreter, started once per worker).
# It receives one request at a time on the control socket (a length-prefixed JSON header plus
# the program's stdout, stderr and status pipes as SCM_RIGHTS), forks a fresh child per program,
# drops that child to the request's fresh uid, waits for it, kills every process left with that
# uid and (as a child subreaper) every descendant re-parented to it, empties the scratch dirs and
# answers with the exit status. The child: stdin /dev/null, rlimits, fresh uid,
# status pipe on fd 3 ("S" before the program, the nonce after its last statement), then exec of
# the program's code. argv: control_fd site_dirs; $AR_SCRATCH: private dirs to empty after each run.
# The interpreter starts with -I -S: no site module (processing .pth files costs ~70 ms).
# Nothing imported here may hold state a program could observe across runs (no random, no threads;
# traceback/linecache caches are only ever filled in the forked children).
_SERVER = r'''
import os, sys, socket, json, signal, struct
import traceback  # imported once here: most graded programs fail, and each would pay ~40 ms for it

def _recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf

def _no_new_privs():
    # PR_SET_NO_NEW_PRIVS: no exec (setuid-root binaries, file capabilities) can ever raise privileges.
    import ctypes
    if ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")

def _clear_capabilities():
    # setuid() to a non-root uid already emptied the permitted and effective sets; also empty the
    # inheritable one (bwrap --cap-add fills it) so no exec can ever pick a capability up again.
    try:
        import ctypes
        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
        class Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                        ("inheritable", ctypes.c_uint32)]
        ctypes.CDLL(None, use_errno=True).capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)())
    except Exception:
        pass

def _child(req, fds):
    import resource
    guard = req["guard"]
    module_name = req["name"]
    out, err, st = fds
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0); os.dup2(out, 1); os.dup2(err, 2); os.dup2(st, 3)
    os.closerange(4, 1 << 20)
    os.chdir(req["dir"])
    os.environ.clear(); os.environ.update(req["env"])
    for item in req["limits"].split(","):
        name, value = item.split("=")
        resource.setrlimit(getattr(resource, name), (int(value), int(value)))
    uid = req["uid"]
    if uid is not None:
        os.setgroups([]); os.setgid(uid); os.setuid(uid)
        _clear_capabilities()
    _no_new_privs()
    os.umask(0o077)
    nonce = req["nonce"].encode()
    del req
    os.write(3, b"S")
    me = os.getpid()
    if guard:
        def _no_network(event, args):
            if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
                         "socket.getaddrinfo", "socket.gethostbyname"):
                raise PermissionError("network access is disabled in the anchored-reasoning sandbox")
        sys.addaudithook(_no_network)
    path = os.path.abspath("program.py")
    module = type(sys)(module_name)
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
    os.write(3, nonce)
    os._exit(0)

def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return

def _children():
    me = os.getpid()
    try:
        with open("/proc/%d/task/%d/children" % (me, me)) as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        pass
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry, "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[1]) == me:
                        kids.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return kids

def _sweep(uid):
    if uid is not None:
        killer = os.fork()
        if killer == 0:
            try:
                os.setgroups([]); os.setgid(uid); os.setuid(uid)
                os.kill(-1, signal.SIGKILL)  # every process of this uid; atomic with respect to fork()
            finally:
                os._exit(0)
        os.waitpid(killer, 0)
    # This server is a child subreaper: whatever the program left (setsid, double fork) is
    # re-parented here. Kill and reap children until none is left.
    for _ in range(1000):
        kids = _children()
        if not kids:
            return
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in kids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass

def _scrub(dirs):
    import shutil
    for d in dirs:
        try:
            entries = os.listdir(d)
        except OSError:
            continue
        for name in entries:
            p = os.path.join(d, name)
            try:
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    os.unlink(p)
            except OSError:
                pass

try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
except Exception:
    pass
ctl = socket.socket(fileno=int(sys.argv[1]))
sys.path.extend(p for p in sys.argv[2].split(os.pathsep) if p)
scratch = [p for p in os.environ.get("AR_SCRATCH", "").split(os.pathsep) if p]
while True:
    # The pipes travel as SCM_RIGHTS with the first bytes of the request: read those with recv_fds.
    data, fds, _flags, _addr = socket.recv_fds(ctl, 1 << 16, 3)
    if not data:
        break
    rest = _recv_exact(ctl, max(0, 4 - len(data)))
    if rest is None:
        break
    data += rest
    size = struct.unpack("!I", data[:4])[0]
    rest = _recv_exact(ctl, max(0, 4 + size - len(data)))
    if rest is None or len(fds) != 3:
        break
    msg = (data + rest)[4:]
    req = json.loads(msg)
    _reap()
    pid = os.fork()
    if pid == 0:
        try:
            ctl.close()
            _child(req, fds)
        except BaseException:
            try:
                sys.stderr.write("sandbox: could not set up the program's process\n")
                traceback.print_exc(); sys.stderr.flush()
            finally:
                os._exit(120)
        finally:
            os._exit(120)
    for fd in fds:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    _sweep(req["uid"])
    _reap()
    _scrub(scratch)
    rc = os.waitstatus_to_exitcode(status)
    reply = json.dumps({"rc": rc}).encode()
    ctl.sendall(struct.pack("!I", len(reply)) + reply)
'''


# Runs as root inside the unshare layer's fresh mount namespace, then execs the interpreter.
# $1 work dir, $2 directory to hide ("" for none), $3 ':'-separated Python dirs to re-expose.
# Exports AR_SCRATCH: the private directories the worker server empties after every run.
_UNSHARE_SETUP = r'''
set -e
w="$1"; hide="$2"; pydirs="$3"; shift 3
mount --make-rprivate /
mount --bind "$w" /tmp
AR_SCRATCH=/tmp
for d in /dev/shm /var/tmp /run/lock; do
  if [ -d "$d" ] && mount -t tmpfs -o size=1m,mode=1777 tmpfs "$d" 2>/dev/null; then AR_SCRATCH="$AR_SCRATCH:$d"; fi
done
export AR_SCRATCH
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
    # Not realpath: a virtualenv's python is a symlink and finds its pyvenv.cfg through this path.
    return os.path.abspath(cfg.python or sys.executable)


@functools.lru_cache(maxsize=None)
def _python_layout(python: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(directories the interpreter needs, minimal and de-duplicated; its site-packages dirs)."""
    probe = subprocess.run(
        [python, "-I", "-c", "import sys, site; print(sys.prefix); print(sys.base_prefix); "
         "print(sys.exec_prefix); print('--'); print('\\n'.join(site.getsitepackages()))"],
        capture_output=True, text=True, timeout=30,
    )
    dirs = {os.path.dirname(python), os.path.dirname(os.path.realpath(python))}
    site_dirs: list[str] = []
    if probe.returncode == 0:
        prefixes, _, sites = probe.stdout.partition("--\n")
        dirs.update(os.path.realpath(p) for p in prefixes.split("\n") if p.strip())
        site_dirs = [p for p in sites.split("\n") if p.strip() and os.path.isdir(p)]
    keep = sorted(d for d in dirs if not any(d != o and d.startswith(o.rstrip("/") + "/") for o in dirs))
    return tuple(keep), tuple(site_dirs)


def _python_dirs(python: str) -> tuple[str, ...]:
    return _python_layout(python)[0]


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


# As root, bwrap keeps every capability by default; the worker server needs only these (switch
# uid, kill the run's processes, empty the scratch dirs the run's uid wrote to).
_SERVER_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_DAC_OVERRIDE", "CAP_FOWNER")


def _bwrap_base(python_dirs: Sequence[str], tmp_bytes: int = 16 << 20) -> list[str]:
    cmd = ["bwrap"]
    if not _is_root():
        cmd.append("--unshare-user")
    else:
        cmd += ["--cap-drop", "ALL"]
        for cap in _SERVER_CAPS:
            cmd += ["--cap-add", cap]
    cmd += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session",
            "--size", str(tmp_bytes), "--perms", "1777", "--tmpfs", "/tmp"]
    for d in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
              "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
              "/etc/passwd", "/etc/group", "/etc/nsswitch.conf"):
        cmd += ["--ro-bind-try", d, d]
    parents = sorted({str(a) for d in python_dirs for a in Path(d).parents if str(a) != "/"})
    for parent in parents:  # bwrap would copy the host's modes (e.g. /root 0700): the uid could not enter
        cmd += ["--perms", "0755", "--dir", parent]
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
            return _probe(_bwrap_base(_python_dirs(python)) + ["--bind", tmp, _BWRAP_WORKDIR, "--",
                                                               python, "-I", "-S", "-c", "pass"])
    if layer == "unshare":
        if shutil.which("unshare") is None:
            return False, "unshare (util-linux) not found"
        with tempfile.TemporaryDirectory(prefix="ar-sandbox-probe-") as tmp:
            os.chmod(tmp, 0o755)
            return _probe(_unshare_base() + ["--", "/bin/sh", "-c", _UNSHARE_SETUP, "sh", tmp, "", "",
                                             python, "-I", "-S", "-c", "pass"])
    raise ConfigError(f"unknown sandbox layer {layer!r}; choose one of {', '.join(LAYERS)}")


_logged_layers: set[str] = set()
_log_lock = threading.Lock()


def detect_layer(requested: str = "auto", python: str | None = None) -> str:
    """The isolation layer a run will use: the requested one, or the strongest available for "auto"."""
    python = os.path.abspath(python or sys.executable)
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
    """Whether programs will run as a fresh unprivileged uid (needs root, and the uid must reach Python)."""
    if not (cfg.drop_privileges and _is_root()):
        return False
    if layer == "bwrap":
        return True  # the sandbox's own filesystem view makes the interpreter reachable
    hidden = _untraversable_ancestor(_python_dirs(python))
    # unshare can re-expose one hidden directory; plain needs the interpreter reachable as it is.
    ok = hidden != "<multiple>" if layer == "unshare" else hidden is None
    if not ok:
        _warn_once(f"root-{layer}", "code sandbox: running as root but the %r layer cannot switch programs to "
                   "an unprivileged uid (the interpreter lives in a directory other users cannot enter); "
                   "programs run as root, see docs/sandbox.md", layer)
    return ok


def _warn_once(key: str, msg: str, *args: Any) -> None:
    with _log_lock:
        if key not in _logged_layers:
            _logged_layers.add(key)
            logger.warning(msg, *args)


# --------------------------------------------------------------------------------------------
# Worker sandboxes (parent side)

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
        "AR_SANDBOX_RUN": run_id,  # marks every process of the run (found by the sweeps and by tests)
    }


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _sweep_uid_from_outside(uid: int, python: str) -> None:
    """Plain layer: kill every process of ``uid`` (a helper switches to the uid and kills -1)."""
    try:
        subprocess.run([python, "-I", "-S", "-c", "import os; os.kill(-1, 9)"], user=uid, group=uid,
                       extra_groups=[], timeout=10, stdin=subprocess.DEVNULL, capture_output=True)
    except (OSError, subprocess.SubprocessError):
        pass


def _sweep_marker(run_id: str, pipe_fds: Sequence[int]) -> None:
    """Plain layer, after an abnormal end: kill processes that carry the run's environment marker
    (descendants that exec'd) or still hold its output pipes (forked descendants that left the group)."""
    marker = f"AR_SANDBOX_RUN={run_id}".encode()
    pipes = set()
    for fd in pipe_fds:
        try:
            pipes.add(f"pipe:[{os.fstat(fd).st_ino}]")
        except OSError:
            pass
    me = os.getpid()
    for _ in range(5):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            hit = False
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    hit = marker in f.read().split(b"\0")
                if not hit and pipes:
                    for fd in os.listdir(f"/proc/{entry}/fd"):
                        if os.readlink(f"/proc/{entry}/fd/{fd}") in pipes:
                            hit = True
                            break
                if hit:
                    os.kill(int(entry), signal.SIGKILL)
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
    buf += chunk[: max(budget[0], 0)]
    budget[0] -= len(chunk)
    return True


_SPAWNERS: dict[int, ThreadPoolExecutor] = {}


def _spawner() -> ThreadPoolExecutor:
    """A long-lived thread that starts every worker (one per process: threads do not survive fork)."""
    pid = os.getpid()
    with _POOLS_LOCK:
        if pid not in _SPAWNERS:
            _SPAWNERS[pid] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ar-sandbox-spawn")
        return _SPAWNERS[pid]


class _Worker:
    """One long-lived sandbox (bwrap / unshare / plain) with a server that forks a child per program."""

    def __init__(self, layer: str, python: str, site_packages: bool, work_root: str | None, tmp_mb: int) -> None:
        self.layer, self.python, self.site_packages, self.tmp_mb = layer, python, site_packages, tmp_mb
        self.work_root = work_root
        self.proc: subprocess.Popen | None = None
        self.ctl: socket.socket | None = None
        self.host_dir = ""
        self.inner_dir = ""
        self.log_path = ""

    # -- life cycle
    def _command(self, ctl_fd: int) -> list[str]:
        site_dirs = os.pathsep.join(_python_layout(self.python)[1]) if self.site_packages else ""
        server = [self.python, "-I", "-S", "-c", _SERVER, str(ctl_fd), site_dirs]
        if self.layer == "bwrap":
            return (_bwrap_base(_python_dirs(self.python), self.tmp_mb << 20)
                    + ["--bind", self.host_dir, _BWRAP_WORKDIR, "--chdir", _BWRAP_WORKDIR,
                       "--setenv", "AR_SCRATCH", f"{_BWRAP_WORKDIR}:/tmp", "--"] + server)
        if self.layer == "unshare":
            hide = _untraversable_ancestor(_python_dirs(self.python)) if _is_root() else None
            if hide == "<multiple>":
                hide = None
            pydirs = ":".join(_python_dirs(self.python)) if hide else ""
            return (_unshare_base() + ["--", "/bin/sh", "-c", _UNSHARE_SETUP, "sh", self.host_dir,
                                       hide or "", pydirs] + server)
        return server

    def start(self) -> None:
        self.host_dir = tempfile.mkdtemp(prefix="ar-sandbox-", dir=self.work_root)
        # Under unshare this dir IS the sandbox's /tmp, so it gets /tmp's mode (sticky, world-writable).
        os.chmod(self.host_dir, 0o1777 if self.layer == "unshare" else 0o755)
        self.inner_dir = {"bwrap": _BWRAP_WORKDIR, "unshare": _UNSHARE_WORKDIR}.get(self.layer, self.host_dir)
        fd, self.log_path = tempfile.mkstemp(prefix="ar-sandbox-worker-", suffix=".log")
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
        if self.layer == "plain":
            env["AR_SCRATCH"] = self.host_dir
        try:
            # Spawned from one long-lived thread: bwrap's --die-with-parent (PR_SET_PDEATHSIG) fires
            # when the spawning THREAD exits, which would kill the worker with a short-lived pool thread.
            self.proc = _spawner().submit(
                subprocess.Popen, self._command(child_sock.fileno()), stdin=subprocess.DEVNULL, stdout=fd,
                stderr=fd, pass_fds=(child_sock.fileno(),), start_new_session=True, cwd=self.host_dir, env=env,
            ).result()
        finally:
            child_sock.close()
            os.close(fd)
        self.ctl = parent_sock

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-2000:].decode("utf-8", "replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """Tear the whole sandbox down (everything in its PID namespace dies with it)."""
        if self.proc is not None:
            _kill_group(self.proc.pid)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            self.proc = None
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None
        if self.host_dir:
            _rmtree(self.host_dir)
            self.host_dir = ""
        if self.log_path:
            try:
                os.unlink(self.log_path)
            except OSError:
                pass
            self.log_path = ""

    # -- one program
    def run(self, source: str, cfg: SandboxConfig) -> ExecResult:
        start = time.monotonic()
        if not self.alive():
            self.kill()
            try:
                self.start()
            except OSError as exc:
                self.kill()
                return ExecResult("error", None, "", f"sandbox: could not start a {self.layer} worker: {exc}",
                                  time.monotonic() - start, self.layer)
        dropped = _will_drop(cfg, self.layer, self.python)
        uid = _UID_BASE + secrets.randbelow(_UID_SPAN) if dropped else None
        run_id = secrets.token_hex(8)
        nonce = secrets.token_hex(32)
        run_host = os.path.join(self.host_dir, f"run-{run_id}")
        run_inner = os.path.join(self.inner_dir, f"run-{run_id}")
        os.mkdir(run_host, 0o700)
        # surrogatepass: a lone surrogate becomes a SyntaxError inside the sandbox, not an error here.
        with open(os.path.join(run_host, _PROGRAM_NAME), "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(source)
        os.chmod(os.path.join(run_host, _PROGRAM_NAME), 0o644)
        if uid is not None:
            os.chown(run_host, uid, uid)
        request = json.dumps({
            "run": run_id, "dir": run_inner, "uid": uid, "limits": _rlimits(cfg, dropped),
            "nonce": nonce, "guard": cfg.network_guard, "env": _env(run_inner, run_id), "name": cfg.module_name,
        }).encode()

        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        st_r, st_w = os.pipe()
        try:
            try:
                socket.send_fds(self.ctl, [struct.pack("!I", len(request)) + request], [out_w, err_w, st_w])
            except OSError as exc:
                self.kill()
                return ExecResult("error", None, "", f"sandbox: the {self.layer} worker is gone ({exc})",
                                  time.monotonic() - start, self.layer, uid=uid, run_id=run_id)
            finally:
                for fd in (out_w, err_w, st_w):
                    os.close(fd)
            return self._collect(cfg, start, out_r, err_r, st_r, nonce.encode(), uid, run_id)
        finally:
            for fd in (out_r, err_r, st_r):
                os.close(fd)

    def _collect(self, cfg: SandboxConfig, start: float, out_r: int, err_r: int, st_r: int, nonce: bytes,
                 uid: int | None, run_id: str) -> ExecResult:
        out, err, status, reply = bytearray(), bytearray(), bytearray(), bytearray()
        budget = [cfg.max_output_bytes]
        bufs = {out_r: out, err_r: err, st_r: status}
        ctl_fd = self.ctl.fileno()
        sel = selectors.DefaultSelector()
        for fd in (out_r, err_r, st_r, ctl_fd):
            sel.register(fd, selectors.EVENT_READ)
        open_pipes = {out_r, err_r, st_r}
        # The clock starts when the program's process reports in (b"S"): a worker that is still
        # starting up (fresh sandbox, loaded machine) does not eat into the program's time.
        deadline = time.monotonic() + cfg.timeout_s + _STARTUP_ALLOWANCE_S
        clock_started = False
        outcome = ""  # "", "timeout", "output_limit", "worker_died"
        rc: int | None = None

        def pump(fd: int) -> None:
            alive = _read_into(fd, bufs[fd], [1 << 16] if fd == st_r else budget)
            if not alive:
                sel.unregister(fd)
                open_pipes.discard(fd)

        try:
            while rc is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    outcome = "timeout"
                    break
                for key, _ in sel.select(remaining):
                    if key.fd == ctl_fd:
                        try:
                            chunk = self.ctl.recv(4096)
                        except OSError:
                            chunk = b""
                        if not chunk:
                            outcome = "worker_died"
                            break
                        reply += chunk
                        if len(reply) >= 4 and len(reply) >= 4 + struct.unpack("!I", reply[:4])[0]:
                            rc = int(json.loads(reply[4:])["rc"])
                    else:
                        pump(key.fd)
                        if not clock_started and status:
                            clock_started = True
                            deadline = time.monotonic() + cfg.timeout_s
                if outcome:
                    break
                if budget[0] < 0:
                    outcome = "output_limit"
                    break
            if outcome:
                log = self.log_tail() if outcome == "worker_died" else ""
                # Abnormal end: tear the whole worker down (PID namespace: nothing survives), restart lazily.
                self.kill()
                if self.layer == "plain":
                    if uid is not None:
                        _sweep_uid_from_outside(uid, self.python)
                    _sweep_marker(run_id, (out_r, err_r, st_r))
            # Drain what the program wrote; every holder of the pipes is dead by now (bounded wait).
            sel.unregister(ctl_fd)
            grace = time.monotonic() + 2.0
            while open_pipes and time.monotonic() < grace:
                for key, _ in sel.select(0.05):
                    pump(key.fd)
        finally:
            sel.close()
        if budget[0] < 0 and outcome != "timeout":
            outcome = "output_limit"

        started = status.startswith(b"S")
        completed = bytes(status) == b"S" + nonce
        stderr = err.decode("utf-8", "replace")
        if outcome in ("timeout", "output_limit"):
            result = outcome
        elif outcome == "worker_died":
            result = "killed" if started else "error"
            stderr += "\nsandbox: the worker sandbox died during the run" + (f"; its log:\n{log}" if log else "")
        elif not started:
            result = "error"
            stderr += f"\nsandbox: the program did not start (exit status {rc})"
        elif rc == 0 and completed:
            result = "ok"
        elif rc == 0:
            result = "early_exit"
        elif rc is not None and rc < 0:
            result = "killed"
            try:
                stderr += f"\nsandbox: killed by {signal.Signals(-rc).name}"
            except ValueError:
                stderr += f"\nsandbox: killed by signal {-rc}"
        else:
            result = "failed"
        return ExecResult(status=result, returncode=rc, stdout=out.decode("utf-8", "replace"), stderr=stderr,
                          duration_s=time.monotonic() - start, layer=self.layer,
                          output_truncated=budget[0] < 0, uid=uid, run_id=run_id)


class SandboxPool:
    """Worker sandboxes, started on demand and reused: namespace and interpreter start-up are paid once
    per worker, and each program still runs in its own freshly forked process, as its own fresh uid.

    Thread-safe; ``run`` blocks only on the program itself. Use as a context manager or ``close()``.
    """

    def __init__(self, layer: str, python: str, site_packages: bool = True, work_root: str | None = None,
                 tmp_mb: int = 64) -> None:
        self.layer, self.python, self.site_packages = layer, python, site_packages
        self.work_root, self.tmp_mb = work_root, tmp_mb
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()  # a forked child must not drive (or kill) its parent's workers

    def run(self, source: str, cfg: SandboxConfig) -> ExecResult:
        with self._lock:
            if self._closed:
                raise ConfigError("this SandboxPool is closed; create a new one")
            if os.getpid() != self._pid:
                raise ConfigError("this SandboxPool belongs to the parent of this forked process; "
                                  "create a new SandboxPool (run_program/run_programs do so automatically)")
            worker = self._idle.pop() if self._idle else None
            if worker is None:
                worker = _Worker(self.layer, self.python, self.site_packages, self.work_root, self.tmp_mb)
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
    python = _python(cfg)
    layer = detect_layer(cfg.isolation, python)
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
