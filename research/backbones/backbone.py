"""Pretrain a small GPT-2-class backbone on generated logic text (the ``logic-gpt2`` model).

    python -m research.backbones.backbone --out anchored_reasoning/assets/logic-gpt2 --minutes 35

(Archived here from ``anchored_reasoning.train.backbone``, the module path the shipped assets' ``backbone.json``
record; the exact command behind each asset is in ``research/backbones/README.md``. The document format,
:data:`STEP_SEPARATOR` and the readers stay in the library: ``anchored_reasoning.train.data.logic_text``.)

The paper fine-tunes *pretrained* GPT-2 (124M) with every method. On a 2-core CPU a model
trained from scratch for a few minutes never gets past the answer format (CALIBRATION.md), so
the demo and ``benchmarks/acot_vs_cot.py`` start from this backbone instead: one small model,
pretrained once with a next-token loss on *logic text* and shipped inside the package
(a few MB), that every method then fine-tunes at the same budget -- the same protocol as the
paper, at CPU scale.

The corpus is question-free: each document is the list of facts of a generated problem
(ProsQA-style graphs of several sizes; ProntoQA-style 1-5 hop ontologies), a newline, and a
derivation that follows the facts ("Sally is a scrompus. Every scrompus is a rempus. ...").
No document contains a question, an answer marker or any method's special tokens, so the
backbone favours no method's format; it learns to read rules and to chain them. The loss is on
the derivation only: the facts are random draws (nothing to learn from predicting them) and
would otherwise swamp the few tokens that need a rule looked up (a first 35-minute run with the
loss on every token learned the format and "Every X is a X", not the lookup). All problems
are generated here from fixed seeds (nothing from the real test splits).

The tokenizer is a byte-level BPE trained on the same corpus (every ProsQA/ProntoQA word is a
single token) with the methods' special tokens ([ANT], [BoA], ...) already added, so that
fine-tuning never resizes the embeddings.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import platform
import random
import time
from pathlib import Path
from typing import Any, Sequence

from anchored_reasoning.errors import DataError
from anchored_reasoning.train.data.logic_text import STEP_SEPARATOR, TRACED_KINDS, document, encode, qa_document

#: The shipped backbone's architecture (4 layers: depth matters for latent multi-hop search,
#: width 128 keeps a training step cheap on a CPU).
BACKBONE_CONFIG = {"n_layer": 4, "n_embd": 128, "n_head": 4, "n_positions": 512,
                   "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}

#: Corpus mixture: (task, generator size, share of the documents).
MIXTURE: list[tuple[str, dict[str, Any], float]] = [
    ("prosqa", {}, 0.30),                                              # full size (the real files)
    ("prosqa", {"num_nodes": 14, "min_hops": 1, "max_hops": 3, "neg_depth": "any"}, 0.25),  # "any": the shipped corpus
    ("prosqa", {"num_nodes": 7, "min_hops": 1, "max_hops": 2, "neg_depth": "any"}, 0.20),  # the demo's size
    ("prontoqa", {"hops": 5}, 0.15),                                   # the real files' depth
    ("prontoqa", {"hops": 3}, 0.10),
]


#: The question-aware corpus (``corpus="questions"``, the second backbone generation): each document
#: is a whole problem -- facts, the question, a newline, the derivation and the answer -- so the
#: first derivation step depends on the asked entity (the question-free corpus could not teach that
#: binding: its first step names an unpredictable entity). ProsQA at the depth-ladder sizes with
#: the wrong option as deep as the answer (no surface shortcut to learn instead of the lookup), the
#: full size, ProntoQA, and lookup drills (facts, then random facts restated: pure retrieval).
QA_MIXTURE: list[tuple[str, dict[str, Any], float]] = [
    ("prosqa", {"ladder": 1}, 0.12),
    ("prosqa", {"ladder": 2}, 0.14),
    ("prosqa", {"ladder": 3}, 0.14),
    ("prosqa", {"ladder": 4}, 0.10),
    ("prosqa", {}, 0.08),
    ("prontoqa", {"hops": 5}, 0.14),
    ("prontoqa", {"hops": 3}, 0.08),
    ("drill", {"ladder": 3}, 0.20),
]

#: The reverse-look-up corpus (``corpus="backward"``, continued from the question-aware backbone): ProsQA
#: problems whose derivation walks back from each option to its entity (the ``options_backward`` trace of
#: :mod:`anchored_reasoning.generators.traces`: every step names the subject of the fact that ends in the
#: previous step's subject), reverse drills (facts, newline, facts restated as ``"<object>: <fact>"``: a
#: lookup of the subject from the object), and a third of the question-aware corpus's forward documents so
#: that the forward lookup is kept. Forward, a ProsQA walk is a search (a random forward walk reaches the
#: answer 16% of the time on the real test); backward it is a chain of lookups, which a backbone that only
#: ever looked facts up forward could not learn in 2,000 fine-tuning steps (research/depth-ladder.md, session 20).
BACKWARD_MIXTURE: list[tuple[str, dict[str, Any], float]] = [
    ("prosqa", {"ladder": 1}, 0.04),
    ("prosqa", {"ladder": 2}, 0.05),
    ("prosqa", {"ladder": 3}, 0.05),
    ("prosqa", {"ladder": 4}, 0.05),
    ("prontoqa", {"hops": 5}, 0.08),
    ("drill", {"ladder": 3}, 0.08),
    ("prosqa_back", {"ladder": 2}, 0.10),
    ("prosqa_back", {"ladder": 3}, 0.10),
    ("prosqa_back", {"ladder": 4}, 0.10),
    ("prosqa_back", {}, 0.15),
    ("rdrill", {"ladder": 3}, 0.10),
    ("rdrill", {}, 0.10),
]

#: The search corpus (``corpus="search"``, continued from the question-aware backbone): ProsQA problems
#: whose derivation is the ``dfs`` trace of :mod:`anchored_reasoning.generators.traces` -- the depth-first
#: search from the asked entity, children in the question's order, ``Back to <parent>.`` at a dead end,
#: stopping at the first option -- at the ladder sizes and the full size, ProntoQA, and lookup drills at the
#: ladder and the full size. The forward proof of the question-aware corpus is left out: written first, its
#: first step already needs the look-ahead a 4-layer model cannot do (research/depth-ladder.md); the search needs
#: forward look-ups only, which the backbone already does (session 22: fine-tuned on it, 0.768 on the real test).
SEARCH_MIXTURE: list[tuple[str, dict[str, Any], float]] = [
    ("prosqa_dfs", {"ladder": 1}, 0.10),
    ("prosqa_dfs", {"ladder": 2}, 0.12),
    ("prosqa_dfs", {"ladder": 3}, 0.14),
    ("prosqa_dfs", {"ladder": 4}, 0.12),
    ("prosqa_dfs", {}, 0.14),
    ("prontoqa", {"hops": 5}, 0.12),
    ("prontoqa", {"hops": 3}, 0.06),
    ("drill", {"ladder": 3}, 0.10),
    ("drill", {}, 0.10),
]

#: Document kinds drawn from the ProsQA generator (the drills restate a problem's facts).
PROSQA_KINDS = ("drill", "rdrill", *TRACED_KINDS)

#: The question-aware mixtures by name, each with its generator-seed offset (``seed * 100 + offset + i``).
QA_MIXTURES: dict[str, tuple[list[tuple[str, dict[str, Any], float]], int]] = {
    "questions": (QA_MIXTURE, 50), "backward": (BACKWARD_MIXTURE, 70), "search": (SEARCH_MIXTURE, 90)}


def init_from_record(init_from: str | Path | None) -> str | None:
    """How ``backbone.json`` names the backbone a run continued from: a shipped one by its path in the
    package (``anchored_reasoning/assets/logic-gpt2-shift``), any other folder as given, marked as not shipped
    (its own ``backbone.json`` is kept under ``previous``, so the record stays whole without the folder)."""
    if not init_from:
        return None
    from anchored_reasoning.models.zoo import ASSETS_DIR

    path = Path(init_from).resolve()
    if path.parent == ASSETS_DIR.resolve():
        return f"anchored_reasoning/assets/{path.name}"
    return f"{init_from} (not shipped; its record is under previous)"


def qa_corpus(n_docs: int, seed: int = 0, mixture: str = "questions") -> list[tuple[str, str]]:
    """``n_docs`` (task, document) pairs of the question-aware corpus (``mixture="backward"``: of
    :data:`BACKWARD_MIXTURE`), shuffled with ``seed``."""
    from anchored_reasoning import generators
    from anchored_reasoning.generators.prosqa import ladder_size

    if mixture not in QA_MIXTURES:
        raise ValueError(f"qa_corpus: mixture must be one of {', '.join(QA_MIXTURES)}, got {mixture!r}")
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    table, offset = QA_MIXTURES[mixture]
    for i, (task, size, share) in enumerate(table):
        n = max(1, round(n_docs * share))
        size = ladder_size(size["ladder"]) if "ladder" in size else size
        gen_task = "prosqa" if task in PROSQA_KINDS else task
        for ex in generators.generate_dataset(gen_task, n, seed=seed * 100 + offset + i, split=f"qa{i}", **size):
            try:
                out.append((task, qa_document(ex, task, rng)))
            except DataError:  # options_backward: no entity reaches the wrong option (rare at the published size)
                continue
    rng.shuffle(out)
    return out[:n_docs]


def logic_corpus(n_docs: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n_docs`` (task, document) pairs drawn from :data:`MIXTURE`, shuffled with ``seed``."""
    from anchored_reasoning import generators

    out: list[tuple[str, str]] = []
    for i, (task, size, share) in enumerate(MIXTURE):
        n = max(1, round(n_docs * share))
        for ex in generators.generate_dataset(task, n, seed=seed * 100 + i, split=f"backbone{i}", **size):
            out.append((task, document(ex, task)))
    random.Random(seed).shuffle(out)
    return out[:n_docs]


