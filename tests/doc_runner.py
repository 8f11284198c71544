"""Runs the steps that tests/doc_blocks.py plans: a worker process that executes commands and Python
blocks, one working directory per Markdown file, the smallest-settings rewrites, a stub
OpenAI-compatible server, and the checks that need no process (make targets, pip lines, scripts).

The worker (``python tests/doc_runner.py --worker``) imports torch, transformers and TRL once and runs
each request in-process: ``anchored-reasoning ARGS`` as ``anchored_reasoning.cli.main(ARGS)``, ``python -m
MODULE ARGS`` through runpy, a Python block with ``exec`` in a fresh namespace. Output (file descriptors
1 and 2, so child processes too) goes to a log per request; the environment and working directory are
restored after each. A request past its time limit kills the worker's process group; the next request
starts a fresh worker.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import runpy
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doc_blocks import ROOT, SMALL_N, Step, flag_value, recipe_of  # noqa: E402

REQUEST_TIMEOUT_S = 600
CORPUS_HEAD_BYTES = 40_000  # a workspace's corpora/*.txt: the head of $ANCHORED_REASONING_DATA/corpora/*.txt
DEMO_SMALL = ["--budget-minutes", "0.1", "--train-n", "64", "--eval-n", "6", "--real-n", "0", "--no-probe",
              "--methods", "cot", "--workers", "1"]


# ---------------------------------------------------------------- smallest settings

def set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    argv = list(argv)
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            argv[i + 1] = value
            return argv
        if a.startswith(flag + "="):
            argv[i] = f"{flag}={value}"
            return argv
    return [*argv, flag, value]


def small_train_overrides(recipe: dict) -> list[str]:
    """Overrides that make a recipe train for seconds: a few steps of small batches on a few problems."""
    trainer = recipe.get("trainer") or "ar"
    training, data = recipe.get("training") or {}, recipe.get("data") or {}
    steps = 1 if trainer == "grpo" else 16 if training.get("curriculum") else 2
    out = [f"training.max_steps={steps}", "training.logging_steps=1"]
    if trainer == "grpo":
        out += ["training.per_device_train_batch_size=2", "training.num_generations=2",
                "training.max_completion_length=8"]
    else:
        out.append("training.per_device_train_batch_size=4")
    if "effective_batch_size" in training:
        out.append("training.effective_batch_size=4")
    if trainer == "ar":
        out += ["training.generation_eval_samples=2", "training.generation_max_new_tokens=8"]
        if training.get("curriculum"):
            out.append("training.curriculum_min_steps_per_stage=1")
    for section in ("train", "valid"):
        part, small = data.get(section), SMALL_N[section]
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("mix"), list):
            each = max(1, small // len(part["mix"]))
            mix = [dict(m, n=each) if "n" in m else dict(m, limit=each) for m in part["mix"]]
            out.append(f"data.{section}.mix={json.dumps(mix)}")
        elif "n" in part:
            out.append(f"data.{section}.n={small}")
        elif "split" in part or "limit" in part:
            out.append(f"data.{section}.limit={small}")
    if "ppl_max_blocks" in data:
        out.append("data.ppl_max_blocks=2")
    return out


def small_argv(step: Step, stub_url: str | None = None) -> list[str]:
    """The argv a step runs with: the documented one at its smallest settings."""
    argv = list(step.argv)
    if argv[:2] == ["python", "-m"]:
        return set_flag(argv, "--n", "8") if argv[2] == "anchored_reasoning.generators" else argv
    sub = argv[1]
    if sub == "train":
        return [*argv, *small_train_overrides(recipe_of(argv))]
    if sub == "eval":
        argv = set_flag(argv, "--limit", "2")
        if flag_value(argv, "--max-new-tokens") is None:
            argv += ["--max-new-tokens", "8"]
        return set_flag(argv, "--base-url", stub_url) if stub_url else argv
    if sub == "ppl" and flag_value(argv, "--limit"):
        return set_flag(argv, "--limit", "2")
    if sub == "demo":
        return [*argv, *DEMO_SMALL]
    return argv


# ---------------------------------------------------------------- checks without a process

def static_check(step: Step) -> str:
    """'' when the step's command is sound, else what is wrong."""
    argv = step.argv
    if step.kind == "error":
        return step.note
    if step.kind == "make":
        proc = subprocess.run(["make", "-n", "-C", str(ROOT), *argv[1:]], capture_output=True, text=True)
        return "" if proc.returncode == 0 else f"make: {proc.stderr.strip()}"
    if step.kind == "pip":
        return pip_check(argv)
    if step.kind == "file":
        missing = [a for a in argv[3:] if not a.startswith("-") and not (ROOT / a).exists()]
        return f"no such path: {missing}" if missing else ""
    if step.kind == "bash-script":
        script = ROOT / argv[1]
        if not script.is_file():
            return f"no such script: {argv[1]}"
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        return proc.stderr.strip()
    if step.kind == "argparse":
        return cli_parse_error(argv[1:])
    raise AssertionError(f"{step.kind} is not a static check")


