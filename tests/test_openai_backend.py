"""The openai backend against a scripted in-process HTTP server (fast; no model).

Covers request mapping per server kind, n handling, stop trimming, retries with backoff,
clear errors, bounded concurrency, and that the API key is sent but never logged.
The same backend against a real ``transformers serve`` is in tests/test_serve.py.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from anchored_reasoning.backends import get_backend
from anchored_reasoning.backends.openai_compat import OpenAIBackend, normalize_base_url
from anchored_reasoning.errors import BackendError, ConfigError
from anchored_reasoning.types import Prompt, SamplingSpec


class FakeServer:
    """A loopback HTTP server whose answers come from ``self.handler(method, path, body, headers)``
    returning (status, json_or_None, headers). Every request is recorded."""

    def __init__(self, handler, kind: str = "openai"):
        self.handler = handler
        self.kind = kind
        self.requests: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output quiet
                pass

            def _serve(self, method):
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                path = self.path
                if method == "GET" and path == "/version":
                    status, payload, headers = (200, {"version": "0.31.0"}, {}) if outer.kind == "vllm" else (404, {"detail": "Not Found"}, {})
                elif method == "GET" and path == "/health":
                    if outer.kind == "transformers":
                        status, payload, headers = 200, {"status": "ok"}, {}
                    elif outer.kind == "vllm":
                        status, payload, headers = 200, None, {}
                    else:
                        status, payload, headers = 404, {"detail": "Not Found"}, {}
                else:
                    with outer.lock:
                        outer.requests.append({"method": method, "path": path, "body": body, "headers": dict(self.headers)})
                        outer.in_flight += 1
                        outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                    try:
                        status, payload, headers = outer.handler(method, path, body, dict(self.headers))
                    finally:
                        with outer.lock:
                            outer.in_flight -= 1
                data = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._serve("GET")

            def do_POST(self):
                self._serve("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def completions(self, path: str) -> list[dict]:
        return [r for r in self.requests if r["path"] == path]


def echo_completion(n_default: int = 1, honour_n: bool = True, with_token_ids: bool = False, suffix: str = ""):
    """A handler that answers completions with '<prompt-last-word>-<seed>-<k>' per choice."""

    def handler(method, path, body, headers):
        if path == "/v1/completions":
            key = body["prompt"].split()[-1]
        elif path == "/v1/chat/completions":
            key = body["messages"][-1]["content"].split()[-1]
        else:
            return 404, {"error": {"message": "no such route"}}, {}
        n = int(body.get("n", n_default)) if honour_n else 1
        choices = []
        for k in range(n):
            text = f" {key}-{body.get('seed')}-{k}{suffix}"
            c = {"index": k, "finish_reason": "length"}
            if path == "/v1/chat/completions":
                c["message"] = {"role": "assistant", "content": text}
            else:
                c["text"] = text
            if with_token_ids:
                c["token_ids"] = list(range(k + 2))
            choices.append(c)
        usage = {"prompt_tokens": 3, "completion_tokens": 5 * n, "total_tokens": 3 + 5 * n}
        return 200, {"id": "x", "object": "text_completion", "choices": choices, "usage": usage}, {}

    return handler


def slow_completion(seconds: float):
    """A handler that answers as :func:`echo_completion` does, after ``seconds``."""
    answer = echo_completion()

    def handler(method, path, body, headers):
        time.sleep(seconds)
        return answer(method, path, body, headers)

    return handler


def make(srv: FakeServer, **kw) -> OpenAIBackend:
    kw.setdefault("backoff", 0.01)
    kw.setdefault("max_backoff", 0.05)
    return OpenAIBackend("m", base_url=srv.base_url, **kw)


def test_registry_builds_backend_and_normalizes_url():
    b = get_backend("openai", "m", base_url="127.0.0.1:9")
    assert isinstance(b, OpenAIBackend)
    assert b.base_url == "http://127.0.0.1:9/v1"
    assert normalize_base_url("https://api.example.com/openai/v1/") == "https://api.example.com/openai/v1"
    with pytest.raises(ConfigError):
        OpenAIBackend("m", mode="stream")
    with pytest.raises(ConfigError):
        OpenAIBackend("m", api_key_env="sk-this looks like a key")


def test_vllm_kind_sends_n_once_and_uses_token_ids():
    with FakeServer(echo_completion(with_token_ids=True), kind="vllm") as srv:
        b = make(srv)
        out = b.generate([Prompt("q a"), Prompt("q b")], SamplingSpec(max_new_tokens=7, temperature=0.7, top_p=0.9, n=3, seed=5))
        assert b.server_kind == "vllm"
        reqs = srv.completions("/v1/completions")
        assert len(reqs) == 2
        body = reqs[0]["body"]
        assert body["n"] == 3 and body["seed"] == 5 and body["max_tokens"] == 7
        assert body["temperature"] == 0.7 and body["top_p"] == 0.9 and body["return_token_ids"] is True
        assert "generation_config" not in body
        assert [c.text for c in out[0]] == [" a-5-0", " a-5-1", " a-5-2"]
        assert [c.text for c in out[1]] == [" b-5-0", " b-5-1", " b-5-2"]
        assert [c.n_tokens for c in out[0]] == [2, 3, 4]  # from token_ids, not the usage total


def test_transformers_kind_splits_n_and_passes_generation_config():
    with FakeServer(echo_completion(honour_n=False, suffix=" STOP tail"), kind="transformers") as srv:
        b = make(srv, concurrency=1)
        out = b.generate([Prompt("q a")], SamplingSpec(max_new_tokens=9, temperature=0.8, top_p=0.95, n=3, seed=10, stop=["STOP"]))
        assert b.server_kind == "transformers"
        reqs = srv.completions("/v1/completions")
        assert len(reqs) == 3
        assert sorted(r["body"]["seed"] for r in reqs) == [10, 11, 12]
        for r in reqs:
            assert "n" not in r["body"] and "temperature" not in r["body"]
            gen = json.loads(r["body"]["generation_config"])
            assert gen == {"max_new_tokens": 9, "do_sample": True, "temperature": 0.8, "top_p": 0.95, "top_k": 0}
            assert r["body"]["stop"] == ["STOP"]
        # the server kept the stop string: the backend cuts it, and the rest after it
        assert [c.text for c in out[0]] == [" a-10-0 ", " a-11-0 ", " a-12-0 "]
        assert all(c.finish_reason == "stop" and c.n_tokens == 5 for c in out[0])


def test_transformers_greedy_sends_do_sample_false_and_copies_n():
    with FakeServer(echo_completion(honour_n=False), kind="transformers") as srv:
        b = make(srv)
        out = b.generate([Prompt("q a")], SamplingSpec(max_new_tokens=4, n=2))
        reqs = srv.completions("/v1/completions")
        assert len(reqs) == 1
        assert json.loads(reqs[0]["body"]["generation_config"]) == {"max_new_tokens": 4, "do_sample": False}
        assert [c.text for c in out[0]] == [" a-0-0", " a-0-0"]


def test_generic_server_with_fewer_choices_falls_back_to_one_request_per_sample():
    with FakeServer(echo_completion(honour_n=False), kind="openai") as srv:
        b = make(srv, concurrency=2)
        spec = SamplingSpec(max_new_tokens=4, temperature=1.0, n=3, seed=0, stop=["a", "b", "c", "d", "e"])
        out = b.generate([Prompt("q x"), Prompt("q y")], spec)
        assert b.server_kind == "openai"
        assert [c.text for c in out[0]] == [" x-0-0", " x-1-0", " x-2-0"]
        assert [c.text for c in out[1]] == [" y-0-0", " y-1-0", " y-2-0"]
        first = srv.completions("/v1/completions")[0]["body"]
        assert first["n"] == 3 and len(first["stop"]) == 4  # OpenAI accepts at most 4 stop strings
        n_before = len(srv.requests)
        b.generate([Prompt("q z")], spec)  # remembered: no n=3 request any more
        assert len(srv.requests) - n_before == 3
        assert all("n" not in r["body"] for r in srv.requests[n_before:])


def test_chat_mode_auto_uses_messages_and_plain_text_otherwise():
    with FakeServer(echo_completion(), kind="vllm") as srv:
        b = make(srv)
        out = b.generate(
            [Prompt("q plain", messages=[{"role": "user", "content": "q chat"}]), Prompt("q raw")],
            SamplingSpec(max_new_tokens=3),
        )
        assert out[0][0].text == " chat-0-0" and out[1][0].text == " raw-0-0"
        assert len(srv.completions("/v1/chat/completions")) == 1 and len(srv.completions("/v1/completions")) == 1
        b2 = make(srv, mode="chat")
        assert b2.generate([Prompt("q only")], SamplingSpec(max_new_tokens=3))[0][0].text == " only-0-0"
        assert srv.completions("/v1/chat/completions")[-1]["body"]["messages"] == [{"role": "user", "content": "q only"}]


def test_results_keep_prompt_order_and_concurrency_is_bounded():
    def slow(method, path, body, headers):
        key = body["prompt"].split()[-1]
        time.sleep(0.02 * (int(key) % 3))
        return echo_completion()(method, path, body, headers)

    with FakeServer(slow) as srv:
        b = make(srv, concurrency=3)
        prompts = [Prompt(f"q {i}") for i in range(12)]
        out = b.generate(prompts, SamplingSpec(max_new_tokens=2))
        assert [o[0].text for o in out] == [f" {i}-0-0" for i in range(12)]
        assert 1 < srv.max_in_flight <= 3


def test_retries_on_503_and_429_then_succeeds():
    calls = {"n": 0}

    def flaky(method, path, body, headers):
        calls["n"] += 1
        if calls["n"] == 1:
            return 503, {"error": "loading"}, {}
        if calls["n"] == 2:
            return 429, {"error": {"message": "slow down"}}, {"retry-after": "0"}
        return echo_completion()(method, path, body, headers)

    with FakeServer(flaky) as srv:
        b = make(srv, max_retries=3)
        out = b.generate([Prompt("q a")], SamplingSpec(max_new_tokens=2))
        assert out[0][0].text == " a-0-0"
        assert b.stats.retries == 2 and calls["n"] == 3


def test_gives_up_after_retries_with_clear_error():
    def broken(method, path, body, headers):
        return 500, {"error": "boom"}, {}

    with FakeServer(broken) as srv:
        b = make(srv, max_retries=2)
        with pytest.raises(BackendError) as err:
            b.generate([Prompt("q a")], SamplingSpec(max_new_tokens=2))
        msg = str(err.value)
        assert "after 3 attempt(s)" in msg and "HTTP 500" in msg and "boom" in msg and srv.base_url in msg
        assert len(srv.requests) == 3


def test_client_errors_are_not_retried():
    def bad(method, path, body, headers):
        return 400, {"error": {"message": "model 'm' does not exist"}}, {}

    with FakeServer(bad) as srv:
        b = make(srv, max_retries=4)
        with pytest.raises(BackendError, match="HTTP 400.*does not exist.*model name"):
            b.generate([Prompt("q a")], SamplingSpec(max_new_tokens=2))
        assert len(srv.requests) == 1


def test_timeouts_are_retried_then_reported():
    hang = slow_completion(0.5)
    with FakeServer(hang) as srv:
        b = make(srv, timeout=0.1, max_retries=1, server="openai")
        t0 = time.monotonic()
        with pytest.raises(BackendError, match="timed out"):
            b.generate([Prompt("q a")], SamplingSpec(max_new_tokens=2))
        assert time.monotonic() - t0 < 5
        assert len(srv.requests) == 2


def test_a_slow_answer_is_retried_with_a_longer_timeout():
    # the server takes 0.35 s: 0.1 s and 0.2 s time out, the third attempt waits 0.4 s and gets it
    slow = slow_completion(0.35)
    with FakeServer(slow) as srv:
        b = make(srv, timeout=0.1, max_retries=2, backoff=0.0, server="openai")
        out = b.generate([Prompt("q a")], SamplingSpec(max_new_tokens=2))
        assert out[0][0].text and len(srv.requests) == 3
    with FakeServer(slow) as srv:  # a fixed timeout never gets there
        b = make(srv, timeout=0.1, timeout_growth=1.0, max_retries=2, backoff=0.0, server="openai")
        with pytest.raises(BackendError, match=r"timed out after 0.1 s waiting for the answer"):
            b.generate([Prompt("q a")], SamplingSpec(max_new_tokens=2))
    with FakeServer(slow) as srv:  # nor one capped below the answer time
        b = make(srv, timeout=0.1, max_timeout=0.2, max_retries=3, backoff=0.0, server="openai")
        with pytest.raises(BackendError, match=r"after 4 attempt\(s\): timed out after 0.2 s"):
            b.generate([Prompt("q a")], SamplingSpec(max_new_tokens=2))
    with pytest.raises(ConfigError, match="timeout_growth >= 1"):
        OpenAIBackend("m", base_url="http://127.0.0.1:1/v1", timeout_growth=0.5)


def test_settings_changed_on_the_backend_reach_its_http_client():
    # the backend forwards its request settings to the client that sends them (backends/openai_http.py)
    slow = slow_completion(0.3)
    with FakeServer(slow) as srv:
        b = make(srv, timeout=30.0, max_retries=0, backoff=0.0, server="openai")
        b.timeout, b.timeout_growth = 0.05, 1.0
        assert b.http.timeout == 0.05
        with pytest.raises(BackendError, match=r"timed out after 0.05 s"):
            b.generate([Prompt("q a")], SamplingSpec(max_new_tokens=2))
        assert b.stats is b.http.stats and b.stats.failures == 1


def test_connection_refused_is_retried_then_reported():
    with FakeServer(echo_completion()) as srv:
        url = srv.base_url
    b = OpenAIBackend("m", base_url=url, max_retries=2, backoff=0.01, server="vllm")
    with pytest.raises(BackendError, match=r"after 3 attempt\(s\): connection failed.*anchored-reasoning serve"):
        b.generate([Prompt("q a")], SamplingSpec(max_new_tokens=2))


def test_detection_waits_for_a_server_then_reports():
    with FakeServer(echo_completion()) as srv:
        url = srv.base_url
    b = OpenAIBackend("m", base_url=url, max_retries=1, backoff=0.01)  # server="auto": probes first
    with pytest.raises(BackendError, match=r"no server answers at http://127\.0\.0\.1:\d+ after 2 attempt"):
        b.generate([Prompt("q a")], SamplingSpec(max_new_tokens=2))


def test_api_key_is_sent_but_never_logged(monkeypatch, caplog):
    secret = "sk-test-DO-NOT-LOG-9f8e7d6c5b4a"
    monkeypatch.setenv("MY_KEY_VAR", secret)
    seen = []

    def handler(method, path, body, headers):
        seen.append(headers.get("Authorization") or headers.get("authorization"))
        if len(seen) == 1:
            return 503, {"error": "busy"}, {}
        if len(seen) == 3:
            return 401, {"error": {"message": "invalid key"}}, {}
        return echo_completion()(method, path, body, headers)

    caplog.set_level(logging.DEBUG)
    with FakeServer(handler) as srv:
        b = make(srv, api_key_env="MY_KEY_VAR", max_retries=2)
        b.generate([Prompt("q a")], SamplingSpec(max_new_tokens=2))
        with pytest.raises(BackendError) as err:
            b.generate([Prompt("q b")], SamplingSpec(max_new_tokens=2))
    assert seen == [f"Bearer {secret}"] * 3
    assert "MY_KEY_VAR" in str(err.value) and secret not in str(err.value)
    assert caplog.records, "expected retry warnings in the log"
    assert secret not in caplog.text
    assert secret not in json.dumps(b.describe()) and secret not in repr(b)


def test_no_key_means_no_authorization_header(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    seen = []

    def handler(method, path, body, headers):
        seen.append("Authorization" in headers or "authorization" in headers)
        return echo_completion()(method, path, body, headers)

    with FakeServer(handler) as srv:
        make(srv).generate([Prompt("q a")], SamplingSpec(max_new_tokens=2))
    assert seen == [False]


def test_describe_leaves_out_volatile_settings():
    a = OpenAIBackend("m", base_url="http://127.0.0.1:1/v1", concurrency=2, timeout=5)
    b = OpenAIBackend("m", base_url="http://127.0.0.1:2/v1", concurrency=9, timeout=50, max_retries=1)
    assert a.describe() == b.describe() == {"backend": "openai", "model": "m", "mode": "auto", "server": "auto"}


def test_model_auto_reads_v1_models():
    def handler(method, path, body, headers):
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": "served/model", "object": "model"}]}, {}
        assert body["model"] == "served/model"
        return echo_completion()(method, path, body, headers)

    with FakeServer(handler, kind="vllm") as srv:
        b = OpenAIBackend("auto", base_url=srv.base_url)
        assert b.generate([Prompt("q a")], SamplingSpec(max_new_tokens=2))[0][0].text == " a-0-0"
        assert b.model == "served/model"


def test_a_failed_chunk_still_reports_the_prompts_that_finished():
    def half_broken(method, path, body, headers):
        prompt = body.get("prompt") or body["messages"][-1]["content"]
        if "bad" in str(prompt):
            return 500, {"error": "engine died"}, {}
        return 200, {"choices": [{"text": f"echo {prompt}", "finish_reason": "stop", "index": 0}],
                     "usage": {"completion_tokens": 2}}, {}

    with FakeServer(half_broken) as srv:
        b = make(srv, max_retries=0, concurrency=1)
        with pytest.raises(BackendError) as err:
            b.generate([Prompt("q0"), Prompt("q1"), Prompt("bad"), Prompt("q3")], SamplingSpec(max_new_tokens=2, n=2))
        partial = err.value.partial
        assert sorted(partial) == [0, 1]  # finished before the failure; the rest was never answered
        assert [c.text for c in partial[1]] == ["echo q1", "echo q1"]  # greedy: one request copied n times
