"""Continuous thoughts (Coconut): the forward passes that feed a causal LM's last hidden state back as the
input embedding of each ``<thought>`` placeholder. Shared by training (``CoconutSFTTrainer``) and generation
(the HF backend), so the two compute the same thoughts.

For a batch whose thought placeholders sit in columns ``p_1 < ... < p_n`` (the union over rows)::

    pass 0      columns [0, p_1)            -> the hidden state at p_1 - 1 becomes the embedding at p_1
    pass j      columns [p_{j-1}, p_j)      -> the hidden state at p_j - 1 becomes the embedding at p_j
    final pass  columns [p_n, L)            -> logits for the loss / the first generated token

Every column is computed once; the keys and values of earlier columns come from the cache (the KV-cache
shortcut Coconut uses). ``cache=False`` recomputes every pass from column 0 instead: the same numbers up to
float rounding, n + 1 full passes. When the rows' thoughts are aligned (the collator left-pads them to the
same columns; a left-padded batch of prompts that end in ``<eot>[BoR]`` has them aligned already) there are
exactly n + 1 passes for n thoughts per row. Position ids count real tokens only (``cumsum(mask) - 1``), so
left padding does not move them.

vLLM (and any server behind the ``openai`` backend) generates from token ids only and cannot feed a hidden
state back: :func:`require_latent_backend` refuses a latent method there before anything is generated.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from anchored_reasoning.errors import ConfigError

log = logging.getLogger(__name__)

THOUGHT_TOKEN = "<thought>"
#: backends that can run the latent passes (the local HF model; the others see token ids only)
LATENT_BACKENDS = ("hf",)


@dataclass
class LatentPasses:
    """What :func:`latent_forward` computed: the input embeddings with every thought filled in, the final
    pass's logits (columns ``start`` .. L-1, or None when not asked for) and how many forward passes ran."""

    inputs_embeds: Any
    logits: Any
    start: int
    passes: int
    thoughts: Any  # (n_thoughts_total, hidden): the filled thought states, row-major in column order
    cache: Any = None  # the KV cache of every column (cache=True), for generation to go on from


def thought_id(tokenizer: Any) -> int | None:
    """The id of the ``<thought>`` placeholder in ``tokenizer``, or None when it has none."""
    vocab = tokenizer.get_vocab()
    return vocab.get(THOUGHT_TOKEN)


def position_ids_of(attention_mask: Any) -> Any:
    """Positions that count real tokens only: left padding does not shift them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _last_hidden(outputs: Any) -> Any:
    hidden = getattr(outputs, "hidden_states", None)
    if not hidden:
        raise ConfigError("the model returned no hidden states (output_hidden_states=True): continuous thoughts "
                          "need a causal LM that returns them (GPT-2, Llama, SmolLM2, Qwen2.5 do)")
    return hidden[-1]


def input_embeddings(model: Any, input_ids: Any, attention_mask: Any) -> Any:
    """The vectors ``model`` feeds its first layer for ``input_ids``: the token embeddings, or for a model with
    a token shift (``models/shift.py``: each embedding adds projections of the few before it) the shifted ones.
    A thought then replaces its position's whole input vector, and a later position's shift reads the
    ``<thought>`` token's embedding there, as a cached ``generate`` (which sees token ids) does."""
    shifted = getattr(model, "shifted_embeddings", None)
    if shifted is not None:
        return shifted(input_ids, attention_mask=attention_mask)
    return model.get_input_embeddings()(input_ids)


def latent_forward(model: Any, input_ids: Any, attention_mask: Any, thought: int, *, cache: bool = True,
                   logits: bool = True) -> LatentPasses:
    """Run ``model`` over ``input_ids`` with each ``thought`` token's embedding replaced by the last hidden
    state of the position before it (see the module docstring). ``logits=False`` keeps the final pass's
    logits of the last column only (the generator needs the cache, not the scores). Raises
    :class:`ConfigError` for a thought in column 0."""
    import torch

    embeds = input_embeddings(model, input_ids, attention_mask)
    positions = position_ids_of(attention_mask)
    is_thought = input_ids == thought
    columns = sorted(set(torch.nonzero(is_thought.any(0)).flatten().tolist()))
    if columns and columns[0] == 0:
        raise ConfigError("a <thought> token in the first column has no position before it to take its state from")
    past = None
    if cache:
        from transformers import DynamicCache

        past = DynamicCache()
    done = 0  # columns [0, done) are in the cache (cache=True)
    passes = 0
    filled = []
    for p in columns:
        lo = done if cache else 0
        out = model(inputs_embeds=embeds[:, lo:p], attention_mask=attention_mask[:, :p],
                    position_ids=positions[:, lo:p], past_key_values=past, use_cache=cache,
                    output_hidden_states=True, logits_to_keep=1)
        passes += 1
        rows = torch.nonzero(is_thought[:, p]).flatten()
        state = _last_hidden(out)[rows, p - 1 - lo]
        filled.append(state)
        embeds = embeds.index_put((rows, torch.full_like(rows, p)), state)
        done = p
    final = None
    start = done if cache else 0
    if start < embeds.shape[1]:
        out = model(inputs_embeds=embeds[:, start:], attention_mask=attention_mask, position_ids=positions[:, start:],
                    past_key_values=past, use_cache=cache, **({} if logits else {"logits_to_keep": 1}))
        passes += 1
        final = out.logits
    states = torch.cat(filled) if filled else embeds.new_zeros((0, embeds.shape[-1]))
    return LatentPasses(inputs_embeds=embeds, logits=final, start=start, passes=passes, thoughts=states, cache=past)


def generation_inputs(model: Any, tokenizer: Any, input_ids: Any, attention_mask: Any) -> dict[str, Any] | None:
    """``model.generate`` keywords for a left-padded batch whose prompts hold ``<thought>`` placeholders: the
    ``input_ids`` and ``past_key_values``, the cache of every prompt column but the last computed with the
    thoughts filled in, so ``generate`` runs the last prompt token and decodes on from there (any causal LM
    whose ``generate`` takes a cache; no ``inputs_embeds`` support needed). None when the tokenizer has no
    such token or no prompt holds one: the caller generates from ``input_ids`` as usual."""
    import torch

    tid = thought_id(tokenizer)
    if tid is None or not bool((input_ids == tid).any()):
        return None
    if bool((input_ids[:, -1] == tid).any()):
        raise ConfigError("a prompt ends in a <thought>: the thoughts must be closed (<eot>) inside the prompt")
    with torch.inference_mode():
        passes = latent_forward(model, input_ids[:, :-1], attention_mask[:, :-1], tid, cache=True, logits=False)
    log.debug("latent generation: %d thought pass(es) for a batch of %d", passes.passes, input_ids.shape[0])
    return {"input_ids": input_ids, "past_key_values": passes.cache}


def require_latent_backend(method: Any, backend: Any) -> None:
    """Refuse a method with continuous thoughts (``method.latent``) on a backend that cannot feed hidden
    states back (vLLM, an OpenAI-compatible server, the diffusion sampler)."""
    if not getattr(method, "latent", False):
        return
    name = getattr(backend, "name", type(backend).__name__)
    if name not in LATENT_BACKENDS:
        raise ConfigError(
            f"method {getattr(method, 'name', method)!r} generates continuous thoughts (each <thought> is the "
            f"model's last hidden state fed back as an input embedding), which backend {name!r} cannot do: it "
            "generates from token ids only. Evaluate it with --backend hf")
