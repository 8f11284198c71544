"""Token shift: each input embedding also carries learned projections of the few tokens before it.

    model = add_token_shift(AutoModelForCausalLM.from_pretrained("logic-gpt2 dir"), 3)

At position ``t`` the embedding becomes ``e(x_t) + sum_j P_j e(x_{t-j})`` for ``j = 1..n`` (zero before
the start), the ``P_j`` initialised to zero so the wrapped model starts as the original. It is RWKV's
token shift / the short convolution of H3 and Based, on the input only. Why: in "Bob is a wumpus." the
subject sits three tokens before the object, and a small attention model must first grow a chain of
relative-position heads to bring it there before any lookup can be learnt -- the 0.93M logic backbone
stays at chance on that recall for thousands of steps, and learns it in a few hundred with ``n = 3``
(``research/binding/assoc_recall.py``). A tied output head keeps reading the token embedding itself.

This wraps a model in memory for training loops that feed whole sequences (no KV cache: with a cache
the new token's predecessors would be missing, so generation must run with ``use_cache=False``).
"""
from __future__ import annotations

from typing import Any


def shift_sum(e, src, projections):
    """``e + sum_j projections[j-1](src shifted right by j)`` over a (batch, time, dim) tensor: the token
    shift itself (``src`` is ``e``, or ``e`` with padding zeroed)."""
    import torch

    out = e
    for j, lin in enumerate(projections, start=1):
        out = out + lin(torch.nn.functional.pad(src[:, :-j], (0, 0, j, 0)))
    return out


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
            return shift_sum(e, e, self.proj)

    model.set_input_embeddings(ShiftedEmbedding())
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.use_cache = False
    return model


# --- a saved model type: GPT-2 with a token-shifted input -----------------------------------------

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model  # noqa: E402
from transformers.models.gpt2.modeling_gpt2 import GPT2PreTrainedModel  # noqa: E402


class ShiftGPT2Config(GPT2Config):
    """GPT-2 plus ``token_shift``: how many previous tokens' embeddings each input embedding adds."""

    model_type = "shift-gpt2"

    def __init__(self, token_shift: int = 3, **kwargs):
        super().__init__(**kwargs)
        self.token_shift = token_shift


class ShiftGPT2Model(GPT2Model):
    """The GPT-2 backbone (``model.transformer``) with the shift applied to its input embeddings.

    The shift lives here and not in the LM-head model because trainers call the backbone directly:
    TRL's fused LM head (``model(..., fused_lm_head=True)``, which SFT/GRPO training use) runs
    ``model.base_model(...)`` and then the head, skipping the LM-head model's own ``forward``. A shift
    applied there trained nothing and was missing from the training forward altogether.

    Positions the attention mask marks as padding contribute nothing to their successors' shift (so a
    left-padded prompt starts as a sequence does in training). ``shift_prefix``: the ``token_shift``
    tokens before ``input_ids`` (a KV-cached decoding step passes them).
    """

    config_class = ShiftGPT2Config

    def __init__(self, config: ShiftGPT2Config):
        super().__init__(config)
        import torch

        dim = config.n_embd
        self.shift_proj = torch.nn.ModuleList(torch.nn.Linear(dim, dim, bias=False) for _ in range(config.token_shift))
        self.post_init()
        self.zero_shift()

    def zero_shift(self) -> None:
        """Zero projections: the model computes exactly what plain GPT-2 with these weights computes."""
        import torch

        for lin in self.shift_proj:
            torch.nn.init.zeros_(lin.weight)

    def shifted_embeddings(self, input_ids, shift_prefix=None, attention_mask=None):
        import torch

        n_pre = 0 if shift_prefix is None else shift_prefix.shape[1]
        ids = input_ids if not n_pre else torch.cat([shift_prefix, input_ids], dim=1)
        e = self.wte(ids)
        src = e
        if attention_mask is not None and attention_mask.ndim == 2 and attention_mask.shape[1] >= ids.shape[1]:
            src = e * attention_mask[:, -ids.shape[1]:, None].to(e.dtype)
        return shift_sum(e, src, self.shift_proj)[:, n_pre:]

    def forward(self, input_ids=None, past_key_values=None, attention_mask=None, token_type_ids=None,
                position_ids=None, inputs_embeds=None, shift_prefix=None, **kwargs):
        if inputs_embeds is None and input_ids is not None:
            inputs_embeds = self.shifted_embeddings(input_ids, shift_prefix, attention_mask)
            input_ids = None
        return super().forward(input_ids=input_ids, past_key_values=past_key_values, attention_mask=attention_mask,
                               token_type_ids=token_type_ids, position_ids=position_ids, inputs_embeds=inputs_embeds,
                               **kwargs)


class ShiftGPT2LMHeadModel(GPT2LMHeadModel):
    """``GPT2LMHeadModel`` on a :class:`ShiftGPT2Model`: the input embedding at ``t`` is
    ``e(x_t) + sum_j P_j e(x_{t-j})`` (weights under ``transformer.shift_proj``).

    With a KV cache, ``generate`` passes the ``token_shift`` tokens before the new ones as
    ``shift_prefix`` (see ``prepare_inputs_for_generation``), so cached and uncached decoding give the
    same logits.
    """

    config_class = ShiftGPT2Config

    def __init__(self, config: ShiftGPT2Config):
        # GPT2LMHeadModel.__init__ would build (and initialise) a plain GPT2Model only to be replaced:
        # skip to the base class and build the shifted one once.
        GPT2PreTrainedModel.__init__(self, config)
        self.transformer = ShiftGPT2Model(config)
        self.lm_head = torch.nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.post_init()
        self.transformer.zero_shift()  # start as the plain GPT-2 (a converted checkpoint keeps its function)

    @property
    def shift_proj(self):
        return self.transformer.shift_proj

    def shifted_embeddings(self, input_ids, shift_prefix=None, attention_mask=None):
        return self.transformer.shifted_embeddings(input_ids, shift_prefix, attention_mask)

    @classmethod
    def from_gpt2(cls, gpt2: GPT2LMHeadModel, token_shift: int = 3) -> "ShiftGPT2LMHeadModel":
        """The same weights with a zero (identity) shift: behaves exactly as ``gpt2`` until trained."""
        config = ShiftGPT2Config(token_shift=token_shift, **{k: v for k, v in gpt2.config.to_dict().items()
                                                             if k not in ("model_type", "architectures")})
        model = cls(config)
        missing, unexpected = model.load_state_dict(gpt2.state_dict(), strict=False)
        if unexpected or any(not k.startswith("transformer.shift_proj.") for k in missing):
            raise ValueError(f"not a GPT-2 state dict: missing {missing}, unexpected {unexpected}")
        return model

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        inputs = super().prepare_inputs_for_generation(input_ids, **kwargs)
        new = inputs.get("input_ids")
        if new is not None and new.shape[1] < input_ids.shape[1]:
            end = input_ids.shape[1] - new.shape[1]
            inputs["shift_prefix"] = input_ids[:, max(0, end - self.config.token_shift):end]
        return inputs
