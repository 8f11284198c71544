"""The two programs that run INSIDE a worker sandbox, and the protocol between them and the parent.

``SERVER`` is the worker server's Python source (run with ``python -I -S -c SERVER ctl_fd site_dirs``);
``UNSHARE_SETUP`` is the shell script that prepares the ``unshare`` layer's mount namespace before
exec'ing the server. Kept as strings: they run in another interpreter, never in the caller's.

Protocol on the control socket: the parent sends a length-prefixed (``!I``) JSON request (run id,
work dir, uid, whether to clear capabilities, rlimits, nonce, network guard, environment, module name) and, as SCM_RIGHTS with its
first bytes, the program's stdout, stderr and status pipes; the server forks a child for the program,
waits for it, cleans up and answers with a length-prefixed ``{"rc": <exit code>}``.
"""
from __future__ import annotations

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
SERVER = r'''
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
    # inheritable one (bwrap --cap-add fills it) so no exec can ever pick a capability up again. A program
    # that stays uid 0 of a user namespace (unshare as a normal user) loses its bounding set and every
    # capability here: it cannot remount the read-only binds or undo the namespaces.
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in range(64):
            libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (fails harmlessly without CAP_SETPCAP)
        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
        class Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                        ("inheritable", ctypes.c_uint32)]
        if libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()) != 0:
            raise OSError(ctypes.get_errno(), "capset failed")
    except Exception:
        if os.geteuid() == 0:
            raise

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
    if uid is not None or req["clear_caps"]:
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

def _scrub(dirs, keep):
    # keep: per dir, the entries that lead to a mount point (left alone, as is any other mount point).
    import shutil
    for d in dirs:
        try:
            entries = os.listdir(d)
        except OSError:
            continue
        for name in entries:
            p = os.path.join(d, name)
            if name in keep.get(d, ()) or os.path.ismount(p):
                continue
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
try:  # never scrubbed: entries of a scratch dir that are, or lead to, a mount (a virtualenv bound under /tmp)
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split()[4].replace("\\040", " ") for line in f]
except OSError:
    mounts = []
keep = {d: {m[len(d.rstrip("/")) + 1:].split("/")[0] for m in mounts if m.startswith(d.rstrip("/") + "/")}
        for d in scratch}
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
    _scrub(scratch, keep)
    rc = os.waitstatus_to_exitcode(status)
    reply = json.dumps({"rc": rc}).encode()
    ctl.sendall(struct.pack("!I", len(reply)) + reply)
'''


# Runs as (namespace) root inside the unshare layer's fresh mount namespace, then execs the server. Builds the
# sandbox's own root, as bwrap does: a tmpfs at $2 holding the read-only binds (the system dirs and the
# interpreter's dirs, each at its own path, under parents created 0755, so a fresh uid reaches an interpreter
# kept in a 0700 /root, and a virtualenv under /tmp stays visible above the private /tmp), the work dir $1 at
# /sandbox, a private size-capped /tmp ($3 MiB), /dev/shm, /proc and a minimal /dev; then pivots into it and
# drops the host's root. Any failure (a bind that cannot be made read-only, ...) ends the script: the layer
# is then unusable, never half set up.
# argv: work_dir root_dir tmp_mb ro_path... -- command...   Exports AR_SCRATCH (the dirs emptied after each run).
UNSHARE_SETUP = r'''
set -e
umask 022
w="$1"; r="$2"; tmp_mb="$3"; shift 3
mount --make-rprivate /
mount -t tmpfs -o mode=0755,size=1m tmpfs "$r"
mkdir "$r/tmp" "$r/sandbox" "$r/proc" "$r/dev"
mount -t tmpfs -o "mode=1777,size=${tmp_mb}m" tmpfs "$r/tmp"
mount --bind "$w" "$r/sandbox"
mount --rbind /proc "$r/proc"
mount -t tmpfs -o mode=0755,size=1m tmpfs "$r/dev"
for n in null zero full random urandom tty; do
  : > "$r/dev/$n"; mount --bind "/dev/$n" "$r/dev/$n"
done
ln -s /proc/self/fd "$r/dev/fd"; ln -s /proc/self/fd/0 "$r/dev/stdin"
ln -s /proc/self/fd/1 "$r/dev/stdout"; ln -s /proc/self/fd/2 "$r/dev/stderr"
mkdir "$r/dev/shm"
mount -t tmpfs -o size=1m,mode=1777 tmpfs "$r/dev/shm"
mount -o remount,bind,ro "$r/dev"
while [ "$1" != "--" ]; do
  d="$1"; shift
  if [ -L "$d" ]; then
    mkdir -p "$r${d%/*}"; ln -s "$(readlink "$d")" "$r$d"
  elif [ -e "$d" ]; then
    if [ -d "$d" ]; then mkdir -p "$r$d"; else mkdir -p "$r${d%/*}"; : > "$r$d"; fi
    mount --bind "$d" "$r$d" 2>/dev/null || mount --rbind "$d" "$r$d"
    mount -o remount,bind,ro,nosuid,nodev "$r$d"
  fi
done
shift
mount -o remount,bind,ro "$r"
cd "$r"
pivot_root . .
umount -l .
cd /sandbox
export AR_SCRATCH=/sandbox:/tmp:/dev/shm
exec "$@"
'''