def build_tokenizer(texts: Sequence[str], out_dir: Path, vocab_size: int = 512):
    from anchored_reasoning.methods.anchored import add_special_tokens
    from anchored_reasoning.tokenization import train_tiny_tokenizer

    tok = train_tiny_tokenizer(out_dir, texts=texts, vocab_size=vocab_size)  # left padding already
    add_special_tokens(tok)
    return tok


def _batches(encoded: list[tuple[list[int], int]], batch_size: int, rng: random.Random):
    """Endless batches of documents of similar length (sorted chunks, shuffled)."""
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))
    while True:
        chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
        rng.shuffle(chunks)
        for chunk in chunks:
            yield [encoded[i] for i in chunk]
        # reshuffle within equal lengths next epoch
        rng.shuffle(order)
        order.sort(key=lambda i: len(encoded[i][0]))


def _collate(docs: list[tuple[list[int], int]], pad_id: int, loss_on: str = "derivation"):
    """Pad (token ids, length of the facts part) pairs; labels on the derivation part (or on ``all`` tokens)."""
    import torch

    width = max(len(d) for d, _ in docs)
    ids = torch.full((len(docs), width), pad_id, dtype=torch.long)
    labels = torch.full((len(docs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(docs), width), dtype=torch.long)
    for r, (d, facts_len) in enumerate(docs):
        ids[r, :len(d)] = torch.tensor(d)
        start = 0 if loss_on == "all" else facts_len
        labels[r, start:len(d)] = torch.tensor(d[start:])
        mask[r, :len(d)] = 1
    return ids, mask, labels


def derivation_loss(model, tokenizer, docs: list[str], batch_size: int = 32) -> float:
    """Mean next-token loss on the derivation part (after the newline) of held-out documents."""
    import torch

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(docs), batch_size):
            ids, mask, labels = _collate([encode(tokenizer, d) for d in docs[i:i + batch_size]], tokenizer.pad_token_id)
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
            tgt = labels[:, 1:]
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1),
                                                     ignore_index=-100, reduction="sum")
            total += float(loss)
            count += int((tgt != -100).sum())
    model.train()
    return total / max(count, 1)


