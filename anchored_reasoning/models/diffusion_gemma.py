"""DiffusionGemma (transformers' ``DiffusionGemmaForBlockDiffusion``) in the library: loading, a small
config for CPU, the layer split TADM uses, and the decoder's forward pass cut into stages.

DiffusionGemma is a block-diffusion LM: a causal *encoder* reads the prompt (and every finished canvas)
once into a KV cache; a bidirectional *decoder* -- the same text layers, weights tied -- denoises a
canvas of ``config.canvas_length`` tokens that starts as uniform noise (no mask token), reading that
cache. Each denoising step runs every decoder layer on the canvas, with the previous step's logits fed
back through the self-conditioning block. The loop is transformers' own
(``generation_diffusion_gemma.py``: entropy-bounded acceptance, renoising, a linear temperature
schedule, optional adaptive stopping); this library calls it, never a copy of it.

>>> from anchored_reasoning.models.diffusion_gemma import load_diffusion_gemma
>>> model, tokenizer = load_diffusion_gemma("google/diffusiongemma-26B-A4B-it", dtype="bfloat16")
>>> model.generate(input_ids, max_new_tokens=256, max_denoising_steps=48)

TADM (:mod:`anchored_reasoning.models.tadm_gemma`) splits the *decoder* layers into S (shared, every
step), A (anchor network, every K steps) and D (denoiser, every step, then the norm and LM head):
:class:`LayerSplit`. :func:`decoder_embed`, :func:`decoder_layers` and :func:`decoder_head` are
``DiffusionGemmaDecoderModel.forward`` and the LM head of ``DiffusionGemmaForBlockDiffusion.forward``
in three parts; run back to back over all layers they give the model's logits bit for bit
(tests/test_diffusion_gemma.py).
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch

from anchored_reasoning.errors import ConfigError

logger = logging.getLogger(__name__)

#: The released checkpoint (26B total, ~4B active parameters; 30 text layers).
HUB_ID = "google/diffusiongemma-26B-A4B-it"
MODEL_TYPE = "diffusion_gemma"
#: The paper's split of the 30 decoder layers: S = embedding + 2 layers, A = 20 layers, D = 8 layers + head.
PAPER_SPLIT = (2, 20, 8)
#: The paper's sampling: canvas 256, a fixed 48 denoising steps per canvas, adaptive stopping off.
PAPER_STEPS = 48


# --------------------------------------------------------------------------- configs and loading
def tiny_diffusion_gemma_config(vocab_size: int = 512, *, hidden_size: int = 64, num_layers: int = 6,
                                num_heads: int = 2, head_dim: int = 32, intermediate_size: int = 128,
                                num_experts: int = 4, top_k_experts: int = 2, canvas_length: int = 16,
                                sliding_window: int = 64, max_positions: int = 1024, pad_token_id: int = 0,
                                eos_token_id: int = 1, bos_token_id: int = 2):
    """A small :class:`~transformers.DiffusionGemmaConfig` (MoE text layers, a one-layer vision tower the
    text path never runs) that builds and generates in seconds on CPU. The image token ids take the
    last three ids of the vocabulary (size ``vocab_size + 3``), so no text token is one."""
    from transformers import DiffusionGemmaConfig

    for key, value in (("vocab_size", vocab_size), ("hidden_size", hidden_size), ("num_layers", num_layers),
                       ("canvas_length", canvas_length), ("num_heads", num_heads), ("head_dim", head_dim)):
        if int(value) < 1:
            raise ConfigError(f"tiny_diffusion_gemma_config: {key}={value} must be >= 1")
    text = dict(vocab_size=vocab_size + 3, hidden_size=hidden_size, intermediate_size=intermediate_size,
                num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=1, head_dim=head_dim,
                global_head_dim=head_dim, num_global_key_value_heads=1, max_position_embeddings=max_positions,
                sliding_window=sliding_window, num_experts=num_experts, top_k_experts=top_k_experts,
                moe_intermediate_size=max(8, intermediate_size // 4), pad_token_id=pad_token_id,
                eos_token_id=eos_token_id, bos_token_id=bos_token_id)
    vision = dict(model_type="gemma4_vision", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=8, position_embedding_size=64, patch_size=4)
    return DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=canvas_length,
                                boi_token_id=vocab_size, eoi_token_id=vocab_size + 1, image_token_id=vocab_size + 2)


def make_tiny_diffusion_gemma(out_dir: str | os.PathLike, *, texts: Iterable[str] | None = None, seed: int = 0,
                              tokenizer_vocab: int = 512, **config: Any) -> Path:
    """A randomly initialised DiffusionGemma of :func:`tiny_diffusion_gemma_config` with a byte-level BPE
    tokenizer trained on ``texts`` (:func:`~anchored_reasoning.tokenization.train_tiny_tokenizer`), both
    saved to ``out_dir`` (loadable with :func:`load_diffusion_gemma`). Deterministic for a seed."""
    from transformers import DiffusionGemmaForBlockDiffusion

    from anchored_reasoning.tokenization import train_tiny_tokenizer

    out = Path(out_dir)
    tok = train_tiny_tokenizer(out, texts=texts, vocab_size=tokenizer_vocab)
    cfg = tiny_diffusion_gemma_config(len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                                      bos_token_id=tok.bos_token_id, **config)
    torch.manual_seed(seed)
    model = DiffusionGemmaForBlockDiffusion(cfg)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out)
    return out


def config_model_type(name_or_path: str) -> str:
    """``model_type`` of a checkpoint's ``config.json`` (local folder, else through ``AutoConfig``)."""
    folder = Path(str(name_or_path)).expanduser()
    if folder.is_dir():
        try:
            return str(json.loads((folder / "config.json").read_text()).get("model_type", ""))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{folder} has no readable config.json ({exc}); give a DiffusionGemma checkpoint "
                              f"folder or a Hub id such as {HUB_ID}") from None
    from transformers import AutoConfig

    try:
        return str(AutoConfig.from_pretrained(str(name_or_path)).model_type)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"could not read the config of {name_or_path!r} ({exc}); give a DiffusionGemma "
                          f"checkpoint folder or a reachable Hub id such as {HUB_ID}") from None


