"""The plain PyTorch loop pieces that binding_fresh.py and assoc_recall.py share: the model to train, the
optimiser, one step, and the results file (a run per label, rewritten at every evaluation)."""
from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any


def build_model(init: str, tok, llama: list[int] | None = None, scratch: bool = False, shift: int = 0):
    """``init`` loaded (or only its architecture, ``scratch``), or a Llama (RoPE) of shape ``llama`` =
    (layers, hidden, heads) from scratch with ``tok``'s vocabulary; a token shift of ``shift`` on top."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from anchored_reasoning.models.shift import add_token_shift
    from anchored_reasoning.models.zoo import resolve_model

    if llama:
        from transformers import LlamaConfig, LlamaForCausalLM

        layers, hidden, heads = llama
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=1024,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=True))
    elif scratch:
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolve_model(init)))
    else:
        model = AutoModelForCausalLM.from_pretrained(resolve_model(init))
    if shift:
        add_token_shift(model, shift)
    return model


def optimizer(model, lr: float, warmup: int):
    """AdamW (weight decay 0.01) with a linear warm-up over ``warmup`` steps, then constant."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))


def train_step(model, opt, sched, input_ids, attention_mask, labels) -> float:
    """One optimiser step (gradients clipped to norm 1); returns the batch loss."""
    import torch

    loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad()
    return loss.item()


def run_record(args, model, script: str, argv: list[str] | None) -> dict[str, Any]:
    """The header of a run's entry: its arguments, size, start, machine and the command that made it."""
    from anchored_reasoning.machine import machine_info

    return {"args": {k: v for k, v in vars(args).items() if k != "out"},
            "parameters": sum(p.numel() for p in model.parameters()),
            "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine_info(),
            "threads": 1, "command": f"python -m research.binding.{script.removesuffix('.py')} " + " ".join(sys.argv[1:] if argv is None else argv)}


def save(path: Path, label: str, run: dict[str, Any]) -> None:
    results = json.loads(path.read_text()) if path.is_file() else {"runs": {}}
    results["runs"][label] = run
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")
