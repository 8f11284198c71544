"""Run pipelines: the one run skeleton (``skeleton``) and each trainer kind's hooks on it (``ar``,
``diffusion``, ``tadm``, ``grpo``), with the pieces they share (``method_setup``, ``model_presets``,
``grpo_prompts``)."""
