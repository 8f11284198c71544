"""``anchored-reasoning ppl``: the NELBO perplexity bound of a masked diffusion LM.

    anchored-reasoning ppl --model runs/adlm-wikitext --text-file corpora/wikitext2_test.txt
    anchored-reasoning ppl --model runs/adlm-prosqa --task prosqa --split test --limit 200

What is scored:

* ``--text-file F``: the file is tokenized as one document (``--split-lines``: one document per
  line, EOS between them), the token stream is cut into blocks of ``--seq-len`` tokens, and every
  token is scored; the last, shorter block is scored too (nothing is dropped). ``--seq-len``
  defaults to the block length the checkpoint was pretrained with (``train_summary.json``), else
  the model's ``max_position_embeddings``; a larger value is an error, never a silent truncation.
  A relative path that does not exist is looked up in ``$ANCHORED_REASONING_DATA``.
* ``--task T --split S``: each example is rendered in the checkpoint's trained format (its
  ``anchored_reasoning.json``; trained-style ``cot`` otherwise) and only the *response* (target +
  EOS) is scored, conditioned on the clean prompt, as in SFT. A row longer than the model's
  context is an error (``--overlong drop`` skips and counts such rows instead).

The bound: ``NELBO = E_t [ w(t) * sum_masked CE ] / #tokens`` in nats per token, estimated with
``--t-samples`` stratified times per sequence (deterministic for a ``--seed``); the printed
``perplexity = exp(NELBO)`` is an upper bound on the model's perplexity (lower is better).
"""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from anchored_reasoning.errors import ConfigError, DataError

log = logging.getLogger(__name__)


def default_seq_len(model_path: str | Path | None, max_positions: int) -> int:
    """The pretraining block length recorded in ``train_summary.json``, else the model's context."""
    if model_path is not None:
        summary = Path(model_path) / "train_summary.json"
        if summary.is_file():
            try:
                seq = (json.loads(summary.read_text()).get("encode_stats") or {}).get("seq_len")
            except (OSError, ValueError):
                seq = None
            if seq:
                return min(int(seq), max_positions)
    return max_positions


def _pad(rows: list[list[int]], pad_id: int):
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        attn[i, : len(r)] = 1
    return ids, attn


def _max_positions(model: Any) -> int:
    from anchored_reasoning.sampling import model_info

    _, max_len = model_info(model)
    return int(max_len) if max_len is not None else 1 << 30


