"""Where the small models shipped inside the package live (``anchored_reasoning/assets/``). The bottom of
``models/``: the alias table (:mod:`anchored_reasoning.models.zoo`) and the AR-initialised diffusion starts
(:mod:`anchored_reasoning.models.ar_init`) both read these folders, and this module imports neither."""
from __future__ import annotations

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parents[1] / "assets"
LOGIC_BACKBONE_DIR = ASSETS_DIR / "logic-gpt2"
LOGIC_SHIFT_DIR = ASSETS_DIR / "logic-gpt2-shift"
LOGIC_SEARCH_DIR = ASSETS_DIR / "logic-gpt2-search"
LOGIC_DIFFUSION_DIRS = {"logic-mdlm": ASSETS_DIR / "logic-mdlm", "logic-adlm": ASSETS_DIR / "logic-adlm"}
