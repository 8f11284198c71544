"""The code sandbox fails closed, wherever the interpreter lives.

Hostile programs (write in the caller's $HOME, overwrite or delete the caller's file, read a 0600 secret,
plant a file in the interpreter or the project, kill a process of the caller, reach a loopback listener, run
as root, fork-bomb) run through three interpreters: the current one, a virtualenv directly under /tmp (the
unshare layer's private /tmp once hid it and the run fell back to root), and a virtualenv inside a directory
other users cannot enter. They run on "auto" and on every layer available here; a layer that cannot isolate
them must refuse instead. A machine without namespaces (simulated) refuses before any program starts unless
the user opted in, and the eval runner and GRPO's rewards refuse before generating anything.

Run: pytest tests/test_sandbox_isolation.py   (about 30 s on 2 cores)
"""
from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from anchored_reasoning import sandbox
from anchored_reasoning.errors import ConfigError, UnisolatedCodeError
from anchored_reasoning.sandbox import ALLOW_ENV, SandboxConfig, layers, run_program, run_programs
from anchored_reasoning.sandbox import worker as worker_module
from anchored_reasoning.types import Completion, Example, Grade

ROOT = os.geteuid() == 0
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_ambient_opt_in(monkeypatch):
    monkeypatch.setenv(ALLOW_ENV, "")  # setenv, not delenv: whatever a test sets is undone afterwards
    monkeypatch.setenv("ANCHORED_REASONING_SANDBOX", "")
    yield
    sandbox.shutdown()


def _venv(where: Path) -> str:
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(where)],
                   check=True, capture_output=True, timeout=120)
    return str(where / "bin" / "python")


@pytest.fixture(scope="module")
def interpreters():
    base = Path(tempfile.mkdtemp(prefix="ar-sandbox-venvs-", dir="/tmp"))
    os.chmod(base, 0o755)
    private = base / "private"
    private.mkdir()
    os.chmod(private, 0o700)  # other users cannot enter it
    pythons = {"current": os.path.abspath(sys.executable), "venv-under-tmp": _venv(base / "venv"),
               "venv-in-0700-dir": _venv(private / "venv")}
    yield pythons
    sandbox.shutdown()
    shutil.rmtree(base)


@dataclass
class Scene:
    """What a hostile program goes after: the caller's files, its secret, its process, a loopback port."""

    dir: Path
    canary: Path
    secret: Path
    token: str
    home_target: Path
    victim: subprocess.Popen
    listener: socket.socket  # never accepts: a connection that got through waits in its backlog

    def reached(self) -> bool:
        try:
            self.listener.accept()[0].close()
            return True
        except BlockingIOError:
            return False


@pytest.fixture
def scene():
    d = Path(tempfile.mkdtemp(prefix="ar-hostile-", dir="/tmp"))
    os.chmod(d, 0o755)  # visible to other users: only the sandbox stands between a program and these files
    canary, secret, token = d / "canary.txt", d / "secret.txt", secrets.token_hex(8)
    canary.write_text("alive")
    os.chmod(canary, 0o644)
    secret.write_text(f"secret-{token}")
    os.chmod(secret, 0o600)
    victim = subprocess.Popen(["sleep", "60"])
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    s = Scene(d, canary, secret, token, Path.home() / f"ar-hostile-{token}.txt", victim, listener)
    yield s
    victim.kill()
    victim.wait()
    s.listener.close()
    s.home_target.unlink(missing_ok=True)
    shutil.rmtree(d)


def _plant_dirs(python: str) -> list[Path]:
    """The interpreter's site-packages and bin dir, and the project: a program must write in none of them."""
    return [Path((layers.python_layout(python)[1] or [os.path.dirname(python)])[0]), Path(os.path.dirname(python)), REPO]