def evaluate_text_file(model: Any, tokenizer: Any, path: str | Path, *, seq_len: int | None = None, t_samples: int = 8,
                       seed: int = 0, batch_size: int = 16, split_lines: bool = False) -> dict[str, Any]:
    """Perplexity bound of ``model`` on a text file cut into ``seq_len`` blocks (see the module doc)."""
    from anchored_reasoning.objectives import perplexity_bound
    from anchored_reasoning.train.diffusion_data import pack_token_blocks, read_text_documents, tokenize_documents

    max_positions = _max_positions(model)
    seq_len = int(seq_len or max_positions)
    if seq_len > max_positions:
        raise ConfigError(f"--seq-len {seq_len} exceeds the model's max_position_embeddings={max_positions}; "
                          f"use --seq-len {max_positions} or less")
    ids = tokenize_documents(tokenizer, read_text_documents(path, split_lines=split_lines))
    blocks = pack_token_blocks(ids, seq_len, keep_last=True)
    input_ids, attention = _pad(blocks, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    bound = perplexity_bound(model, input_ids, attention, num_t_samples=t_samples, batch_size=batch_size, seed=seed)
    return {**bound.to_dict(), "source": str(path), "seq_len": seq_len}


def evaluate_task(model: Any, tokenizer: Any, task_name: str, split: str, *, model_path: str | Path | None = None,
                  limit: int | None = None, t_samples: int = 8, seed: int = 0, batch_size: int = 16,
                  overlong: str = "error", data_dir: str | None = None) -> dict[str, Any]:
    """Perplexity bound of the responses of a task split, rendered in the checkpoint's format."""
    import torch

    from anchored_reasoning.eval.runner import checkpoint_meta
    from anchored_reasoning.methods import get_method
    from anchored_reasoning.objectives import perplexity_bound
    from anchored_reasoning.tasks import get_task
    from anchored_reasoning.train.diffusion_data import IGNORE_INDEX, encode_sft_rows

    meta = checkpoint_meta(model_path) or {}
    if meta.get("style") == "trained":
        method = get_method(meta["method"], style="trained", **(meta.get("method_options") or {}))
    else:
        method = get_method("cot", style="trained")
    examples = get_task(task_name).load(split, data_dir=data_dir, limit=limit)
    if not examples:
        raise DataError(f"task {task_name} split {split} has no examples")
    rows = [{"id": ex.id, "prompt": r.prompt, "completion": r.target}
            for ex in examples for r in [method.render(ex, task_name)]]
    encoded, stats = encode_sft_rows(tokenizer, rows, _max_positions(model), overlong=overlong, where=f"{task_name}/{split}")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids, attention = _pad([r["input_ids"] for r in encoded], pad)
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    for i, r in enumerate(encoded):
        labels[i, : len(r["labels"])] = torch.tensor(r["labels"])
    bound = perplexity_bound(model, input_ids, attention, num_t_samples=t_samples, batch_size=batch_size, seed=seed,
                             loss_mask=labels != IGNORE_INDEX)
    return {**bound.to_dict(), "source": f"{task_name}/{split}", "method": method.name,
            "rows": stats.rows, "dropped_overlong": stats.dropped_overlong}


def load_model_and_tokenizer(path: str, *, trust_remote_code: bool = False, mask_token_id: int | None = None):
    """A diffusion model (ours, or an external one through the adapter) and its tokenizer, in eval mode."""
    from transformers import AutoTokenizer

    from anchored_reasoning.models.zoo import resolve_model
    from anchored_reasoning.sampling import load_masked_diffusion_model

    resolved = resolve_model(path)
    try:
        model = load_masked_diffusion_model(resolved, trust_remote_code=trust_remote_code, mask_token_id=mask_token_id)
        tokenizer = AutoTokenizer.from_pretrained(resolved, trust_remote_code=trust_remote_code)
    except OSError as exc:
        raise ConfigError(f"could not load the diffusion model {path!r} ({resolved}): {exc}") from exc
    if tokenizer.eos_token_id is None:
        raise ConfigError(f"the tokenizer of {path} has no EOS token")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer, resolved


def run(args: argparse.Namespace) -> int:
    import torch

    if bool(args.text_file) == bool(args.task):
        raise ConfigError("ppl needs exactly one of --text-file F or --task T (with --split S)")
    torch.manual_seed(args.seed)
    model, tokenizer, resolved = load_model_and_tokenizer(args.model, trust_remote_code=args.trust_remote_code)
    if args.text_file:
        from anchored_reasoning.train.diffusion import data_path

        seq_len = args.seq_len or default_seq_len(resolved, _max_positions(model))
        result = evaluate_text_file(model, tokenizer, data_path(args.text_file), seq_len=seq_len, t_samples=args.t_samples,
                                    seed=args.seed, batch_size=args.batch_size, split_lines=args.split_lines)
    else:
        if args.seq_len:
            raise ConfigError("--seq-len applies to --text-file only; task rows are scored whole")
        result = evaluate_task(model, tokenizer, args.task, args.split, model_path=resolved, limit=args.limit,
                               t_samples=args.t_samples, seed=args.seed, batch_size=args.batch_size,
                               overlong=args.overlong, data_dir=args.data_dir)
    result = {"model": str(args.model), "seed": args.seed, **result}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("ppl", help="NELBO perplexity bound of a diffusion LM on a text file or a task split",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint directory (MDLM/ADLM, or LLaDA/Dream style) or Hub id")
    src = p.add_argument_group("what to score (one of)")
    src.add_argument("--text-file", help="a plain-text file (relative paths also looked up in $ANCHORED_REASONING_DATA)")
    src.add_argument("--task", help="a task name (responses scored, conditioned on prompts)")
    p.add_argument("--split", default="test", help="task split (default: test)")
    p.add_argument("--limit", type=int, help="first N examples of the task split")
    p.add_argument("--data-dir", help="local data folder (default: $ANCHORED_REASONING_DATA)")
    p.add_argument("--seq-len", type=int, help="block length for --text-file (default: the pretraining block length)")
    p.add_argument("--split-lines", action="store_true", help="--text-file: one document per line (EOS between)")
    p.add_argument("--t-samples", type=int, default=8, help="diffusion times per sequence (default: 8)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--overlong", choices=["error", "drop"], default="error", help="task rows longer than the context")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trust-remote-code", action="store_true", help="for external checkpoints with custom code")
    p.add_argument("--out", help="also write the result JSON here")
    p.set_defaults(func=run)
