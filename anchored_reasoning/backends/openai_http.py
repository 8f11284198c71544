"""The HTTP side of the ``openai`` backend: one client for an OpenAI-compatible server.

:class:`OpenAIHTTP` owns everything about talking to the server and nothing about what is
generated: the base URL, the API key header, the connection pool, timeouts, retries with
exponential backoff on 408/409/425/429/5xx answers, timeouts and connection errors (a request that
timed out waiting for its answer is retried with a longer timeout), the error a user reads when
the retries are spent, and the probe that tells a vLLM server from ``transformers serve`` from
any other. :class:`~anchored_reasoning.backends.openai_compat.OpenAIBackend` builds the request
bodies and reads the answers (``openai_payloads``); it holds one of these.

The API key is read from the environment variable named by ``api_key_env`` when the first
request is made, sent only in the ``Authorization`` header, and never logged or put in an error.
"""
from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from anchored_reasoning.errors import BackendError, ConfigError

logger = logging.getLogger(__name__)

RETRY_STATUS = frozenset({408, 409, 425, 429})
DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"


def normalize_base_url(url: str) -> str:
    """``http://host:8000`` and ``http://host:8000/`` become ``http://host:8000/v1``; a URL with a
    path (``https://api.example.com/v1``, ``.../openai/v1``) is kept as given, without a trailing slash."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if not parts.netloc:
        raise ConfigError(f"base_url {url!r} has no host; expected e.g. {DEFAULT_BASE_URL}")
    path = parts.path.rstrip("/")
    if not path:
        path = "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def server_root(base_url: str) -> str:
    """The server root (``http://host:port``) of a base URL, where ``/health`` and ``/version`` live."""
    parts = urlsplit(base_url)
    return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


@dataclass
class RequestStats:
    """Counters of one backend: generation requests answered, retries, requests that failed for good,
    and the seconds the answered generation requests took."""

    requests: int = 0
    retries: int = 0
    failures: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class OpenAIHTTP:
    """A thread-safe HTTP client for one server, with the retry schedule of the ``openai`` backend.

    The settings mean what :class:`~anchored_reasoning.backends.openai_compat.OpenAIBackend`'s
    arguments of the same names say; the backend validates them. Setting :attr:`abort` makes
    requests in flight stop retrying (the backend does it when one request has failed for good).
    """

    base_url: str
    api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = 8
    timeout: float = 600.0
    timeout_growth: float = 2.0
    max_timeout: float = 4800.0
    max_retries: int = 5
    backoff: float = 1.0
    max_backoff: float = 30.0
    stats: RequestStats = field(default_factory=RequestStats)
    abort: threading.Event = field(default_factory=threading.Event, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _client: Any = field(default=None, repr=False)

    def record_answer(self, seconds: float) -> None:
        """Count one answered generation request that took ``seconds``."""
        with self.lock:
            self.stats.requests += 1
            self.stats.seconds += seconds

    def post(self, path: str, body: dict[str, Any], *, model: str | None = None) -> dict[str, Any]:
        return self.request("POST", path, body, model=model)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None, *,
                retries: int | None = None, model: str | None = None) -> Any:
        """``method`` ``base_url + path`` with a JSON ``body``; the parsed JSON answer.

        Retries what a retry can fix (see the module docstring), waiting ``Retry-After`` when the
        server names it; raises :class:`BackendError` at once for other 4xx answers (with a hint:
        the API key, the URL, or ``model``, the name sent) and when the retries are spent."""
        import httpx

        url = self.base_url + path
        retries = self.max_retries if retries is None else retries
        client = self.get_client()
        last = "no attempt"
        attempts = 0
        timeout = self.timeout
        for attempt in range(retries + 1):
            if attempt:
                with self.lock:
                    self.stats.retries += 1
            delay = None
            try:
                resp = client.request(method, url, json=body, timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)))
            except httpx.ReadTimeout as exc:
                last = f"timed out after {timeout:g} s waiting for the answer ({type(exc).__name__})"
                grown = min(self.max_timeout, timeout * self.timeout_growth)
                if grown > timeout:
                    last += f"; the retry waits {grown:g} s"
                timeout = grown
            except httpx.TimeoutException as exc:
                last = f"timed out after {timeout:g} s ({type(exc).__name__})"
            except httpx.TransportError as exc:
                last = f"connection failed ({type(exc).__name__}: {exc})"
            else:
                if resp.status_code < 300:
                    try:
                        return resp.json()
                    except ValueError:
                        raise BackendError(f"{method} {url} answered {resp.status_code} with a body that is not JSON: {resp.text[:200]!r}") from None
                detail = _error_detail(resp)
                if resp.status_code in RETRY_STATUS or resp.status_code >= 500:
                    last = f"HTTP {resp.status_code}: {detail}"
                    delay = _retry_after(resp)
                else:
                    hint = ""
                    if resp.status_code in (401, 403):
                        hint = f" (check the API key in ${self.api_key_env})"
                    elif resp.status_code == 404:
                        hint = f" (is {self.base_url} the server's /v1 URL, and does it serve {path}? try mode='chat' or 'completions')"
                    elif resp.status_code in (400, 422):
                        hint = f" (is the model name {model!r} the one the server serves?)"
                    raise BackendError(f"{method} {url} failed with HTTP {resp.status_code}: {detail}{hint}")
            attempts = attempt + 1
            if attempt == retries or self.abort.is_set():
                break
            wait_s = delay if delay is not None else self.backoff * (2**attempt) * random.uniform(0.8, 1.2)
            wait_s = min(self.max_backoff, wait_s)
            logger.warning("openai backend: %s %s: %s; retry %d/%d in %.1f s", method, url, last, attempt + 1, retries, wait_s)
            if self.abort.wait(wait_s):
                break
        with self.lock:
            self.stats.failures += 1
        raise BackendError(
            f"{method} {url} failed after {attempts} attempt(s): {last}. Is the server at {self.base_url} "
            f"running and healthy? (start one with `anchored-reasoning serve MODEL`); rerun the same command "
            f"to resume: finished records are kept"
        )

    def get_client(self):
        """The shared ``httpx.Client`` (made on first use, when the API key is read)."""
        import httpx

        with self.lock:
            if self._client is None:
                headers = {"Content-Type": "application/json"}
                key = os.environ.get(self.api_key_env)
                if key:
                    headers["Authorization"] = f"Bearer {key}"
                self._client = httpx.Client(
                    headers=headers,
                    timeout=httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0)),
                    limits=httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency),
                    trust_env=False,
                )
            return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # ----- server discovery -----

    def probe(self, path: str):
        """GET ``path`` on the server root; returns (status, parsed JSON or None), or (None, None) when down."""
        import httpx

        client = self.get_client()
        try:
            resp = client.get(server_root(self.base_url) + path, timeout=min(self.timeout, 10.0))
        except httpx.HTTPError:
            return None, None
        try:
            payload = resp.json() if resp.content else None
        except ValueError:
            payload = None
        return resp.status_code, payload

    def detect_kind(self) -> str:
        """vLLM answers ``/version`` with ``{"version": ...}``; ``transformers serve`` answers
        ``/health`` with ``{"status": "ok"}`` (vLLM's ``/health`` has an empty body). A server that
        does not answer at all is waited for with the usual retry schedule, then reported."""
        for attempt in range(self.max_retries + 1):
            status, payload = self.probe("/version")
            status2, payload2 = self.probe("/health")
            if status is not None or status2 is not None:
                break
            if attempt == self.max_retries:
                raise BackendError(
                    f"no server answers at {server_root(self.base_url)} after {attempt + 1} attempt(s). Is it running? "
                    f"(start one with `anchored-reasoning serve MODEL`); rerun the same command to resume"
                )
            wait_s = min(self.max_backoff, self.backoff * (2**attempt))
            logger.warning("openai backend: no answer from %s; retry %d/%d in %.1f s", self.base_url, attempt + 1, self.max_retries, wait_s)
            time.sleep(wait_s)
        if status == 200 and isinstance(payload, dict) and "version" in payload:
            return "vllm"
        if status2 == 200 and isinstance(payload2, dict) and payload2.get("status") == "ok":
            return "transformers"
        return "openai"


def _error_detail(resp) -> str:
    try:
        payload = resp.json()
    except ValueError:
        return resp.text[:300] or resp.reason_phrase
    if isinstance(payload, dict):
        err = payload.get("error") or payload.get("detail") or payload.get("message") or payload
        if isinstance(err, dict):
            err = err.get("message") or err
        return short(err)
    return short(payload)


def _retry_after(resp) -> float | None:
    value = resp.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def short(obj: Any, limit: int = 300) -> str:
    """``obj`` (a string, or JSON-dumped) cut to ``limit`` characters, for error messages."""
    text = obj if isinstance(obj, str) else json.dumps(obj, default=str)
    return text if len(text) <= limit else text[:limit] + "..."
