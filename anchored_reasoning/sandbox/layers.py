"""The isolation layers (bwrap, unshare, plain): which ones this machine offers, the command that starts a
worker sandbox in each, whether programs can run as a fresh uid, and the rlimits and environment every
program's process gets. Whether that isolates programs (and the refusal when not): ``policy``.
Guarantees per layer: ``docs/sandbox.md``.
"""
from __future__ import annotations

import functools
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Sequence

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.sandbox.config import SANDBOX_WORKDIR, LAYERS, SandboxConfig
from anchored_reasoning.sandbox.server import UNSHARE_SETUP

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Layer detection

def is_root() -> bool:
    return os.geteuid() == 0


def interpreter(cfg: SandboxConfig) -> str:
    # Not realpath: a virtualenv's python is a symlink and finds its pyvenv.cfg through this path.
    return os.path.abspath(cfg.python or sys.executable)


@functools.lru_cache(maxsize=None)
def python_layout(python: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(directories the interpreter needs, minimal and de-duplicated; its site-packages dirs).

    The namespaced layers bind exactly these read-only into the sandbox's own root, wherever they live
    (a virtualenv under /tmp, pyenv under a 0700 /root)."""
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
        dirs.update(site_dirs)
    keep = sorted(d for d in dirs if not any(d != o and d.startswith(o.rstrip("/") + "/") for o in dirs))
    return tuple(keep), tuple(site_dirs)


def python_dirs(python: str) -> tuple[str, ...]:
    return python_layout(python)[0]


def untraversable_ancestor(dirs: Sequence[str]) -> str | None:
    """The highest ancestor of ``dirs`` (or one of ``dirs`` itself) that other users cannot enter (e.g.
    /root for pyenv), if any; "<multiple>" when there are several."""
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


def _unreadable(dirs: Sequence[str]) -> str | None:
    """The first of ``dirs`` that other users cannot list and enter (its own mode, not its parents')."""
    for d in dirs:
        try:
            if os.stat(d).st_mode & (stat.S_IROTH | stat.S_IXOTH) != (stat.S_IROTH | stat.S_IXOTH):
                return d
        except OSError:
            return d
    return None


def fresh_uid_blocker(layer: str, python: str, work_root: str | None) -> str:
    """Why programs could not run as a fresh unprivileged uid on ``layer`` ("" when they can).

    bwrap and unshare give the sandbox its own root in which the interpreter's directories are bound at
    paths whose parents are 0755, so only those directories' own modes matter; ``plain`` sees the host's
    filesystem, so the uid must also be able to walk to the interpreter and to the work dir."""
    dirs = python_dirs(python)
    hidden = _unreadable(dirs)
    if hidden:
        return f"the interpreter's directory {hidden} is not readable by other users"
    if layer in ("bwrap", "unshare"):
        return ""
    blocked = untraversable_ancestor(dirs)
    if blocked:
        where = "several of its parent directories" if blocked == "<multiple>" else blocked
        return (f"other users cannot enter {where}, which holds the interpreter "
                f"({', '.join(dirs)})")
    root = os.path.abspath(work_root or tempfile.gettempdir())
    blocked = untraversable_ancestor([root])
    if blocked:
        return f"other users cannot enter {blocked}, which holds the sandbox's work dir {root}"
    return ""


# As root, bwrap keeps every capability by default; the worker server needs only these (switch
# uid, kill the run's processes, empty the scratch dirs the run's uid wrote to).
_SERVER_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_DAC_OVERRIDE", "CAP_FOWNER")


# Read-only system files every namespaced sandbox sees (plus the interpreter's own directories).
SYSTEM_RO = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
             "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
             "/etc/passwd", "/etc/group", "/etc/nsswitch.conf")
# PATH of the command that starts a worker (pivot_root lives in /usr/sbin).
WORKER_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"


def bwrap_base(python_dirs: Sequence[str], tmp_bytes: int = 16 << 20) -> list[str]:
    cmd = ["bwrap"]
    if not is_root():
        cmd.append("--unshare-user")
    else:
        cmd += ["--cap-drop", "ALL"]
        for cap in _SERVER_CAPS:
            cmd += ["--cap-add", cap]
    cmd += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session",
            "--size", str(tmp_bytes), "--perms", "1777", "--tmpfs", "/tmp"]
    for d in SYSTEM_RO:
        cmd += ["--ro-bind-try", d, d]
    parents = sorted({str(a) for d in python_dirs for a in Path(d).parents if str(a) != "/"})
    for parent in parents:  # bwrap would copy the host's modes (e.g. /root 0700): the uid could not enter
        cmd += ["--perms", "0755", "--dir", parent]
    for d in python_dirs:
        cmd += ["--ro-bind", d, d]
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    return cmd