def check_diffusion_gemma(name_or_path: str, what: str = "model") -> None:
    """ConfigError unless ``name_or_path`` is a DiffusionGemma checkpoint; reads only its config."""
    kind = config_model_type(name_or_path)
    if kind != MODEL_TYPE:
        raise ConfigError(f"{what} {name_or_path!r} is a {kind or 'checkpoint without model_type'!r} checkpoint, not a "
                          f"DiffusionGemma (config.json model_type {MODEL_TYPE!r}); give a DiffusionGemma checkpoint "
                          f"such as {HUB_ID} or one built by make_tiny_diffusion_gemma")


def torch_dtype(name: str | None):
    """``"bfloat16"`` / ``"bf16"`` / ``"float32"`` / ``"float16"`` / ``"auto"`` / None -> a torch dtype (None: as saved)."""
    table = {None: None, "auto": None, "float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if name not in table:
        raise ConfigError(f"dtype={name!r}: use auto, float32, bfloat16 or float16")
    return table[name]


def load_diffusion_gemma(name_or_path: str, *, dtype: str | None = None, device: str | None = None,
                         tokenizer: bool = True):
    """``(model, tokenizer)`` for a DiffusionGemma checkpoint (folder or Hub id), model in eval mode.
    A checkpoint of another kind is refused from its config, before any weights load."""
    from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion

    check_diffusion_gemma(name_or_path)
    kwargs = {"dtype": torch_dtype(dtype)} if torch_dtype(dtype) is not None else {}
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(str(name_or_path), **kwargs).eval()
    if device is not None:
        model.to(device)
    tok = AutoTokenizer.from_pretrained(str(name_or_path)) if tokenizer else None
    logger.info("DiffusionGemma %s: %d decoder layers, canvas %d, %.1fM parameters", name_or_path,
                model.config.text_config.num_hidden_layers, model.config.canvas_length,
                sum(p.numel() for p in model.parameters()) / 1e6)
    return model, tok


def paper_generation_kwargs(steps: int = PAPER_STEPS) -> dict[str, Any]:
    """``generate`` keywords for the paper's protocol: a fixed ``steps`` per canvas, adaptive stopping off."""
    return {"max_denoising_steps": int(steps), "stability_threshold": None, "confidence_threshold": None}


# --------------------------------------------------------------------------- the layer split
@dataclass(frozen=True)
class LayerSplit:
    """How many decoder layers S (shared, every step), A (anchor network, every K steps) and D (denoiser,
    every step, then norm + LM head) take, in that order; they add up to the model's layer count."""

    shared: int
    anchor: int
    denoiser: int

    @property
    def total(self) -> int:
        return self.shared + self.anchor + self.denoiser

    @property
    def anchor_range(self) -> tuple[int, int]:
        return self.shared, self.shared + self.anchor

    @classmethod
    def proportional(cls, num_layers: int) -> "LayerSplit":
        """The paper's 2/20/8 of 30 scaled to ``num_layers``: at least one denoiser and one anchor layer, and
        one shared layer where that leaves room (30 -> 2/20/8, 6 -> 1/3/2)."""
        if num_layers < 2:
            raise ConfigError(f"a TADM split needs at least 2 decoder layers (one anchor, one denoiser); the model has {num_layers}")
        denoiser = max(1, round(num_layers * PAPER_SPLIT[2] / 30))
        shared = min(max(1, round(num_layers * PAPER_SPLIT[0] / 30)), num_layers - denoiser - 1)
        return cls(shared, num_layers - shared - denoiser, denoiser)

    @classmethod
    def for_model(cls, config: Any, split: Any = None) -> "LayerSplit":
        """The split for a DiffusionGemma config: ``split`` as (shared, anchor, denoiser) / a dict / a
        LayerSplit, or None for :meth:`proportional`. A split that does not fit is a ConfigError naming both."""
        n = int(config.get_text_config().num_hidden_layers)
        if split is None:
            return cls.proportional(n)
        if isinstance(split, LayerSplit):
            parts = (split.shared, split.anchor, split.denoiser)
        elif isinstance(split, dict):
            unknown = set(split) - {"shared", "anchor", "denoiser"}
            if unknown or len(split) != 3:
                raise ConfigError(f"split {split!r}: give shared, anchor and denoiser layer counts")
            parts = (split["shared"], split["anchor"], split["denoiser"])
        else:
            parts = tuple(split)
        if len(parts) != 3 or not all(isinstance(p, int) and not isinstance(p, bool) for p in parts):
            raise ConfigError(f"split {split!r}: give three integers (shared, anchor, denoiser), e.g. {PAPER_SPLIT}")
        shared, anchor, denoiser = parts
        if shared < 0 or anchor < 1 or denoiser < 1:
            raise ConfigError(f"split shared={shared}, anchor={anchor}, denoiser={denoiser}: shared must be >= 0 and "
                              "anchor, denoiser >= 1")
        if shared + anchor + denoiser != n:
            raise ConfigError(f"split shared={shared} + anchor={anchor} + denoiser={denoiser} = "
                              f"{shared + anchor + denoiser} layers does not fit this model's {n} decoder layers; "
                              f"the counts must add up to {n} (or leave the split unset for the paper's proportions: "
                              f"{cls.proportional(n) if n >= 2 else 'none'})")
        return cls(shared, anchor, denoiser)


# --------------------------------------------------------------------------- the decoder in stages
@dataclass
class DecoderStep:
    """What every decoder layer needs at one denoising step besides the hidden state."""

    position_embeddings: dict[str, Any]
    mask_mapping: dict[str, Any]
    position_ids: torch.Tensor
    past_key_values: Any
    kwargs: dict[str, Any]


def decoder_embed(model, decoder_input_ids: torch.Tensor, past_key_values: Any, *,
                  self_conditioning_logits: torch.Tensor | None = None,
                  self_conditioning_mask: torch.Tensor | None = None, decoder_attention_mask: Any = None,
                  decoder_position_ids: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, DecoderStep]:
    """The canvas embedded with self-conditioning, and the step's positions and masks: the part of
    ``DiffusionGemmaDecoderModel.forward`` before its layer loop (``model``: the ForBlockDiffusion)."""
    decoder = model.model.decoder
    kwargs.pop("use_cache", None)
    if past_key_values is None:
        raise ConfigError("the DiffusionGemma decoder reads the encoder's KV cache: past_key_values must be given")
    inputs_embeds = decoder.embed_tokens(decoder_input_ids)
    if self_conditioning_logits is not None:
        soft = torch.matmul(self_conditioning_logits.softmax(dim=-1, dtype=torch.float32).to(decoder.embed_tokens.weight.dtype),
                            decoder.embed_tokens.weight) * decoder.embed_tokens.embed_scale.to(inputs_embeds.dtype)
        if self_conditioning_mask is not None:
            soft = soft * self_conditioning_mask.to(soft.dtype)[:, None, None]
    else:
        soft = torch.zeros_like(inputs_embeds)
    inputs_embeds = decoder.self_conditioning(inputs_embeds, soft)
    if decoder_position_ids is None:
        start = past_key_values.get_seq_length(layer_idx=0)
        decoder_position_ids = torch.arange(start, start + inputs_embeds.shape[1], device=inputs_embeds.device,
                                            dtype=torch.long).unsqueeze(0)
    mask_mapping = decoder_attention_mask
    if not isinstance(mask_mapping, dict):
        mask_mapping = decoder.create_diffusion_decoder_attention_mask(
            config=decoder.text_config, inputs_embeds=inputs_embeds, past_key_values=past_key_values,
            decoder_attention_mask=decoder_attention_mask)
    position_embeddings = {t: decoder.rotary_emb(inputs_embeds, decoder_position_ids, t) for t in decoder.unique_layer_types}
    return inputs_embeds, DecoderStep(position_embeddings, mask_mapping, decoder_position_ids, past_key_values, kwargs)


def decoder_layers(model, hidden: torch.Tensor, start: int, stop: int, step: DecoderStep) -> torch.Tensor:
    """Decoder layers ``start .. stop-1`` on ``hidden`` (each reads its own layer of the encoder cache)."""
    decoder = model.model.decoder
    types = decoder.text_config.layer_types
    for i in range(start, stop):
        hidden = decoder.layers[i](hidden, position_embeddings=step.position_embeddings[types[i]],
                                   attention_mask=step.mask_mapping[types[i]], position_ids=step.position_ids,
                                   past_key_values=step.past_key_values, **step.kwargs)
    return hidden


def decoder_head(model, hidden: torch.Tensor) -> torch.Tensor:
    """The final norm, LM head and logit soft-capping: float32 logits as ``model.forward`` returns them."""
    logits = model.lm_head(model.model.decoder.norm(hidden)).to(torch.float32)
    cap = model.final_logit_softcapping
    return torch.tanh(logits / cap) * cap


def num_decoder_layers(model) -> int:
    return int(model.config.get_text_config().num_hidden_layers)


__all__ = [
    "HUB_ID", "PAPER_SPLIT", "PAPER_STEPS", "LayerSplit", "DecoderStep", "tiny_diffusion_gemma_config",
    "make_tiny_diffusion_gemma", "load_diffusion_gemma", "check_diffusion_gemma", "config_model_type",
    "paper_generation_kwargs", "decoder_embed", "decoder_layers", "decoder_head", "num_decoder_layers", "torch_dtype",
]
