"""Trainers: each module holds a trainer config (an ``XConfig`` dataclass, the recipe's ``training`` section)
and the trainer that reads it (``XTrainer``, a TRL/transformers subclass): AnchoredSFT (``acot_trainer``),
DiffusionSFT (``diffusion_trainer``), TADM (``tadm_trainer``), AnchoredGRPO (``grpo_trainer``) and
DiffusionGRPO (``diffusion_grpo``)."""