def unshare_base() -> list[str]:
    cmd = ["unshare"]
    if not is_root():
        cmd += ["--user", "--map-root-user"]
    return cmd + ["--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc", "--uts"]


def unshare_command(python_dirs: Sequence[str], work_dir: str, root_dir: str, tmp_mb: int,
                    command: Sequence[str]) -> list[str]:
    """``command`` in the unshare layer: new namespaces, then UNSHARE_SETUP builds a fresh root on a tmpfs at
    ``root_dir`` (system dirs and ``python_dirs`` read-only, ``work_dir`` at /sandbox, a private /tmp)."""
    binds = [d for d in SYSTEM_RO if not any(d == p or d.startswith(p.rstrip("/") + "/") for p in python_dirs)]
    return (unshare_base() + ["--", "/bin/sh", "-c", UNSHARE_SETUP, "sh", work_dir, root_dir, str(tmp_mb),
                              *binds, *python_dirs, "--", *command])


def _probe(cmd: list[str]) -> tuple[bool, str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL,
                              env={"PATH": WORKER_PATH, "LANG": "C.UTF-8"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    return proc.returncode == 0, proc.stderr.strip()[-300:]


@functools.lru_cache(maxsize=None)
def layer_available(layer: str, python: str) -> tuple[bool, str]:
    if layer == "plain":
        return True, ""
    if layer == "bwrap":
        if shutil.which("bwrap") is None:
            return False, "bwrap not found (Debian/Ubuntu: apt-get install bubblewrap)"
        with tempfile.TemporaryDirectory(prefix="ar-sandbox-probe-") as tmp:
            return _probe(bwrap_base(python_dirs(python)) + ["--bind", tmp, SANDBOX_WORKDIR, "--",
                                                               python, "-I", "-S", "-c", "pass"])
    if layer == "unshare":
        missing = [tool for tool in ("unshare", "mount", "pivot_root", "umount") if shutil.which(tool, path=WORKER_PATH) is None]
        if missing:
            return False, f"{', '.join(missing)} (util-linux) not found"
        with tempfile.TemporaryDirectory(prefix="ar-sandbox-probe-") as tmp:
            os.mkdir(os.path.join(tmp, "work"))
            os.mkdir(os.path.join(tmp, "root"))
            cmd = unshare_command(python_dirs(python), os.path.join(tmp, "work"), os.path.join(tmp, "root"), 1,
                                  [python, "-I", "-S", "-c", "pass"])
            return _probe(cmd)
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
        ok, why = layer_available(requested, python)
        if not ok:
            raise ConfigError(f"sandbox layer {requested!r} is not usable on this machine: {why}. "
                              "Use isolation='auto' to fall back to the strongest available layer.")
        chosen = requested
    else:
        chosen = "plain"
        reasons = []
        for layer in LAYERS[:-1]:
            ok, why = layer_available(layer, python)
            if ok:
                chosen = layer
                break
            reasons.append(f"{layer}: {why}")
    with _log_lock:
        if chosen not in _logged_layers:
            _logged_layers.add(chosen)
            if chosen == "plain" and requested == "auto":
                logger.warning("code sandbox: no namespaces available (%s); using the 'plain' layer, which "
                               "isolates programs only through a fresh uid as root (see docs/sandbox.md)",
                               "; ".join(reasons))
            else:
                logger.info("code sandbox: using the %r isolation layer", chosen)
    return chosen


def will_drop(cfg: SandboxConfig, layer: str, python: str) -> bool:
    """Whether programs will run as a fresh unprivileged uid (needs root, and the uid must reach Python)."""
    if not (cfg.drop_privileges and is_root()):
        return False
    return not fresh_uid_blocker(layer, python, cfg.work_root)


# --------------------------------------------------------------------------------------------
# What each program's process gets: rlimits and environment

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


def program_rlimits(cfg: SandboxConfig, dropped: bool) -> str:
    nproc = cfg.max_processes
    if not dropped and not is_root():
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


def program_env(workdir: str, run_id: str) -> dict[str, str]:
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
