"""``anchored-reasoning export``: merge a LoRA run's adapter into its base and write a plain checkpoint.

    anchored-reasoning export runs/gsm8k_qwen25_acot_lora runs/gsm8k_qwen25_acot_merged
    anchored-reasoning export runs/my_lora merged/ --dtype bfloat16 --base Qwen/Qwen2.5-0.5B-Instruct

The merged folder (``merge_and_unload``: weights, tokenizer with the added tokens, ``anchored_reasoning.json``)
loads with ``from_pretrained`` and in every backend, and generates the same greedy text as the adapter on its
base. ``--base`` replaces the base the adapter names (a local copy of it, say); a base of another shape is refused.
"""
from __future__ import annotations

import argparse
from typing import Any


def run(args: argparse.Namespace) -> int:
    from anchored_reasoning.models.adapters import export_merged

    out = export_merged(args.adapter, args.out, base=args.base, dtype=args.dtype)
    print(f"merged checkpoint: {out}")
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("export", help="merge a LoRA run's adapter into a plain checkpoint",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("adapter", help="the LoRA run's folder (adapter_config.json, tokenizer, anchored_reasoning.json)")
    p.add_argument("out", help="a new folder for the merged checkpoint")
    p.add_argument("--base", help="the base model (default: the one the adapter names)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="load and save in this dtype")
    p.set_defaults(func=run)
