"""The NELBO perplexity bound of a masked diffusion LM on a text file or on a task split's responses.

Used by the diffusion trainer (validation perplexity after pretraining) and by the
``anchored-reasoning ppl`` command, which documents the scoring rules for users:

* a text file is tokenized as one document (or one per line, EOS between), cut into blocks of
  ``seq_len`` tokens, and every token is scored, the last shorter block included;
* a task split is rendered in the checkpoint's trained format (its ``anchored_reasoning.json``;
  trained-style ``cot`` otherwise) and only the response (target + EOS) is scored, conditioned on
  the clean prompt, as in SFT.

Scoring shows a tqdm bar over the sequences (``progress=False``: none), advanced after every model call.

It lives in ``train/`` because it scores text exactly as the trainer encodes it
(``train/data/diffusion_data.py``); the evaluation package may not import training code.
"""
from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any, Iterator

from anchored_reasoning.checkpoints import read_checkpoint_meta
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


@contextlib.contextmanager
def _scoring_bar(model: Any, sequences: int, t_samples: int, desc: str, show: bool) -> Iterator[None]:
    """A bar over the ``sequences`` that ``perplexity_bound`` scores: each model call scores a batch of
    sequences x ``t_samples`` rows, so a forward hook advances the bar by its rows / ``t_samples``."""
    from tqdm.auto import tqdm

    bar = tqdm(total=sequences, desc=desc, unit="seq", disable=not show, dynamic_ncols=True)

    def advance(_module, args, kwargs, _output) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            bar.update(int(ids.shape[0]) // t_samples)

    handle = model.register_forward_hook(advance, with_kwargs=True) if hasattr(model, "register_forward_hook") else None
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()
        bar.close()


def model_max_positions(model: Any) -> int:
    from anchored_reasoning.sampling import model_info

    _, max_len = model_info(model)
    return int(max_len) if max_len is not None else 1 << 30


def evaluate_text_file(model: Any, tokenizer: Any, path: str | Path, *, seq_len: int | None = None, t_samples: int = 8,
                       seed: int = 0, batch_size: int = 16, split_lines: bool = False,
                       progress: bool = True) -> dict[str, Any]:
    """Perplexity bound of ``model`` on a text file cut into ``seq_len`` blocks (see the module doc).

    ``seq_len`` defaults to the model's context; a larger one is a ConfigError, never a truncation."""
    from anchored_reasoning.objectives import perplexity_bound
    from anchored_reasoning.train.data.diffusion_data import pack_token_blocks, read_text_documents, tokenize_documents

    max_positions = model_max_positions(model)
    seq_len = int(seq_len or max_positions)
    if seq_len > max_positions:
        raise ConfigError(f"seq_len {seq_len} (--seq-len) exceeds the model's max_position_embeddings={max_positions}; "
                          f"use {max_positions} or less")
    log.info("tokenizing %s", path)
    ids = tokenize_documents(tokenizer, read_text_documents(path, split_lines=split_lines))
    blocks = pack_token_blocks(ids, seq_len, keep_last=True)
    log.info("scoring %d tokens in %d blocks of up to %d, at %d diffusion times each", len(ids), len(blocks), seq_len,
             t_samples)
    input_ids, attention = _pad(blocks, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    with _scoring_bar(model, len(blocks), t_samples, "ppl", progress):
        bound = perplexity_bound(model, input_ids, attention, num_t_samples=t_samples, batch_size=batch_size, seed=seed)
    return {**bound.to_dict(), "source": str(path), "seq_len": seq_len}


def evaluate_task(model: Any, tokenizer: Any, task_name: str, split: str, *, model_path: str | Path | None = None,
                  limit: int | None = None, t_samples: int = 8, seed: int = 0, batch_size: int = 16,
                  overlong: str = "error", data_dir: str | None = None, progress: bool = True) -> dict[str, Any]:
    """Perplexity bound of the responses of a task split, rendered in the checkpoint's format."""
    import torch

    from anchored_reasoning.methods import get_method
    from anchored_reasoning.objectives import perplexity_bound
    from anchored_reasoning.tasks import get_task
    from anchored_reasoning.train.data.diffusion_data import IGNORE_INDEX, encode_sft_rows

    meta = read_checkpoint_meta(model_path) or {}
    if meta.get("style") == "trained":
        method = get_method(meta["method"], style="trained", **(meta.get("method_options") or {}))
    else:
        method = get_method("cot", style="trained")
    examples = get_task(task_name).load(split, data_dir=data_dir, limit=limit)
    if not examples:
        raise DataError(f"task {task_name} split {split} has no examples")
    rows = [{"id": ex.id, "prompt": r.prompt, "completion": r.target}
            for ex in examples for r in [method.render(ex, task_name)]]
    encoded, stats = encode_sft_rows(tokenizer, rows, model_max_positions(model), overlong=overlong, where=f"{task_name}/{split}")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids, attention = _pad([r["input_ids"] for r in encoded], pad)
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    for i, r in enumerate(encoded):
        labels[i, : len(r["labels"])] = torch.tensor(r["labels"])
    log.info("scoring the responses of %d %s/%s rows, at %d diffusion times each", len(encoded), task_name, split,
             t_samples)
    with _scoring_bar(model, len(encoded), t_samples, f"ppl {task_name}/{split}", progress):
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
    log.info("loading %s", resolved)
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
