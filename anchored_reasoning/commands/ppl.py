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
While it scores, a bar counts the blocks (or rows) done.
"""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.train.perplexity import (
    default_seq_len,
    evaluate_task,
    evaluate_text_file,
    load_model_and_tokenizer,
    model_max_positions,
)

log = logging.getLogger(__name__)


def run(args: argparse.Namespace) -> int:
    import torch

    if bool(args.text_file) == bool(args.task):
        raise ConfigError("ppl needs exactly one of --text-file F or --task T (with --split S)")
    torch.manual_seed(args.seed)
    model, tokenizer, resolved = load_model_and_tokenizer(args.model, trust_remote_code=args.trust_remote_code)
    if args.text_file:
        from anchored_reasoning.train.pipelines.diffusion import data_path

        seq_len = args.seq_len or default_seq_len(resolved, model_max_positions(model))
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
