"""Backend for any OpenAI-compatible server: ``vllm serve``, ``transformers serve``, hosted endpoints.

This module is the backend class (settings, the thread pool, the server differences below);
``openai_http`` is its HTTP client (retries, errors, server detection) and ``openai_payloads``
builds the request bodies and reads the answers.

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

import logging
import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from anchored_reasoning.backends.openai_http import (DEFAULT_BASE_URL, RETRY_STATUS, OpenAIHTTP, RequestStats,
                                                    normalize_base_url, server_root)
from anchored_reasoning.backends.openai_payloads import (Sample, Unit, completions, finished, model_has_chat_template,
                                                        plan_units, read_samples, request_body, served_name)
from anchored_reasoning.errors import BackendError, ConfigError
from anchored_reasoning.types import Completion, Prompt, SamplingSpec

__all__ = [
    "DEFAULT_BASE_URL", "MODES", "RETRY_STATUS", "SERVER_KINDS", "OpenAIBackend", "OpenAIHTTP", "RequestStats",
    "model_has_chat_template", "normalize_base_url", "server_root",
]

logger = logging.getLogger(__name__)

SERVER_KINDS = ("auto", "vllm", "transformers", "openai")
MODES = ("auto", "completions", "chat")


def _http_setting(name: str) -> property:
    """A backend attribute that is the HTTP client's setting of the same name (read and write)."""
    return property(lambda self: getattr(self.http, name), lambda self, value: setattr(self.http, name, value),
                    doc=f"The HTTP client's ``{name}`` (:class:`OpenAIHTTP`).")


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
        self.model = served_name(model)
        self.http = OpenAIHTTP(
            normalize_base_url(base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL),
            api_key_env=api_key_env,
            concurrency=int(concurrency),
            timeout=float(timeout),
            timeout_growth=float(timeout_growth),
            max_timeout=float(max_timeout) if max_timeout is not None else 8.0 * float(timeout),
            max_retries=int(max_retries),
            backoff=float(backoff),
            max_backoff=float(max_backoff),
        )
        self.mode = mode
        self.server = server
        self.extra_body = dict(extra_body or {})
        self.batch_size = int(batch_size) if batch_size else 4 * self.concurrency
        self._kind: str | None = None if server == "auto" else server
        self._split_n = self._kind == "transformers"
        self._has_template: bool | None = None

    base_url = _http_setting("base_url")
    api_key_env = _http_setting("api_key_env")
    concurrency = _http_setting("concurrency")
    timeout = _http_setting("timeout")
    timeout_growth = _http_setting("timeout_growth")
    max_timeout = _http_setting("max_timeout")
    max_retries = _http_setting("max_retries")
    backoff = _http_setting("backoff")
    max_backoff = _http_setting("max_backoff")
    stats = _http_setting("stats")

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
            self._kind = self.http.detect_kind()
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
        results: list[list[Sample | None]] = [[None] * spec.n for _ in prompts]
        units = plan_units(len(prompts), spec, self._split_n)
        pending: dict[Future, Unit] = {}
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
                            queue.append(Unit(unit.index, j, 1, spec.seed + j))
        except BaseException as exc:
            self.http.abort.set()  # in-flight requests stop retrying
            if isinstance(exc, BackendError):
                # what did finish is not lost: the eval runner writes these records before it stops
                exc.partial = {i: completions(row, spec) for i, row in enumerate(results) if finished(row, spec)}
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            self.http.abort.clear()
        out: list[list[Completion]] = []
        for i, row in enumerate(results):
            if not finished(row, spec):  # a lost unit: never return a hole
                raise BackendError(f"openai backend: prompt {i} is missing samples after generation")
            out.append(completions(row, spec))
        return out

    def close(self) -> None:
        self.http.close()

    def __repr__(self) -> str:
        return f"OpenAIBackend(model={self.model!r}, base_url={self.base_url!r}, mode={self.mode!r}, server={self.server!r})"

    # ----- chat or completions -----

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

    # ----- one request -----

    def _run_unit(self, prompt: Prompt, unit: Unit, spec: SamplingSpec) -> list[Sample]:
        chat = self._use_chat(prompt)
        path = "/chat/completions" if chat else "/completions"
        body = request_body(prompt, unit, spec, chat=chat, kind=self.server_kind, model=self.model,
                            extra_body=self.extra_body)
        t0 = time.perf_counter()
        data = self.http.post(path, body, model=self.model)
        elapsed = time.perf_counter() - t0
        samples = read_samples(data, unit, spec, chat=chat, elapsed=elapsed, url=f"{self.base_url}{path}")
        self.http.record_answer(elapsed)
        return samples

    # ----- the model -----

    def _ensure_model(self) -> None:
        if self.model and self.model != "auto":
            return
        data = self.http.request("GET", "/models", model=self.model)
        ids = [m.get("id") for m in (data or {}).get("data", []) if m.get("id")]
        if not ids:
            raise BackendError(f"{self.base_url}/models lists no model; pass the model name explicitly")
        self.model = ids[0]
        logger.info("openai backend: using model %r from %s/models", self.model, self.base_url)

