"""Diffusion language models as transformers ``PreTrainedModel`` classes.

Importing this package registers the configs and models with the Auto classes, so a saved
checkpoint loads with plain ``from_pretrained``::

    import anchored_reasoning.models  # registers "mdlm", "adlm", "tadm" and the causal "shift-gpt2"
    from transformers import AutoModelForMaskedLM
    model = AutoModelForMaskedLM.from_pretrained("path/to/checkpoint")

Every class is also registered for transformers' custom-code loading (``register_for_auto_class``):
each ``save_pretrained`` -- the trainers' final models and their ``checkpoint-N`` folders included --
copies the model's files (``shift.py``; ``mdlm.py``, ``blocks.py``, ...: they import only torch and
transformers, and the library's errors only where it is installed) next to the weights and writes
``auto_map`` into ``config.json``, so an interpreter that never imports this package loads it too::

    AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)   # shift-gpt2
    AutoModelForMaskedLM.from_pretrained(path, trust_remote_code=True)   # mdlm, adlm, tadm

(``tests/test_plain_loading.py``). With the package imported, ``trust_remote_code`` is not needed and
the library's own classes are used.
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
    _config.register_for_auto_class()  # save_pretrained writes auto_map and copies the code files
    _model.register_for_auto_class("AutoModelForMaskedLM")
AutoConfig.register(ShiftGPT2Config.model_type, ShiftGPT2Config, exist_ok=True)
AutoModelForCausalLM.register(ShiftGPT2Config, ShiftGPT2LMHeadModel, exist_ok=True)
ShiftGPT2Config.register_for_auto_class()
ShiftGPT2LMHeadModel.register_for_auto_class("AutoModelForCausalLM")

__all__ = [
    "ADLM", "ADLMConfig", "TADM", "TADMConfig", "MDLM", "MDLMConfig", "PRESETS", "DiffusionLMOutput", "DiffusionPreTrainedModel",
    "NEG_INF", "SequenceLengthError", "subs_log_probs", "ShiftGPT2Config", "ShiftGPT2LMHeadModel", "add_token_shift",
]