def _hostile(s: Scene, python: str) -> dict[str, str]:
    """name -> program; each must end in an exception (status "failed") without its effect taking place."""
    planted = [str(d / f"ar_planted_{s.token}") for d in _plant_dirs(python)]
    return {
        "write_home": f"open({str(s.home_target)!r}, 'w').write('pwned')\n",
        "overwrite_file": f"open({str(s.canary)!r}, 'w').write('pwned')\n",
        "delete_file": f"import os\nos.remove({str(s.canary)!r})\n",
        "read_secret": f"print(open({str(s.secret)!r}).read())\n",
        "plant_files": "".join(f"try:\n    open({p!r}, 'w').write('x')\nexcept OSError:\n    pass\n" for p in planted)
                       + "raise SystemExit(3)\n",
        "kill_caller_process": f"import os\nos.kill({s.victim.pid}, 9)\n",
        "network": f"import socket\nsocket.create_connection(('127.0.0.1', {s.listener.getsockname()[1]}), timeout=1).sendall(b'x')\n",
    }


WHOAMI = ("import os\nprint(os.geteuid())\n"
          "print(int(next(l for l in open('/proc/self/status') if l.startswith('CapEff')).split()[1], 16))\n")
FORK_BOMB = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"


def _live_processes_of(uid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == uid:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    if f.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                        found.append(int(entry))
        except OSError:
            pass
    return found


def _assert_contained(s: Scene, cfg: SandboxConfig) -> None:
    """Run every hostile program with ``cfg`` and check that nothing outside the sandbox changed."""
    progs = _hostile(s, cfg.python or sys.executable)
    results = dict(zip(progs, run_programs(list(progs.values()), cfg, workers=2)))
    for name, r in results.items():
        assert r.status == "failed", (name, r)
    time.sleep(0.2)
    assert not s.home_target.exists(), "a program wrote into the caller's home"
    assert s.canary.read_text() == "alive", "a program changed or deleted the caller's file"
    assert sorted(p.name for p in s.dir.iterdir()) == ["canary.txt", "secret.txt"]
    assert f"secret-{s.token}" not in results["read_secret"].stdout
    planted = [p for d in _plant_dirs(cfg.python or sys.executable) for p in d.glob("ar_planted_*")]
    assert not planted, f"a program planted files in the interpreter or the project: {planted}"
    assert s.victim.poll() is None, "a program killed a process of the caller"
    assert not s.reached(), "a program reached a loopback listener"

    who = run_program(WHOAMI, cfg)
    assert who.ok, who
    euid, caps = who.stdout.split()
    if ROOT:
        assert euid != "0" and int(euid) == who.uid, "a program ran as root"
    assert caps == "0", "a program kept capabilities"

    t = time.monotonic()
    bomb = run_program(FORK_BOMB, cfg)
    assert bomb.status in ("timeout", "failed", "killed") and time.monotonic() - t < 10
    if bomb.uid is not None:
        deadline = time.monotonic() + 3
        while _live_processes_of(bomb.uid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _live_processes_of(bomb.uid), "the fork bomb left processes behind"


def _config(python: str, layer: str = "auto", **kw) -> SandboxConfig:
    guard = layer == "plain"  # the namespaced layers must stop the network without the in-process guard
    return SandboxConfig(python=python, isolation=layer, timeout_s=3, max_processes=24, network_guard=guard, **kw)


# ------------------------------------------------------------------------------ wherever Python lives

@pytest.mark.parametrize("which", ["current", "venv-under-tmp", "venv-in-0700-dir"])
def test_hostile_programs_are_contained_wherever_the_interpreter_lives(which, interpreters, scene):
    cfg = _config(interpreters[which])
    iso = sandbox.assess(cfg)
    if not iso.isolated:  # this machine cannot isolate: the run must refuse, never fall back to running
        with pytest.raises(UnisolatedCodeError):
            run_program("print(1)", cfg)
        pytest.skip(f"nothing isolates programs here ({iso.problem}); the refusal was checked")
    assert sandbox.preflight(cfg)["isolated"]
    _assert_contained(scene, cfg)


@pytest.mark.parametrize("layer", sandbox.LAYERS)
def test_each_layer_contains_a_venv_under_tmp_or_refuses(layer, interpreters, scene):
    python = interpreters["venv-under-tmp"]
    ok, why = layers.layer_available(layer, python)
    if not ok:
        pytest.skip(f"layer {layer!r} unavailable here: {why}")
    cfg = _config(python, layer)
    if layer != "plain":
        assert sandbox.assess(cfg).isolated, "a namespaced layer must isolate a venv under /tmp"
    if sandbox.assess(cfg).isolated:
        _assert_contained(scene, cfg)
    else:
        with pytest.raises(UnisolatedCodeError, match="--confirm-run-unsafe-code"):
            run_program("print(1)", cfg)


def test_unshare_keeps_the_venv_visible_under_its_private_tmp(interpreters):
    python = interpreters["venv-under-tmp"]
    ok, why = layers.layer_available("unshare", python)
    if not ok:
        pytest.skip(f"unshare unavailable here: {why}")
    venv = os.path.dirname(os.path.dirname(python))
    r = run_program(f"import os, tempfile\nprint(os.path.isdir({venv!r}), os.listdir('/tmp'))\n"
                    "open('/tmp/mine', 'w').write('x')\n", SandboxConfig(python=python, isolation="unshare"))
    assert r.ok, r
    assert r.stdout.split(" ", 1)[0] == "True" and r.layer == "unshare"
    r = run_program("import os\nprint(os.path.exists('/tmp/mine'))\n", SandboxConfig(python=python, isolation="unshare"))
    assert r.stdout == "False\n", "a run's /tmp files survived into the next run"


def _reachable_interpreter(work_root: str) -> str | None:
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate) and not layers.fresh_uid_blocker("plain", os.path.abspath(candidate), work_root):
            return os.path.abspath(candidate)
    return None


def test_plain_layer_with_a_fresh_uid_is_isolated_without_opt_in(tmp_path, scene):
    if not ROOT:
        pytest.skip("as a normal user the plain layer runs programs as that user: never isolated (tested below)")
    work_root = tempfile.mkdtemp(prefix="ar-sandbox-plain-", dir="/tmp")
    os.chmod(work_root, 0o755)
    try:
        python = _reachable_interpreter(work_root)
        if python is None:
            pytest.skip("no interpreter here whose directories other users can enter")
        cfg = _config(python, "plain", work_root=work_root)
        iso = sandbox.assess(cfg)
        assert iso.isolated and iso.fresh_uid, iso
        _assert_contained(scene, cfg)
    finally:
        sandbox.shutdown()
        shutil.rmtree(work_root)


# ---------------------------------------------------------------------- no namespaces: fail closed

@pytest.fixture
def no_namespaces(monkeypatch):
    real = layers.layer_available

    def available(layer: str, python: str):
        return (False, "simulated: no namespaces on this machine") if layer != "plain" else real(layer, python)

    monkeypatch.setattr(layers, "layer_available", available)
    sandbox.shutdown()


@pytest.fixture
def nothing_may_start(monkeypatch):
    def start(self):
        raise AssertionError("a worker sandbox started: a program would have run")

    monkeypatch.setattr(worker_module.Worker, "start", start)


def test_no_namespaces_refuses_before_any_program_runs(no_namespaces, nothing_may_start, interpreters):
    from anchored_reasoning.tasks.code_exec import grade_humaneval_batch, preflight

    cfg = SandboxConfig(python=interpreters["venv-in-0700-dir"])
    iso = sandbox.assess(cfg)
    assert iso.layer == "plain" and not iso.isolated
    for attempt in (lambda: run_program("print(1)", cfg), lambda: run_programs(["print(1)"] * 3, cfg),
                    lambda: sandbox.preflight(cfg), lambda: preflight(cfg),
                    lambda: grade_humaneval_batch(["    return 1\n"], [_example()], config=cfg)):
        with pytest.raises(UnisolatedCodeError) as info:
            attempt()
        message = str(info.value)
        for needle in ("bwrap: simulated", "unshare: simulated", "plain: usable", "--confirm-run-unsafe-code",
                       f"{ALLOW_ENV}=1", "allow_unisolated=True", "bubblewrap"):
            assert needle in message, (needle, message)
        assert ("as root" in message) == ROOT
    assert isinstance(info.value, ConfigError)  # the CLI reports it as a configuration error, exit code 2


def test_no_namespaces_runs_only_with_an_explicit_opt_in(no_namespaces, interpreters, monkeypatch):
    cfg = SandboxConfig(python=interpreters["venv-in-0700-dir"], timeout_s=5)
    monkeypatch.setenv(ALLOW_ENV, "0")  # anything but an explicit yes is no
    with pytest.raises(UnisolatedCodeError):
        run_program("print(1)", cfg)
    r = run_program(WHOAMI, SandboxConfig(python=cfg.python, timeout_s=5, allow_unisolated=True))
    assert r.ok and r.layer == "plain"
    if ROOT:
        assert r.stdout.split()[0] == "0" and r.uid is None  # unisolated, as root: what the opt-in allows
    monkeypatch.setenv(ALLOW_ENV, "1")
    assert run_program("print(6 * 7)", cfg).stdout == "42\n"
    assert sandbox.preflight(cfg)["allow_unisolated"]


def test_root_without_dropping_privileges_needs_the_opt_in(interpreters):
    if not ROOT:
        pytest.skip("only root can keep root privileges in a program")
    with pytest.raises(UnisolatedCodeError, match="drop_privileges=False"):
        run_program("print(1)", SandboxConfig(drop_privileges=False))


def test_a_normal_user_without_namespaces_is_refused(no_namespaces, monkeypatch):
    monkeypatch.setattr(layers, "is_root", lambda: False)
    monkeypatch.setattr("anchored_reasoning.sandbox.policy.is_root", lambda: False)
    iso = sandbox.assess(SandboxConfig())
    assert iso.layer == "plain" and not iso.isolated and "your own user" in iso.problem


# --------------------------------------------------------------- entry points refuse up front

HE_PROMPT = 'def one():\n    """Return 1."""\n'
HE_TEST = "def check(candidate):\n    assert candidate() == 1\n"


def _example() -> Example:
    return Example(id="Toy/1", question=HE_PROMPT, answer="    return 1\n",
                   meta={"task_id": "Toy/1", "prompt": HE_PROMPT, "test": HE_TEST, "entry_point": "one"})


class CodeTask:
    """A one-problem HumanEval-style task graded in the sandbox."""

    name = "toy-code"
    is_code = True
    metrics = ["accuracy"]
    generation = {"max_new_tokens": 8}
    prompts = {"nocot": "{question}"}

    def load(self, split, data_dir=None, limit=None):
        return [_example()]

    def render_question(self, example):
        return example.question

    def grade(self, completion, example) -> Grade:
        from anchored_reasoning.tasks.code_exec import grade_humaneval

        return grade_humaneval(completion, example)


class Backend:
    name = "fake"
    batch_size = 4

    def __init__(self) -> None:
        self.calls = 0

    def describe(self):
        return {"backend": "fake"}

    def generate(self, prompts, spec):
        self.calls += 1
        return [[Completion("    return 1\n", 3, 0.01, "stop")] for _ in prompts]


def test_eval_refuses_before_generating(no_namespaces, tmp_path, monkeypatch):
    from anchored_reasoning.eval.runner import run_eval
    from anchored_reasoning.methods.prompting import NoCoT

    if sandbox.assess(SandboxConfig()).isolated:
        pytest.skip("the plain layer isolates this interpreter here (root, reachable): nothing to refuse")
    backend = Backend()
    with pytest.raises(UnisolatedCodeError):
        run_eval(CodeTask(), backend, NoCoT(), out_dir=tmp_path / "run", progress=False)
    assert backend.calls == 0, "the model generated before the refusal"
    monkeypatch.setenv(ALLOW_ENV, "1")
    summary = run_eval(CodeTask(), backend, NoCoT(), out_dir=tmp_path / "run", progress=False)
    assert backend.calls == 1 and summary["accuracy"]["mean"] == 1.0


def test_grpo_code_rewards_refuse_before_training(no_namespaces):
    from anchored_reasoning.train.rewards import build_rewards

    if sandbox.assess(SandboxConfig()).isolated:
        pytest.skip("the plain layer isolates this interpreter here (root, reachable): nothing to refuse")
    with pytest.raises(UnisolatedCodeError):
        build_rewards(None, CodeTask())


def test_eval_flag_opts_in(monkeypatch):
    from anchored_reasoning.commands import eval as eval_command

    parser = argparse.ArgumentParser()
    eval_command.add_arguments(parser)
    assert parser.parse_args([]).confirm_run_unsafe_code is False
    args = parser.parse_args(["--confirm-run-unsafe-code"])
    with pytest.raises(ConfigError, match="--task"):  # nothing else given: stops at the missing flags
        eval_command.run(args)
    assert os.environ[ALLOW_ENV] == "1"
