"""Forced choice for masked diffusion LMs: does the model look the answer up, read without decoding?

A generated accuracy mixes the lookup with the sampler (which position it unmasks first, EOS filling
the window, loops). The forced choice isolates the lookup: the prompt in the model's trained format,
then the first derivation step with only its object masked (``<entity> is a <mask>.``), and the two
options' scores at the mask compared. For a 1-hop ProsQA problem that object is the answer.

>>> masked_choice(model, tokenizer, examples)          # share of problems where the right option wins
"""
from __future__ import annotations

from typing import Any, Sequence

from anchored_reasoning.types import Example


def masked_choice(model: Any, tokenizer: Any, examples: Sequence[Example], *, method: str = "cot",
                  task: str = "prosqa") -> float:
    """Share of ``examples`` (ProsQA, with ``meta`` entity/answer_concept/neg_concept) whose right option
    scores above the wrong one at the masked object of the first step.

    ``method``: the trained format the model was fine-tuned in, ``cot`` (the derivation first) or
    ``nocot`` (``### <entity> is a <mask>.``). Each option must be one token (ProsQA's concepts are,
    with the logic tokenizer); otherwise a ValueError names the problem."""
    import torch

    from anchored_reasoning.methods import get_method

    if method not in ("cot", "nocot"):
        raise ValueError(f"masked_choice: method must be 'cot' or 'nocot', got {method!r}")
    if tokenizer.mask_token_id is None:
        raise ValueError("masked_choice needs a tokenizer with a mask token")
    render = get_method(method, style="trained")
    dot = tokenizer(".", add_special_tokens=False)["input_ids"]
    right = 0
    for ex in examples:
        meta = ex.meta or {}
        try:
            ent, a, b = meta["entity"], meta["answer_concept"], meta["neg_concept"]
        except KeyError as exc:
            raise ValueError(f"{ex.id}: masked_choice needs ProsQA meta (entity, answer_concept, neg_concept); "
                             f"missing {exc}") from None
        prompt = tokenizer(render.render(ex, task).prompt)["input_ids"]
        lead = tokenizer(f"### {ent} is a" if method == "nocot" else f"{ent} is a", add_special_tokens=False)["input_ids"]
        ia, ib = (tokenizer(" " + c, add_special_tokens=False)["input_ids"] for c in (a, b))
        if len(ia) != 1 or len(ib) != 1:
            raise ValueError(f"{ex.id}: an option is not one token ({a!r} -> {ia}, {b!r} -> {ib}); the forced choice needs one")
        ids = torch.tensor([prompt + lead + [tokenizer.mask_token_id] + dot])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) + len(lead)]
        right += int(logits[ia[0]] > logits[ib[0]])
    return right / len(examples) if examples else float("nan")
