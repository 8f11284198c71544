"""Backend for any OpenAI-compatible server: ``vllm serve``, ``transformers serve``, hosted endpoints.

Longer than ~400 lines on purpose: request building, retries with backoff and the detection of
server quirks are one protocol client; split, each part would need the others' state.

>>> from anchored_reasoning.backends import get_backend
>>> backend = get_backend("openai", "Qwen/Qwen2.5-1.5B-Instruct", base_url="http://127.0.0.1:8000/v1")

Requests go to ``/v1/completions`` (raw prompt text) or ``/v1/chat/completions`` (chat turns):
``mode="auto"`` follows the hf backend's rule: chat when the prompt carries ``messages`` and
the model has a chat template (checked in the model's directory when it is a local path,
assumed for a remote name), completions otherwise.
They run in a bounded thread pool (``concurrency``), each with a timeout, and are retried
with exponential backoff on 408/409/425/429/5xx answers, timeouts and connection errors;
when the retries are spent a :class:`BackendError` says which server failed and how.

Servers differ, and the backend absorbs the differences so that a run means the same thing
against any of them (``server="auto"`` detects the kind once, before the first request):

* ``vllm``: honours ``n``, per-request ``seed``, ``stop`` (cut from the text); asked for the
  generated token ids so that every sample has an exact token count.
* ``transformers`` (``transformers serve``): answers one choice whatever ``n`` is, keeps the
  stop string in the text, and samples only when a ``generation_config`` with ``do_sample``
  is in the request body; it serves the one model named by its path. The backend sends
  ``n`` separate requests (seed, seed+1, ...), cuts stop strings, and passes the sampling
  settings as ``generation_config``.
* ``openai`` (anything else): standard parameters only; at most 4 stop strings are sent
  (the rest are cut locally). If a server returns fewer choices than asked, the backend
  falls back to one request per sample for the rest of the run.

The API key is read from the environment variable named by ``api_key_env`` (default
``OPENAI_API_KEY``) when the first request is made, sent only in the ``Authorization`` header,
and never logged, stored in the run config or put in an error message.
"""
from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from anchored_reasoning.backends import cut_at_stop
from anchored_reasoning.errors import BackendError, ConfigError
from anchored_reasoning.types import Completion, Prompt, SamplingSpec

logger = logging.getLogger(__name__)

RETRY_STATUS = frozenset({408, 409, 425, 429})
SERVER_KINDS = ("auto", "vllm", "transformers", "openai")
MODES = ("auto", "completions", "chat")
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
class _Unit:
    """One HTTP request: ``n`` samples for prompt ``index``, starting at sample ``first``."""

    index: int
    first: int
    n: int
    seed: int


@dataclass
class _Sample:
    text: str
    n_tokens: int
    seconds: float
    finish_reason: str | None


@dataclass
class _Stats:
    requests: int = 0
    retries: int = 0
    failures: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def _finished(row: list, spec: SamplingSpec) -> bool:
    """Whether one prompt has every sample it needs (greedy: its one request)."""
    return row[0] is not None and (spec.greedy or all(x is not None for x in row))


def _completions(row: list, spec: SamplingSpec) -> list[Completion]:
    """One prompt's samples as Completions (greedy: the one request copied ``n`` times, it is deterministic)."""
    if spec.greedy:
        row = [row[0]] * spec.n
    return [Completion(s.text, s.n_tokens, s.seconds, s.finish_reason) for s in row]