def cli_parse_error(args: list[str]) -> str:
    """What ``anchored-reasoning ARGS`` would say about its arguments ('' when they parse)."""
    import contextlib
    import io

    from anchored_reasoning.cli import build_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns, extra = build_parser().parse_known_args(args)
    except SystemExit:
        return err.getvalue().strip() or "argparse refused the arguments"
    if not getattr(ns, "func", None):
        return "no subcommand"
    if extra and not (isinstance(getattr(ns, "overrides", None), list) and all("=" in x and not x.startswith("-") for x in extra)):
        return f"unrecognized arguments: {extra}"
    return ""


def pip_check(argv: list[str]) -> str:
    """``pip install`` lines name this project (``.``, ``-e .[extra]``, ``anchored-reasoning[extra]``) with
    extras it declares; ``pip download`` pins equal the installed versions."""
    import tomllib
    from importlib import metadata

    from packaging.requirements import Requirement

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    words = [a for a in argv[2:] if not a.startswith("-")]
    if argv[1] == "download":
        wrong = []
        for w in words:
            req = Requirement(w) if "==" in w else None
            if req is None:
                continue
            try:
                have = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                continue
            if not req.specifier.contains(have):
                wrong.append(f"{w} (installed: {have})")
        return f"pins differ from the installed packages: {wrong}" if wrong else ""
    for w in words:
        if w.startswith(".gpu_wheels/"):
            continue
        name, _, rest = w.partition("[")
        if name not in (".", "anchored-reasoning"):
            return f"pip install of {w!r}: not this project"
        unknown = [e for e in rest.rstrip("]").split(",") if e and e not in extras]
        if unknown:
            return f"pip install {w}: extras {unknown} are not in pyproject.toml ({sorted(extras)})"
    return ""


# ---------------------------------------------------------------- the stub server

