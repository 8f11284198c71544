"""One worker sandbox (parent side): starts the isolated server, sends it one program at a time, collects
the program's output and status under the time and output limits, and tears everything down after an
abnormal end (plain layer: sweeps by uid, environment marker and pipe ownership).
"""
from __future__ import annotations

import json
import os
import secrets
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from anchored_reasoning.sandbox.config import (
    SANDBOX_WORKDIR,
    PROGRAM_NAME,
    STARTUP_ALLOWANCE_S,
    UID_BASE,
    UID_SPAN,
    ExecResult,
    SandboxConfig,
)
from anchored_reasoning.sandbox.layers import (
    WORKER_PATH,
    bwrap_base,
    is_root,
    program_env,
    program_rlimits,
    python_dirs,
    python_layout,
    unshare_command,
    will_drop,
)
from anchored_reasoning.sandbox.server import SERVER


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
_SPAWN_LOCK = threading.Lock()


def _spawner() -> ThreadPoolExecutor:
    """A long-lived thread that starts every worker (one per process: threads do not survive fork)."""
    pid = os.getpid()
    with _SPAWN_LOCK:
        if pid not in _SPAWNERS:
            _SPAWNERS[pid] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ar-sandbox-spawn")
        return _SPAWNERS[pid]


class Worker:
    """One long-lived sandbox (bwrap / unshare / plain) with a server that forks a child per program."""

    def __init__(self, layer: str, python: str, site_packages: bool, work_root: str | None, tmp_mb: int) -> None:
        self.layer, self.python, self.site_packages, self.tmp_mb = layer, python, site_packages, tmp_mb
        self.work_root = work_root
        self.proc: subprocess.Popen | None = None
        self.ctl: socket.socket | None = None
        self.host_dir = ""
        self.root_dir = ""  # unshare: the mount point of the sandbox's own root (empty on the host)
        self.inner_dir = ""
        self.log_path = ""

    # -- life cycle
    def _command(self, ctl_fd: int) -> list[str]:
        site_dirs = os.pathsep.join(python_layout(self.python)[1]) if self.site_packages else ""
        server = [self.python, "-I", "-S", "-c", SERVER, str(ctl_fd), site_dirs]
        if self.layer == "bwrap":
            return (bwrap_base(python_dirs(self.python), self.tmp_mb << 20)
                    + ["--bind", self.host_dir, SANDBOX_WORKDIR, "--chdir", SANDBOX_WORKDIR,
                       "--setenv", "AR_SCRATCH", f"{SANDBOX_WORKDIR}:/tmp", "--"] + server)
        if self.layer == "unshare":
            return unshare_command(python_dirs(self.python), self.host_dir, self.root_dir, self.tmp_mb, server)
        return server

    def start(self) -> None:
        self.host_dir = tempfile.mkdtemp(prefix="ar-sandbox-", dir=self.work_root)
        os.chmod(self.host_dir, 0o755)
        if self.layer == "unshare":
            self.root_dir = tempfile.mkdtemp(prefix="ar-sandbox-root-", dir=self.work_root)
        self.inner_dir = SANDBOX_WORKDIR if self.layer in ("bwrap", "unshare") else self.host_dir
        fd, self.log_path = tempfile.mkstemp(prefix="ar-sandbox-worker-", suffix=".log")
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {"PATH": WORKER_PATH, "LANG": "C.UTF-8"}
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
        for attr in ("host_dir", "root_dir"):
            if getattr(self, attr):
                _rmtree(getattr(self, attr))
                setattr(self, attr, "")
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
        dropped = will_drop(cfg, self.layer, self.python)
        uid = UID_BASE + secrets.randbelow(UID_SPAN) if dropped else None
        run_id = secrets.token_hex(8)
        nonce = secrets.token_hex(32)
        run_host = os.path.join(self.host_dir, f"run-{run_id}")
        run_inner = os.path.join(self.inner_dir, f"run-{run_id}")
        os.mkdir(run_host, 0o700)
        # surrogatepass: a lone surrogate becomes a SyntaxError inside the sandbox, not an error here.
        with open(os.path.join(run_host, PROGRAM_NAME), "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(source)
        os.chmod(os.path.join(run_host, PROGRAM_NAME), 0o644)
        if uid is not None:
            os.chown(run_host, uid, uid)
        request = json.dumps({
            "run": run_id, "dir": run_inner, "uid": uid, "limits": program_rlimits(cfg, dropped),
            # unshare as a normal user: the program is uid 0 of the user namespace; it keeps no capability
            "clear_caps": self.layer != "plain" and not is_root(),
            "nonce": nonce, "guard": cfg.network_guard, "env": program_env(run_inner, run_id), "name": cfg.module_name,
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
        deadline = time.monotonic() + cfg.timeout_s + STARTUP_ALLOWANCE_S
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