class OpenAIBackend:
    """Generate through an OpenAI-compatible HTTP API (see the module docstring).

    Args:
        model: the model name the server knows (for ``vllm serve`` and ``transformers serve``:
            the path or Hub id it was started with; an alias such as ``smollm2-135m`` means the
            local checkpoint ``anchored-reasoning serve smollm2-135m`` serves). ``"auto"`` asks ``/v1/models``.
        base_url: e.g. ``http://127.0.0.1:8000/v1``; default ``$OPENAI_BASE_URL`` or that address.
        api_key_env: name of the environment variable that holds the API key (may be unset
            for local servers).
        mode: ``auto`` | ``completions`` | ``chat``.
        server: ``auto`` | ``vllm`` | ``transformers`` | ``openai``: how to talk to the server.
        concurrency: requests in flight at once.
        timeout: seconds for one request (connect timeout is min(timeout, 10)).
        timeout_growth, max_timeout: a request that timed out *waiting for the answer* (the server took
            it and is still generating: a long budget on a slow machine) is retried with its timeout
            multiplied by ``timeout_growth``, up to ``max_timeout`` (default 8 x ``timeout``), instead of
            starting the same doomed wait again; ``timeout_growth=1`` keeps it fixed.
        max_retries: retries per request after the first attempt.
        backoff: first retry delay in seconds; doubles each retry (with jitter), capped at ``max_backoff``.
        extra_body: fields merged into every request body (server-specific options).
        batch_size: prompts the eval runner hands over per call (default 4 x concurrency); a
            server failure loses at most the samples of that call, every earlier record is kept.
    """

    name = "openai"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        mode: str = "auto",
        server: str = "auto",
        concurrency: int = 8,
        timeout: float = 600.0,
        timeout_growth: float = 2.0,
        max_timeout: float | None = None,
        max_retries: int = 5,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        extra_body: dict[str, Any] | None = None,
        batch_size: int | None = None,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"openai backend: mode {mode!r} is not one of {', '.join(MODES)}")
        if server not in SERVER_KINDS:
            raise ConfigError(f"openai backend: server {server!r} is not one of {', '.join(SERVER_KINDS)}")
        if concurrency < 1:
            raise ConfigError(f"openai backend: concurrency must be >= 1, got {concurrency}")
        if max_retries < 0 or timeout <= 0 or backoff < 0:
            raise ConfigError("openai backend: max_retries >= 0, timeout > 0 and backoff >= 0 are required")
        if timeout_growth < 1 or (max_timeout is not None and max_timeout < timeout):
            raise ConfigError(f"openai backend: timeout_growth >= 1 and max_timeout >= timeout are required "
                              f"(got timeout_growth={timeout_growth}, max_timeout={max_timeout}, timeout={timeout})")
        if not api_key_env or not api_key_env.replace("_", "").isalnum():
            raise ConfigError(
                "openai backend: api_key_env must be the NAME of an environment variable (e.g. OPENAI_API_KEY), "
                "not the key itself"
            )
        self.model = _served_name(model)
        self.base_url = normalize_base_url(base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL)
        self.api_key_env = api_key_env
        self.mode = mode
        self.server = server
        self.concurrency = int(concurrency)
        self.timeout = float(timeout)
        self.timeout_growth = float(timeout_growth)
        self.max_timeout = float(max_timeout) if max_timeout is not None else 8.0 * self.timeout
        self.max_retries = int(max_retries)
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self.extra_body = dict(extra_body or {})
        self.batch_size = int(batch_size) if batch_size else 4 * self.concurrency
        self._kind: str | None = None if server == "auto" else server
        self._split_n = self._kind == "transformers"
        self._client = None
        self._lock = threading.Lock()
        self._abort = threading.Event()
        self._has_template: bool | None = None
        self.stats = _Stats()

    # ----- public API -----

    def describe(self) -> dict[str, Any]:
        """Identity of what is generated (goes into the run config). The base URL, concurrency,
        timeouts and retries are left out on purpose: a run can resume against a restarted server
        on another port, or with other retry settings, and still mean the same thing."""
        out: dict[str, Any] = {"backend": self.name, "model": self.model, "mode": self.mode, "server": self.server}
        if self.extra_body:
            out["extra_body"] = self.extra_body
        return out

    @property
    def server_kind(self) -> str:
        """The detected (or configured) server kind; probes the server on first use."""
        if self._kind is None:
            self._kind = self._detect_kind()
            self._split_n = self._kind == "transformers"
            logger.info("openai backend: %s looks like a %r server", self.base_url, self._kind)
        return self._kind

    def generate(self, prompts: list[Prompt], spec: SamplingSpec) -> list[list[Completion]]:
        if not prompts:
            return []
        if spec.n < 1:
            raise ConfigError(f"SamplingSpec.n must be >= 1, got {spec.n}")
        self._ensure_model()
        kind = self.server_kind
        if kind == "transformers" and not spec.greedy and self.concurrency > 1:
            logger.warning(
                "transformers serve seeds one global torch generator per request: sampled runs with "
                "concurrency > 1 are not reproducible sample by sample (use concurrency=1 for that)"
            )
        results: list[list[_Sample | None]] = [[None] * spec.n for _ in prompts]
        units = self._plan(len(prompts), spec)
        pending: dict[Future, _Unit] = {}
        pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="openai-backend")
        try:
            queue = list(units)
            while queue or pending:
                while queue and len(pending) < self.concurrency * 2:
                    unit = queue.pop(0)
                    pending[pool.submit(self._run_unit, prompts[unit.index], unit, spec)] = unit
                done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                for fut in done:
                    unit = pending.pop(fut)
                    samples = fut.result()  # raises BackendError: the finally block cancels the rest
                    for k, s in enumerate(samples):
                        results[unit.index][unit.first + k] = s
                    if len(samples) < unit.n:
                        # The server returned fewer choices than asked: ask for the rest one by one.
                        if not self._split_n:
                            logger.warning(
                                "openai backend: server returned %d of %d choices; switching to one request per sample",
                                len(samples), unit.n,
                            )
                            self._split_n = True
                        for j in range(unit.first + len(samples), unit.first + unit.n):
                            queue.append(_Unit(unit.index, j, 1, spec.seed + j))
        except BaseException as exc:
            self._abort.set()  # in-flight requests stop retrying
            if isinstance(exc, BackendError):
                # what did finish is not lost: the eval runner writes these records before it stops
                exc.partial = {i: _completions(row, spec) for i, row in enumerate(results) if _finished(row, spec)}
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            self._abort.clear()
        out: list[list[Completion]] = []
        for i, row in enumerate(results):
            if not _finished(row, spec):  # a lost unit: never return a hole
                raise BackendError(f"openai backend: prompt {i} is missing samples after generation")
            out.append(_completions(row, spec))
        return out

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __repr__(self) -> str:
        return f"OpenAIBackend(model={self.model!r}, base_url={self.base_url!r}, mode={self.mode!r}, server={self.server!r})"

    # ----- planning -----

    def _plan(self, n_prompts: int, spec: SamplingSpec) -> list[_Unit]:
        if spec.greedy:
            return [_Unit(i, 0, 1, spec.seed) for i in range(n_prompts)]
        if self._split_n:
            return [_Unit(i, j, 1, spec.seed + j) for i in range(n_prompts) for j in range(spec.n)]
        return [_Unit(i, 0, spec.n, spec.seed) for i in range(n_prompts)]

    def _use_chat(self, prompt: Prompt) -> bool:
        if self.mode == "chat":
            return True  # a prompt without messages becomes one user turn
        if self.mode == "completions":
            return False
        return bool(prompt.messages) and self._chat_template_available()

    def _chat_template_available(self) -> bool:
        """For ``mode="auto"``: the same rule as the hf backend (chat only when the model has a chat
        template). A model served from a local directory is checked there; a remote name is
        assumed to be a chat model."""
        if self._has_template is None:
            self._has_template = model_has_chat_template(self.model)
            if not self._has_template:
                logger.info("openai backend: %s has no chat template; sending raw prompt text to /completions", self.model)
        return self._has_template

    def _body(self, prompt: Prompt, unit: _Unit, spec: SamplingSpec, chat: bool) -> dict[str, Any]:
        kind = self.server_kind
        body: dict[str, Any] = {"model": self.model, "max_tokens": spec.max_new_tokens}
        if chat:
            body["messages"] = prompt.messages or [{"role": "user", "content": prompt.text}]
        else:
            body["prompt"] = prompt.text
        if spec.stop:
            body["stop"] = list(spec.stop) if kind != "openai" else list(spec.stop)[:4]
        body["seed"] = unit.seed
        if kind == "transformers":
            # Only a generation_config turns sampling on there; top_k 0 matches vLLM/OpenAI (no top-k cut).
            gen: dict[str, Any] = {"max_new_tokens": spec.max_new_tokens, "do_sample": not spec.greedy}
            if not spec.greedy:
                gen.update(temperature=spec.temperature, top_p=spec.top_p, top_k=0)
            body["generation_config"] = json.dumps(gen)
        else:
            body["temperature"] = 0.0 if spec.greedy else spec.temperature
            if not spec.greedy:
                body["top_p"] = spec.top_p
            if unit.n > 1:
                body["n"] = unit.n
            if kind == "vllm":
                body["return_token_ids"] = True
        body.update(self.extra_body)
        return body

    # ----- one request -----

    def _run_unit(self, prompt: Prompt, unit: _Unit, spec: SamplingSpec) -> list[_Sample]:
        chat = self._use_chat(prompt)
        path = "/chat/completions" if chat else "/completions"
        body = self._body(prompt, unit, spec, chat)
        t0 = time.perf_counter()
        data = self._post(path, body)
        elapsed = time.perf_counter() - t0
        choices = sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))[: unit.n]
        if not choices:
            raise BackendError(f"{self.base_url}{path} answered without choices: {_short(data)}")
        usage = data.get("usage") or {}
        texts: list[str] = []
        for c in choices:
            if chat:
                texts.append((c.get("message") or {}).get("content") or "")
            else:
                texts.append(c.get("text") or "")
        counts = _token_counts(choices, texts, usage)
        samples = []
        for c, text, n_tok in zip(choices, texts, counts):
            text, cut = cut_at_stop(text, spec.stop)
            finish = c.get("finish_reason")
            if cut:
                finish = "stop"
            samples.append(_Sample(text, n_tok, elapsed / len(choices), finish))
        with self._lock:
            self.stats.requests += 1
            self.stats.seconds += elapsed
        return samples

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._request("POST", path, body)

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None, *, retries: int | None = None) -> Any:
        import httpx

        url = self.base_url + path
        retries = self.max_retries if retries is None else retries
        client = self._get_client()
        last = "no attempt"
        attempts = 0
        timeout = self.timeout
        for attempt in range(retries + 1):
            if attempt:
                with self._lock:
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
                        hint = f" (is the model name {self.model!r} the one the server serves?)"
                    raise BackendError(f"{method} {url} failed with HTTP {resp.status_code}: {detail}{hint}")
            attempts = attempt + 1
            if attempt == retries or self._abort.is_set():
                break
            wait_s = delay if delay is not None else self.backoff * (2**attempt) * random.uniform(0.8, 1.2)
            wait_s = min(self.max_backoff, wait_s)
            logger.warning("openai backend: %s %s: %s; retry %d/%d in %.1f s", method, url, last, attempt + 1, retries, wait_s)
            if self._abort.wait(wait_s):
                break
        with self._lock:
            self.stats.failures += 1
        raise BackendError(
            f"{method} {url} failed after {attempts} attempt(s): {last}. Is the server at {self.base_url} "
            f"running and healthy? (start one with `anchored-reasoning serve MODEL`); rerun the same command "
            f"to resume: finished records are kept"
        )

    def _get_client(self):
        import httpx

        with self._lock:
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

    # ----- server discovery -----

    def _probe(self, path: str):
        """GET ``path`` on the server root; returns (status, parsed JSON or None), or (None, None) when down."""
        import httpx

        client = self._get_client()
        try:
            resp = client.get(server_root(self.base_url) + path, timeout=min(self.timeout, 10.0))
        except httpx.HTTPError:
            return None, None
        try:
            payload = resp.json() if resp.content else None
        except ValueError:
            payload = None
        return resp.status_code, payload

    def _detect_kind(self) -> str:
        """vLLM answers ``/version`` with ``{"version": ...}``; ``transformers serve`` answers
        ``/health`` with ``{"status": "ok"}`` (vLLM's ``/health`` has an empty body). A server that
        does not answer at all is waited for with the usual retry schedule, then reported."""
        for attempt in range(self.max_retries + 1):
            status, payload = self._probe("/version")
            status2, payload2 = self._probe("/health")
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

    def _ensure_model(self) -> None:
        if self.model and self.model != "auto":
            return
        data = self._request("GET", "/models")
        ids = [m.get("id") for m in (data or {}).get("data", []) if m.get("id")]
        if not ids:
            raise BackendError(f"{self.base_url}/models lists no model; pass the model name explicitly")
        self.model = ids[0]
        logger.info("openai backend: using model %r from %s/models", self.model, self.base_url)


