"""AR-to-diffusion initialisation (DiffuGPT / Dream style): our MDLM or ADLM started from a GPT-2's weights.

:func:`copy_ar_weights` copies a GPT-2 (or a shift-gpt2 such as ``logic-gpt2-shift``, its token shift
included) into an MDLM or an ADLM's anchor network where the shapes agree; :func:`build_start` makes
such a start of logic-gpt2's shape with its tokenizer. With ``shift_logits`` the copied head keeps the AR
alignment (position t predicted from t-1's state), without which the copy is one position off
(docs/diffusion-training.md). ``logic-mdlm-shift`` / ``logic-adlm-shift`` (models.zoo) are these starts,
built once into the cache.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

ARCHS = ("mdlm", "adlm")
INITS = ("scratch", "ar")
PRESET = "small"  # logic-gpt2's shape: 4 x 128, 4 heads, MLP 512, 512 positions


def copy_ar_weights(model, ar) -> int:
    """Copy a GPT-2 model's weights into an MDLM (or an ADLM's anchor network) where the shapes agree;
    returns the number of tensors copied."""
    import torch

    enc = model.anchor if hasattr(model, "anchor") else model.encoder
    head = model.anchor_head if hasattr(model, "anchor") else model.lm_head
    gpt = ar.transformer
    if len(gpt.h) < len(enc.layers) or gpt.wte.weight.shape != model.embed_tokens.weight.shape:
        raise ValueError(f"AR init needs >= {len(enc.layers)} blocks and embeddings of shape "
                         f"{tuple(model.embed_tokens.weight.shape)}; got {len(gpt.h)} / {tuple(gpt.wte.weight.shape)}")
    n = 0
    with torch.no_grad():
        def put(dst, src):
            nonlocal n
            dst.copy_(src)
            n += 1

        put(model.embed_tokens.weight, gpt.wte.weight)
        put(head.weight, ar.lm_head.weight)
        head.bias.zero_()
        for blk, g in zip(enc.layers, gpt.h):
            put(blk.attn_norm.weight, g.ln_1.weight), put(blk.attn_norm.bias, g.ln_1.bias)
            put(blk.qkv.weight, g.attn.c_attn.weight.T)  # GPT-2's Conv1D stores (in, out)
            put(blk.attn_out.weight, g.attn.c_proj.weight.T)
            put(blk.mlp_norm.weight, g.ln_2.weight), put(blk.mlp_norm.bias, g.ln_2.bias)
            put(blk.mlp_in.weight, g.mlp.c_fc.weight.T), put(blk.mlp_in.bias, g.mlp.c_fc.bias)
            put(blk.mlp_out.weight, g.mlp.c_proj.weight.T), put(blk.mlp_out.bias, g.mlp.c_proj.bias)
        put(enc.norm.weight, gpt.ln_f.weight), put(enc.norm.bias, gpt.ln_f.bias)
        ar_shift = getattr(gpt, "shift_proj", None)  # a shift-gpt2 (logic-gpt2-shift): the shift carries over
        if ar_shift is not None and getattr(model, "shift_proj", None) is not None:
            if len(ar_shift) != len(model.shift_proj):
                raise ValueError(f"AR init: the AR model shifts {len(ar_shift)} tokens, the diffusion model "
                                 f"{len(model.shift_proj)}; build it with token_shift={len(ar_shift)}")
            for dst, src in zip(model.shift_proj, ar_shift):
                put(dst.weight, src.weight)
    return n


def build_start(arch: str, init: str = "ar", *, init_from: str | Path | None = None, shift_logits: bool = False,
                seed: int = 0, config: dict[str, Any] | None = None):
    """``(model, tokenizer, tensors copied)``: a fresh MDLM or ADLM of logic-gpt2's shape (the ``small``
    preset) with logic-gpt2's tokenizer, and with ``init="ar"`` the AR model's weights copied in
    (``init_from``, a checkpoint folder, default ``logic-gpt2``'s; a shift-gpt2 such as ``logic-gpt2-shift`` brings its token
    shift). ``shift_logits`` aligns the AR-initialised head (position t predicts from t-1's state).
    ``seed`` fixes the weights that are not copied (an ADLM's denoiser)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import anchored_reasoning.models as models
    from anchored_reasoning.models.assets import LOGIC_BACKBONE_DIR

    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    ar_dir = Path(init_from) if init_from is not None else LOGIC_BACKBONE_DIR
    if not ar_dir.is_dir():
        from anchored_reasoning.errors import ConfigError

        raise ConfigError(f"build_start: init_from={str(init_from)!r} is not a checkpoint folder; resolve an alias first "
                          "(anchored_reasoning.models.zoo.resolve_model)")
    tok = AutoTokenizer.from_pretrained(ar_dir)
    ar = AutoModelForCausalLM.from_pretrained(ar_dir) if init == "ar" else None
    shift = int(getattr(ar.config, "token_shift", 0) or 0) if ar is not None else 0
    cls, cfg_cls = (models.MDLM, models.MDLMConfig) if arch == "mdlm" else (models.ADLM, models.ADLMConfig)
    cfg = cfg_cls.from_preset(PRESET, vocab_size=len(tok), mask_token_id=tok.mask_token_id, pad_token_id=tok.pad_token_id,
                              bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                              **({"token_shift": shift} if shift else {}), **({"shift_logits": True} if shift_logits else {}),
                              **(config or {}))
    torch.manual_seed(seed)
    model = cls(cfg)
    return model, tok, (copy_ar_weights(model, ar) if ar is not None else 0)