class StubServer:
    """Answers /v1/completions and /v1/chat/completions with a fixed text, like any OpenAI-compatible server."""

    TEXT = "The answer is 42."

    def __init__(self):
        text = self.TEXT

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status: int, payload: dict | None) -> None:
                data = json.dumps(payload).encode() if payload is not None else b""
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._reply(200, {"data": [{"id": "stub"}]}) if self.path == "/v1/models" else self._reply(404, {})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                chat = self.path == "/v1/chat/completions"
                if not chat and self.path != "/v1/completions":
                    return self._reply(404, {})
                choice = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
                n = int(body.get("n") or 1)
                self._reply(200, {"choices": [{"index": i, "finish_reason": "stop", **choice} for i in range(n)],
                                  "usage": {"completion_tokens": 5 * n}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ---------------------------------------------------------------- the worker

class Worker:
    def __init__(self, env: dict[str, str]):
        self.env, self.proc = env, None

    def call(self, request: dict, timeout: float = REQUEST_TIMEOUT_S) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT, env=self.env,
                                         text=True, start_new_session=True)
        with tempfile.NamedTemporaryFile("r", suffix=".log", errors="replace") as log:
            self.proc.stdin.write(json.dumps({**request, "log": log.name}) + "\n")
            self.proc.stdin.flush()
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            line = self.proc.stdout.readline() if ready else ""
            output = Path(log.name).read_text(errors="replace")
        if not line:
            why = f"timed out after {timeout:.0f} s" if not ready else "the worker process died"
            self.close()
            return {"rc": 124, "seconds": timeout, "output": f"{output}\n[{why}]"}
        return {**json.loads(line), "output": output}

    def close(self) -> None:
        """Stop the worker and whatever it left running (its process group)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.proc = None


class _Parsed(Exception):
    pass


def _relax(parser: argparse.ArgumentParser) -> None:
    """No argument is required (a line in RESULTS.md may name only the options its row is about)."""
    for action in parser._actions:
        action.required = False
        for sub in (action.choices or {}).values() if isinstance(action, argparse._SubParsersAction) else ():
            _relax(sub)


def _parse_only(lenient: bool):
    """Make the outermost argparse call raise _Parsed once it has parsed (or exit as argparse does)."""
    depth = [0]
    saved = (argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args)

    def wrap(orig):
        def call(self, *args, **kwargs):
            if lenient and depth[0] == 0:
                _relax(self)
            depth[0] += 1
            try:
                result = orig(self, *args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                raise _Parsed(result)
            return result
        return call

    argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = map(wrap, saved)
    return saved


def _exit_code(exc: SystemExit) -> int:
    return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


def _handle(req: dict) -> int:
    os.chdir(req.get("cwd") or ROOT)
    for name, value in (req.get("env") or {}).items():  # the environment is restored after the request
        os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
    kind = req["kind"]
    if kind == "cli":
        from anchored_reasoning.cli import main

        try:
            return int(main(req["argv"]) or 0)
        except SystemExit as exc:
            return _exit_code(exc)
    if kind in ("python", "imports"):
        tree = ast.parse(req["code"])
        if kind == "imports":
            tree.body = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        ast.increment_lineno(tree, req["line"] - 1)  # tracebacks name the Markdown line
        exec(compile(tree, req["path"], "exec"), {"__name__": "__main__"})
        return 0
    module = req["module"]
    sys.argv = [module, *req["argv"]]
    saved = _parse_only(bool(req.get("lenient"))) if kind == "module-parse" else None
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except _Parsed:
        return 0
    except SystemExit as exc:
        return _exit_code(exc)
    finally:
        if saved:
            argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = saved
    if saved:
        print(f"{module} finished without parsing its arguments with argparse")
        return 3
    return 0


def _serve() -> None:
    chan = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    base_env, base_argv = dict(os.environ), list(sys.argv)
    for line in sys.stdin:
        req = json.loads(line)
        start = time.monotonic()
        with open(req["log"], "wb") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                rc = _handle(req)
            except BaseException:  # noqa: BLE001 - everything a doc block raises is its result
                traceback.print_exc()
                rc = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
                os.environ.clear()
                os.environ.update(base_env)
                sys.argv = list(base_argv)
                os.chdir(ROOT)
        chan.write(json.dumps({"rc": rc, "seconds": round(time.monotonic() - start, 2)}) + "\n")


# ---------------------------------------------------------------- workspaces

@dataclass
class Result:
    ok: bool
    message: str
    seconds: float = 0.0


def make_workspace(workspace: Path, data_dir: str | None) -> None:
    """A working directory like the checkout's root for what the docs name relative to it (train/, eval/,
    tasks/: links), and corpora/*.txt holding the first CORPUS_HEAD_BYTES of each data corpus, cut at a
    line end (relative corpus paths resolve in the working directory before the data folder)."""
    workspace.mkdir(parents=True, exist_ok=True)
    for folder in ("train", "eval", "tasks"):
        (workspace / folder).symlink_to(ROOT / folder, target_is_directory=True)
    source = Path(data_dir or "") / "corpora"
    if not data_dir or not source.is_dir():
        return
    (workspace / "corpora").mkdir()
    for f in source.glob("*.txt"):
        head = f.read_bytes()[:CORPUS_HEAD_BYTES]
        (workspace / "corpora" / f.name).write_bytes(head[: head.rfind(b"\n") + 1])


def snapshot(workspace: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(workspace)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in workspace.rglob("*") if p.is_file() and not p.is_symlink()}


def reads_workspace(argv: list[str]) -> bool:
    """Whether a ``train`` command's recipe loads a model or tokenizer from the working directory."""
    model = recipe_of(argv).get("model") or {}
    return any(str(model.get(k) or "").startswith(("runs/", "./")) for k in ("name", "base", "tokenizer"))


def copy_outputs(src: Path, dst: Path, paths: list[str]) -> bool:
    """Copy a command's outputs into another workspace unless something is already there."""
    if any((dst / p).exists() for p in paths):
        return False
    for p in paths:
        (dst / p).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / p, dst / p)
    return True


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    _serve()