def _served_name(model: str) -> str:
    """A model alias (``smollm2-135m``) means the local checkpoint ``anchored-reasoning serve`` served
    it from, which is the name the server knows; any other name is sent as given."""
    try:
        from anchored_reasoning.models.zoo import ALIASES, resolve_model
    except ImportError:
        return model
    return str(resolve_model(model)) if model in ALIASES else model


def model_has_chat_template(model: str) -> bool:
    """Whether a local checkpoint directory has a chat template (tokenizer_config.json's
    ``chat_template`` or a ``chat_template.jinja``/``.json`` file); True for a non-local name."""
    folder = Path(model.split("@", 1)[0]) if model else None
    if folder is None or not folder.is_dir():
        return True
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(config.get("chat_template"))


def _token_counts(choices: list[dict], texts: list[str], usage: dict) -> list[int]:
    """Generated tokens per choice: the token ids when the server returns them (vLLM), the usage
    count when there is one choice, else the usage total split in proportion to text length."""
    if all(isinstance(c.get("token_ids"), list) for c in choices):
        return [len(c["token_ids"]) for c in choices]
    total = usage.get("completion_tokens")
    if total is None:
        return [0] * len(choices)
    if len(choices) == 1:
        return [int(total)]
    lengths = [max(len(t), 1) for t in texts]
    scale = int(total) / sum(lengths)
    return [int(round(n * scale)) for n in lengths]


def _error_detail(resp) -> str:
    try:
        payload = resp.json()
    except ValueError:
        return resp.text[:300] or resp.reason_phrase
    if isinstance(payload, dict):
        err = payload.get("error") or payload.get("detail") or payload.get("message") or payload
        if isinstance(err, dict):
            err = err.get("message") or err
        return _short(err)
    return _short(payload)


def _retry_after(resp) -> float | None:
    value = resp.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _short(obj: Any, limit: int = 300) -> str:
    text = obj if isinstance(obj, str) else json.dumps(obj, default=str)
    return text if len(text) <= limit else text[:limit] + "..."
