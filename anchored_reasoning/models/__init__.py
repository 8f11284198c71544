"""Diffusion language models as transformers ``PreTrainedModel`` classes.

Importing this package registers the configs and models with the Auto classes, so a saved
checkpoint loads with plain ``from_pretrained``::

    import anchored_reasoning.models  # registers "mdlm", "adlm", "tadm" and the causal "shift-gpt2"
    from transformers import AutoModelForMaskedLM
    model = AutoModelForMaskedLM.from_pretrained("path/to/checkpoint")
"""
from __future__ import annotations

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

from .adlm import ADLM, ADLMConfig
from .blocks import NEG_INF, SequenceLengthError, subs_log_probs
from .mdlm import PRESETS, MDLM, DiffusionLMOutput, DiffusionPreTrainedModel, MDLMConfig
from .shift import ShiftGPT2Config, ShiftGPT2LMHeadModel, add_token_shift
from .tadm import TADM, TADMConfig

for _config, _model in ((MDLMConfig, MDLM), (ADLMConfig, ADLM), (TADMConfig, TADM)):
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModel.register(_config, _model, exist_ok=True)
    AutoModelForMaskedLM.register(_config, _model, exist_ok=True)
AutoConfig.register(ShiftGPT2Config.model_type, ShiftGPT2Config, exist_ok=True)
AutoModelForCausalLM.register(ShiftGPT2Config, ShiftGPT2LMHeadModel, exist_ok=True)

__all__ = [
    "ADLM", "ADLMConfig", "TADM", "TADMConfig", "MDLM", "MDLMConfig", "PRESETS", "DiffusionLMOutput", "DiffusionPreTrainedModel",
    "NEG_INF", "SequenceLengthError", "subs_log_probs", "ShiftGPT2Config", "ShiftGPT2LMHeadModel", "add_token_shift",
]
