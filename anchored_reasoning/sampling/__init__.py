"""Diffusion samplers (MDLM ancestral, LLaDA low-confidence/random remasking with blocks, ReMDM loop,
Fast-dLLM confidence threshold) behind one :class:`SamplerConfig`, the anchor cache (TADM) and
Fast-dLLM's approximate KV cache for block sampling, and adapters for external
masked-diffusion checkpoints. See ``samplers.py`` for the semantics."""
from .adapters import MaskedDiffusionAdapter, load_masked_diffusion_model
from .cache import AnchorCacheModelFn
from .kv_cache import KV_CACHE_MODES, KVCacheModelFn
from .samplers import LOCKED_IN, REMASKING, ModelFn, SampleStats, SamplerConfig, make_model_fn, model_info, sample

__all__ = ["SamplerConfig", "SampleStats", "sample", "make_model_fn", "model_info", "ModelFn", "REMASKING",
           "LOCKED_IN", "AnchorCacheModelFn", "KVCacheModelFn", "KV_CACHE_MODES", "MaskedDiffusionAdapter",
           "load_masked_diffusion_model"]
