"""Token shift: each input embedding also carries learned projections of the few tokens before it.

    model = add_token_shift(AutoModelForCausalLM.from_pretrained("logic-gpt2 dir"), 3)

At position ``t`` the embedding becomes ``e(x_t) + sum_j P_j e(x_{t-j})`` for ``j = 1..n`` (zero before
the start), the ``P_j`` initialised to zero so the wrapped model starts as the original. It is RWKV's
token shift / the short convolution of H3 and Based, on the input only. Why: in "Bob is a wumpus." the
subject sits three tokens before the object, and a small attention model must first grow a chain of
relative-position heads to bring it there before any lookup can be learnt -- the 0.93M logic backbone
stays at chance on that recall for thousands of steps, and learns it in a few hundred with ``n = 3``
(``benchmarks/assoc_recall.py``). A tied output head keeps reading the token embedding itself.

This wraps a model in memory for training loops that feed whole sequences (no KV cache: with a cache
the new token's predecessors would be missing, so generation must run with ``use_cache=False``).
"""
from __future__ import annotations

from typing import Any


def add_token_shift(model: Any, n: int) -> Any:
    """Replace ``model``'s input embedding by a token-shifted one (``n`` previous tokens); returns it."""
    import torch

    if n < 1:
        raise ValueError(f"token shift needs n >= 1 previous tokens, got {n}")
    emb = model.get_input_embeddings()

    class ShiftedEmbedding(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = emb
            dim = emb.embedding_dim
            self.proj = torch.nn.ModuleList(torch.nn.Linear(dim, dim, bias=False) for _ in range(n))
            for lin in self.proj:
                torch.nn.init.zeros_(lin.weight)

        @property
        def weight(self):
            return self.emb.weight

        @property
        def embedding_dim(self) -> int:
            return emb.embedding_dim

        def forward(self, ids):
            e = self.emb(ids)
            out = e
            for j, lin in enumerate(self.proj, start=1):
                out = out + lin(torch.nn.functional.pad(e[:, :-j], (0, 0, j, 0)))
            return out

    model.set_input_embeddings(ShiftedEmbedding())
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.use_cache = False
    return model