def pretrain(out: Path, *, minutes: float = 35.0, n_docs: int = 120_000, seed: int = 0, batch_size: int = 32,
             lr: float = 1e-3, warmup: int = 200, eval_every: int = 250, threads: int | None = None,
             config: dict[str, Any] | None = None, max_steps: int | None = None,
             init_from: str | Path | None = None, loss_on: str = "derivation",
             corpus_kind: str = "facts", token_shift: int = 0) -> dict[str, Any]:
    """Pretrain the backbone for ``minutes`` of wall-clock time (or ``max_steps``) and save it to ``out``.

    The learning rate warms up for ``warmup`` steps and then decays on a cosine over the
    time budget (to 10%). ``init_from`` continues from a saved backbone (its weights and
    tokenizer; a fresh corpus draw from ``seed``). Returns the summary that is also written to
    ``out/backbone.json`` (a continued run keeps the earlier phases under ``previous``).
    ``loss_on="all"`` puts the loss on every token, facts included (the first phase of the
    shipped backbone was trained that way; see the module docstring for why it is not the default).
    ``corpus_kind="questions"`` trains on :func:`qa_corpus` (whole problems, question kept).
    ``token_shift=N`` makes (or converts ``init_from`` into, with an identical start) a ``shift-gpt2``
    (:mod:`anchored_reasoning.models.shift`): each input embedding adds the N previous tokens'
    projections, which lets the 1M backbone learn fact lookup at all (``research/binding/assoc_recall.py``).
    """
    if loss_on not in ("derivation", "all"):
        raise ValueError(f"loss_on must be 'derivation' or 'all', got {loss_on!r}")
    if corpus_kind != "facts" and corpus_kind not in QA_MIXTURES:
        raise ValueError(f"corpus_kind must be 'facts' or one of {', '.join(QA_MIXTURES)}, got {corpus_kind!r}")
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    if corpus_kind == "facts":
        corpus, held = logic_corpus(n_docs, seed=seed), logic_corpus(400, seed=seed + 999)
    else:
        corpus = qa_corpus(n_docs, seed=seed, mixture=corpus_kind)
        held = qa_corpus(400 if corpus_kind == "questions" else 800, seed=seed + 999, mixture=corpus_kind)
    previous = None
    if init_from:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(init_from)
        prev_file = Path(init_from) / "backbone.json"
        previous = json.loads(prev_file.read_text()) if prev_file.is_file() else None
    else:
        tokenizer = build_tokenizer([d for _, d in corpus[:20_000]], out / "_tokenizer")
    cfg = {**BACKBONE_CONFIG, **(config or {})}
    from anchored_reasoning.models.shift import ShiftGPT2LMHeadModel

    if init_from:
        model = AutoModelForCausalLM.from_pretrained(init_from)
        cfg = {k: getattr(model.config, k) for k in cfg}
    else:
        model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                                           eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                           **cfg))
    if token_shift and not isinstance(model, ShiftGPT2LMHeadModel):
        model = ShiftGPT2LMHeadModel.from_gpt2(model, token_shift)
    if isinstance(model, ShiftGPT2LMHeadModel):
        cfg = {**cfg, "token_shift": model.config.token_shift}
    # documents longer than the model's positions (its own, also for a continued or overridden config)
    enc = [encode(tokenizer, d) for _, d in corpus]
    too_long = sum(len(ids) > cfg["n_positions"] for ids, _ in enc)
    enc = [e for e in enc if len(e[0]) <= cfg["n_positions"]]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    budget = minutes * 60.0
    held_by_task = {t: [d for tt, d in held if tt == t] for t in sorted({tt for tt, _ in held} - {"drill"})}
    history: list[dict[str, Any]] = []
    t0 = time.time()
    step = 0
    tokens = 0
    supervised = 0
    batches = _batches(enc, batch_size, rng)
    model.train()
    while True:
        elapsed = time.time() - t0
        if (max_steps is not None and step >= max_steps) or (max_steps is None and elapsed >= budget):
            break
        frac = min(1.0, elapsed / budget) if max_steps is None else step / max(max_steps, 1)
        scale = min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr * scale
        ids, mask, labels = _collate(next(batches), tokenizer.pad_token_id, loss_on)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        tokens += int(mask.sum())
        supervised += int((labels != -100).sum())
        if step % eval_every == 0:
            row = {"step": step, "seconds": round(time.time() - t0, 1), "train_loss": round(loss.item(), 4)}
            for task, docs in held_by_task.items():
                row[f"derivation_loss_{task}"] = round(derivation_loss(model, tokenizer, docs[:128]), 4)
            history.append(row)
            print("backbone", json.dumps(row), flush=True)
    final = {task: round(derivation_loss(model, tokenizer, docs), 4) for task, docs in held_by_task.items()}
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    summary = {
        "what": "GPT-2-class backbone pretrained with next-token loss on generated logic text "
                "(research.backbones.backbone)",
        "config": cfg,
        "parameters": sum(p.numel() for p in model.parameters()),
        "corpus": {"kind": corpus_kind, "documents": len(enc), "dropped_too_long": too_long,
                   "mixture": QA_MIXTURES[corpus_kind][0] if corpus_kind in QA_MIXTURES else MIXTURE,
                   "seed": seed},
        "steps": step, "tokens": tokens, "supervised_tokens": supervised, "batch_size": batch_size, "lr": lr,
        "train_seconds": round(time.time() - t0, 1), "total_seconds": round(time.time() - t_start, 1),
        "held_out_derivation_loss": final, "history": history,
        "date": dt.date.today().isoformat(), "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "torch_threads": torch.get_num_threads(),
        "init_from": init_from_record(init_from),
        "loss_on": loss_on,
        "step_separator": STEP_SEPARATOR,
        "previous": previous,
    }
    (out / "backbone.json").write_text(json.dumps(summary, indent=1) + "\n")
    import shutil

    shutil.rmtree(out / "_tokenizer", ignore_errors=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--minutes", type=float, default=35.0)
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps instead of the time budget")
    p.add_argument("--docs", type=int, default=120_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--init-from", default=None, help="continue pretraining a saved backbone (directory)")
    p.add_argument("--corpus", choices=["facts", *QA_MIXTURES], default="facts",
                   help="question-free logic text (the first backbone), whole problems with the question kept, "
                        "those with walks back from the options and reverse drills (BACKWARD_MIXTURE), "
                        "or ProsQA written as the depth-first search (SEARCH_MIXTURE)")
    p.add_argument("--loss-on", choices=["derivation", "all"], default="derivation",
                   help="tokens that carry the loss (default: the derivation only)")
    p.add_argument("--token-shift", type=int, default=0, metavar="N",
                   help="a shift-gpt2: each input embedding adds the N previous tokens' projections (0: plain GPT-2)")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    s = pretrain(Path(a.out), minutes=a.minutes, n_docs=a.docs, seed=a.seed, batch_size=a.batch_size, lr=a.lr,
                 threads=a.threads, max_steps=a.max_steps, init_from=a.init_from,
                 loss_on=a.loss_on, corpus_kind=a.corpus, token_shift=a.token_shift)
    print(json.dumps({k: s[k] for k in ("steps", "tokens", "train_seconds", "held_out_derivation_loss")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
