"""Length-bucketed prompt pass for the HF backend's batches.

A batch of left-padded prompts costs its rows times its longest prompt in the prompt pass: with GSM8K-like prompt
lengths (100 to 250 tokens) a batch of 16 pays ~40% more tokens than it holds. :func:`bucketed_prefill` runs that
pass in groups of similar length instead (:func:`plan_buckets`), each group padded only to its own longest prompt,
and joins their key/value caches into one left-padded cache of the batch's width; ``generate`` then goes on from it
(one step over the last prompt token of every row, then decoding as before). A token's keys and values depend on its
position (counted from the row's first real token, as ``generate`` counts it) and on the tokens before it, not on
the padding in front, so the joined cache holds what the one padded pass computes, up to floating-point rounding; the
padded slots are masked out. Only for models whose cache is a plain per-layer key/value list (``DynamicLayer``);
anything else (sliding windows, recurrent states) keeps the one padded pass.
"""
from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

#: Fixed cost of one extra forward call, in prompt tokens: a split must save more than this to be made.
CALL_OVERHEAD_TOKENS = 32
#: Bucket only when the plan saves at least this share of the padded prompt pass.
MIN_SAVING = 0.1


def plan_buckets(lengths: list[int], overhead: int = CALL_OVERHEAD_TOKENS) -> list[list[int]]:
    """Row indices grouped by length (longest first) so that the padded tokens of all groups plus ``overhead`` per
    group is least (exact, by dynamic programming over the length order). One group when splitting saves less than
    :data:`MIN_SAVING` of the one padded pass."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    if not order:
        return []
    sizes = [lengths[i] for i in order]
    best = [0.0] + [float("inf")] * len(order)  # best[i]: least cost of the first i rows (in length order)
    cut = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        for start in range(end):
            cost = best[start] + (end - start) * sizes[start] + overhead
            if cost < best[end]:
                best[end], cut[end] = cost, start
    groups, end = [], len(order)
    while end > 0:
        groups.append(order[cut[end]:end])
        end = cut[end]
    groups.reverse()
    if len(groups) > 1 and best[-1] > (1 - MIN_SAVING) * (len(order) * sizes[0] + overhead):
        return [order]
    return groups


def bucketed_prefill(model, ids: list[list[int]], pad_id: int) -> Any | None:
    """The key/value cache of every row's prompt but its last token, computed in length buckets and joined
    left-padded to the batch's width minus one (a ``DynamicCache``), or None when one padded pass is as cheap or the
    model's cache is not a plain key/value list. ``ids``: the rows' prompt token ids (unpadded, each non-empty)."""
    import torch
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    from anchored_reasoning.backends import left_pad

    groups = plan_buckets([len(x) - 1 for x in ids])
    if len(groups) < 2:
        return None
    width = max(len(x) for x in ids) - 1
    device = next(model.parameters()).device
    joined: list[tuple[Any, Any]] | None = None
    for rows in groups:
        rows = [r for r in rows if len(ids[r]) > 1]  # a one-token prompt has nothing before its last token
        if not rows:
            continue
        heads = [ids[r][:-1] for r in rows]
        sub, mask = left_pad(heads, pad_id)
        sub, mask = sub.to(device), mask.to(device)
        position_ids = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)  # as generate counts positions
        cache = model(input_ids=sub, attention_mask=mask, position_ids=position_ids, use_cache=True).past_key_values
        layers = getattr(cache, "layers", None)
        if not layers or any(type(layer) is not DynamicLayer for layer in layers):
            log.debug("bucketed prefill: %s's cache is not plain key/value layers; one padded pass instead",
                      type(model).__name__)
            return None
        if joined is None:
            joined = [(layer.keys.new_zeros((len(ids), *layer.keys.shape[1:2], width, layer.keys.shape[-1])),
                       layer.values.new_zeros((len(ids), *layer.values.shape[1:2], width, layer.values.shape[-1])))
                      for layer in layers]
        index = torch.tensor(rows, device=device)
        for (keys, values), layer in zip(joined, layers):  # right-aligned: left padding ends every row at the edge
            keys[index, :, width - sub.shape[1]:] = layer.keys
            values[index, :, width - sub.shape[1]:] = layer.values
    return None if joined is None else DynamicCache(ddp_cache_data=joined)
