"""What the ``openai`` backend sends and reads: request planning, request bodies, answers.

Pure functions, no HTTP (that is ``openai_http``): how a batch of prompts becomes requests
(:func:`plan_units`: one per prompt, or one per sample where the server ignores ``n``), the
JSON body of one request for each server kind (:func:`request_body`), and an answer's choices
turned into samples with text cut at the stop strings and exact or estimated token counts
(:func:`read_samples`). Also the model-name rules: which name a model alias is served under,
and whether a local checkpoint has a chat template.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anchored_reasoning.backends import cut_at_stop
from anchored_reasoning.backends.openai_http import short
from anchored_reasoning.errors import BackendError
from anchored_reasoning.types import Completion, Prompt, SamplingSpec


@dataclass
class Unit:
    """One HTTP request: ``n`` samples for prompt ``index``, starting at sample ``first``."""

    index: int
    first: int
    n: int
    seed: int


@dataclass
class Sample:
    text: str
    n_tokens: int
    seconds: float
    finish_reason: str | None


def plan_units(n_prompts: int, spec: SamplingSpec, split_n: bool) -> list[Unit]:
    """The requests for ``n_prompts`` prompts: one each when greedy (the answer is copied ``n``
    times), one per sample (seeds ``seed``, ``seed+1``, ...) when ``split_n``, else one asking for ``n``."""
    if spec.greedy:
        return [Unit(i, 0, 1, spec.seed) for i in range(n_prompts)]
    if split_n:
        return [Unit(i, j, 1, spec.seed + j) for i in range(n_prompts) for j in range(spec.n)]
    return [Unit(i, 0, spec.n, spec.seed) for i in range(n_prompts)]


def finished(row: list, spec: SamplingSpec) -> bool:
    """Whether one prompt has every sample it needs (greedy: its one request)."""
    return row[0] is not None and (spec.greedy or all(x is not None for x in row))


def completions(row: list, spec: SamplingSpec) -> list[Completion]:
    """One prompt's samples as Completions (greedy: the one request copied ``n`` times, it is deterministic)."""
    if spec.greedy:
        row = [row[0]] * spec.n
    return [Completion(s.text, s.n_tokens, s.seconds, s.finish_reason) for s in row]


def request_body(prompt: Prompt, unit: Unit, spec: SamplingSpec, *, chat: bool, kind: str, model: str,
                 extra_body: dict[str, Any]) -> dict[str, Any]:
    """The JSON body of one request to a ``kind`` server (``vllm`` | ``transformers`` | ``openai``):
    ``messages`` for chat, ``prompt`` text otherwise; ``extra_body`` is merged in last."""
    body: dict[str, Any] = {"model": model, "max_tokens": spec.max_new_tokens}
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
    body.update(extra_body)
    return body


def read_samples(data: dict[str, Any], unit: Unit, spec: SamplingSpec, *, chat: bool, elapsed: float,
                 url: str) -> list[Sample]:
    """The samples in one answer (at most ``unit.n``, in choice order), each text cut at the first
    stop string (then its finish reason is ``stop``) and given ``elapsed`` split evenly.
    An answer without choices is a :class:`BackendError` naming ``url``."""
    choices = sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))[: unit.n]
    if not choices:
        raise BackendError(f"{url} answered without choices: {short(data)}")
    usage = data.get("usage") or {}
    texts: list[str] = []
    for c in choices:
        if chat:
            texts.append((c.get("message") or {}).get("content") or "")
        else:
            texts.append(c.get("text") or "")
    counts = token_counts(choices, texts, usage)
    samples = []
    for c, text, n_tok in zip(choices, texts, counts):
        text, cut = cut_at_stop(text, spec.stop)
        finish = c.get("finish_reason")
        if cut:
            finish = "stop"
        samples.append(Sample(text, n_tok, elapsed / len(choices), finish))
    return samples


def token_counts(choices: list[dict], texts: list[str], usage: dict) -> list[int]:
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


def served_name(model: str) -> str:
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
