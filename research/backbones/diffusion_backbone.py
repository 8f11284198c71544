"""Pretrain the logic *diffusion* backbones ``logic-mdlm`` and ``logic-adlm``.

    python -m research.backbones.diffusion_backbone --arch mdlm --init ar --out anchored_reasoning/assets/logic-mdlm \\
        --max-steps 1500 --threads 1
    python -m research.backbones.diffusion_backbone --arch adlm --init ar --out anchored_reasoning/assets/logic-adlm \\
        --max-steps 1500 --threads 1
    python -m research.backbones.diffusion_backbone --check logic-gpt2        # does a backbone read the facts?

The diffusion counterparts of ``logic-gpt2`` (:mod:`research.backbones.backbone`): the same
corpus (generated logic text: a problem's facts, a newline, a derivation that follows them; no
question, no answer marker), the same tokenizer (``logic-gpt2``'s, which already has ``<mask>``
and the methods' special tokens), the same width and depth (the ``small`` preset: 4 blocks of 128,
i.e. logic-gpt2's shape; ADLM adds its half-depth denoiser, 2 blocks). As logic-gpt2 carries its
loss on the derivation only, the diffusion loss masks the derivation only: each row is an SFT row
with the facts as the clean prompt (LLaDA's SFT loss, EOS-padded), so the backbone learns to fill in
a derivation given the facts -- the conditional that reasoning SFT later asks of it. ADLM trains with
ANELBO, anchors by the paper's frequency rule (tau).

``init="ar"`` starts from logic-gpt2's weights where the shapes agree (DiffuGPT/Dream-style
adaptation of an AR model): token embeddings, every block's norms, attention (q/k/v and output;
GPT-2's attention biases have no slot and are dropped) and MLP, the final norm, the (tied) output
layer; for ADLM the anchor network takes them, the denoiser starts fresh. GPT-2's learned absolute
positions have no counterpart (our blocks use rotary positions), so the start is partial: the
attention is bidirectional and the positions are new.

Writes ``save_pretrained`` weights, the tokenizer and ``backbone.json`` (command, corpus, steps,
tokens, timing, held-out derivation NELBO per task). Archived here from ``anchored_reasoning.train.diffusion_backbone``,
the module path the shipped cards record (``research/backbones/README.md``).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import platform
import sys
import time
from pathlib import Path
from typing import Any

from anchored_reasoning.models.ar_init import ARCHS, INITS, PRESET, build_start, copy_ar_weights  # noqa: F401

log = logging.getLogger(__name__)


def rows_from_corpus(corpus: list[tuple[str, str]], tokenizer, max_length: int) -> tuple[list[dict[str, Any]], int]:
    """(task, document) pairs -> SFT rows (facts = prompt, derivation = response); too-long documents
    are dropped and counted."""
    from anchored_reasoning.train.data.diffusion_data import OverlongRow, encode_prompt_response

    out, dropped = [], 0
    for i, (task, doc) in enumerate(corpus):
        facts, derivation = doc.split("\n", 1)
        try:
            row = encode_prompt_response(tokenizer, facts + "\n", derivation, max_length, example_id=f"{task}-{i}")
        except OverlongRow:
            dropped += 1
            continue
        out.append({**row, "task": task})
    return out, dropped


def held_out_nelbo(model, rows: list[dict[str, Any]], pad_id: int, seed: int = 12345) -> float:
    """Per-token NELBO (nats) on the derivation tokens of held-out rows (fixed noise draws)."""
    import torch

    from anchored_reasoning.objectives import perplexity_bound

    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    am = torch.zeros_like(ids)
    lm = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n] = torch.tensor(r["input_ids"])
        am[i, :n] = 1
        lm[i, :n] = torch.tensor([int(x != -100) for x in r["labels"]])
    b = perplexity_bound(model, ids, am, num_t_samples=4, batch_size=32, seed=seed, loss_mask=lm)  # restores train mode
    return round(b.nelbo, 4)


#: The derivation check's problems: the corpus's middle ProsQA size (14 nodes, 1-3 hops), unseen seeds.
CHECK_SIZE = {"num_nodes": 14, "min_hops": 1, "max_hops": 3, "neg_depth": "any"}  # "any": as the shipped cards measured


def _claims(example, text: str) -> tuple[int, int, int]:
    """(steps, facts, true) of a generated ProsQA derivation: "X is a Y." / "Every X is a Y." sentences,
    those that are facts of the problem, and those true in its graph (Y reachable from X: a fact or a
    valid conclusion such as the derivation's closing "Tom is a <answer>.")."""
    from anchored_reasoning.eval.probes import derivation_steps, prosqa_children, reaches

    children = prosqa_children(example)
    steps = derivation_steps(text)
    facts = sum(b in children.get(a, ()) for a, b in steps)
    # strictly below: "X is a X." is no claim (the graph is acyclic, so reaches() is reflexive only there)
    return len(steps), facts, sum(a != b and reaches(children, a, b) for a, b in steps)


def derivation_check(model, tokenizer, n: int = 64, seed: int = 777, gen_length: int = 64) -> dict[str, Any]:
    """Does the backbone read the facts? Greedy derivations of ``n`` held-out ProsQA problems given their
    facts (no question, as in pretraining), read back against each graph: ``fact_share`` = generated
    "X is a Y." / "Every X is a Y." steps that are facts of the problem, ``true_share`` = steps true in
    the graph (facts and valid conclusions); a model that knows only the format makes steps up
    (gold derivations: true_share 1.0). Works for the AR ``logic-gpt2`` too (``generate``), so the two
    kinds of backbone compare."""
    import torch

    from anchored_reasoning import generators
    from anchored_reasoning.train.data.logic_text import facts_of

    examples = generators.generate_dataset("prosqa", n, seed=seed, split="derivation-check", **CHECK_SIZE)
    was_training = model.training
    model.eval()
    totals = [0, 0, 0]
    with torch.no_grad():
        for ex in examples:
            ids = torch.tensor([tokenizer(facts_of(ex.question, "prosqa") + "\n")["input_ids"]])
            if getattr(model.config, "mask_token_id", None) is not None:
                from anchored_reasoning.sampling.samplers import SamplerConfig, sample

                out, _ = sample(model, ids, SamplerConfig(steps=gen_length, gen_length=gen_length, stop_at_eos=True,
                                                          eos_token_id=tokenizer.eos_token_id))
            else:
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=gen_length, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
            counts = _claims(ex, tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
            totals = [t + c for t, c in zip(totals, counts)]
    model.train(was_training)
    steps, facts, true = totals
    return {"problems": n, "size": CHECK_SIZE, "seed": seed, "mean_steps": steps / n,
            "fact_share": facts / steps if steps else 0.0, "true_share": true / steps if steps else 0.0}


def pretrain(out: Path, *, arch: str = "mdlm", init: str = "scratch", max_steps: int = 3000, minutes: float | None = None,
             n_docs: int = 60_000, seed: int = 0, batch_size: int = 32, lr: float = 1e-3, warmup: int = 100,
             threads: int | None = None, config: dict[str, Any] | None = None, eval_docs: int = 256,
             check_n: int = 64, init_from: str | Path | None = None, corpus: str = "facts",
             shift_logits: bool = False) -> dict[str, Any]:
    """Pretrain one logic diffusion backbone and save it to ``out``; returns ``backbone.json``'s content.

    ``init_from``: the AR model ``init="ar"`` starts from (default ``logic-gpt2``; ``logic-gpt2-shift``
    gives a diffusion model with its token shift, copied). ``corpus``: ``"facts"`` (logic-gpt2's
    question-free documents) or ``"questions"`` (whole problems, the question in the prompt and the
    derivation and ``### answer`` the response: logic-gpt2-shift's corpus). ``shift_logits``: the
    AR-initialised head predicts position t from t-1's state, as the AR model did (DiffuGPT/Dream)."""
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    if corpus not in ("facts", "questions"):
        raise ValueError(f"corpus must be 'facts' or 'questions', got {corpus!r}")
    if init_from is not None and init != "ar":
        raise ValueError(f"init_from={init_from!r} needs init='ar'")
    import torch
    from datasets import Dataset

    from anchored_reasoning.train.callbacks.curriculum import TimeBudgetCallback
    from anchored_reasoning.train.trainers.diffusion_trainer import DiffusionCollator, DiffusionSFTConfig, DiffusionSFTTrainer
    from anchored_reasoning.train.data.logic_text import STEP_SEPARATOR
    from research.backbones.backbone import logic_corpus, qa_corpus

    if threads:
        torch.set_num_threads(threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    from anchored_reasoning.models.zoo import resolve_model

    init_dir = resolve_model(str(init_from)) if init_from is not None else None
    model, tok, copied = build_start(arch, init, init_from=init_dir, shift_logits=shift_logits, seed=seed, config=config)
    cfg = model.config
    make = qa_corpus if corpus == "questions" else logic_corpus
    train_rows, dropped = rows_from_corpus(make(n_docs, seed=seed), tok, cfg.max_position_embeddings)
    held_rows, _ = rows_from_corpus(make(eval_docs * 4, seed=seed + 999), tok, cfg.max_position_embeddings)
    held = {t: [r for r in held_rows if r["task"] == t][:eval_docs] for t in ("prosqa", "prontoqa")}
    before = {t: held_out_nelbo(model, rs, tok.pad_token_id) for t, rs in held.items()}
    args = DiffusionSFTConfig(
        output_dir=str(out / "_trainer"), seed=seed, data_seed=seed, max_steps=max_steps, per_device_train_batch_size=batch_size,
        learning_rate=lr, lr_scheduler_type="cosine", warmup_steps=warmup, weight_decay=0.01, max_grad_norm=1.0,
        logging_steps=max(1, max_steps // 20), save_strategy="no", disable_tqdm=True, diffusion_mode="sft",
        anchored=arch == "adlm", max_train_seconds=minutes * 60 if minutes else None, train_sampling_strategy="group_by_length")
    dataset = Dataset.from_list([{k: v for k, v in r.items() if k != "task"} for r in train_rows])
    # the trainer has no time limit of its own: ``minutes`` is this callback (without it the flag did nothing)
    trainer = DiffusionSFTTrainer(model=model, args=args, train_dataset=dataset, data_collator=DiffusionCollator.for_tokenizer(tok),
                                  processing_class=tok, callbacks=[TimeBudgetCallback(args.max_train_seconds)])
    t0 = time.time()
    trainer.train()
    train_seconds = time.time() - t0
    after = {t: held_out_nelbo(model, rs, tok.pad_token_id) for t, rs in held.items()}
    check = derivation_check(model, tok, n=check_n) if check_n else None
    model.save_pretrained(out)
    tok.save_pretrained(out)
    steps = trainer.state.global_step
    summary = {
        "what": f"{arch.upper()} pretrained with the masked-diffusion loss on the derivations of generated logic text "
                "(research.backbones.diffusion_backbone); logic-gpt2's corpus, tokenizer and shape",
        "command": "python -m research.backbones.diffusion_backbone " + " ".join(sys.argv[1:]),
        "arch": arch, "init": init, "init_from": str(init_from) if init_from is not None else ("logic-gpt2" if init == "ar" else None),
        "ar_tensors_copied": copied, "preset": PRESET, "config": cfg.to_diff_dict(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "corpus": {"generator": f"research.backbones.backbone.{make.__name__}", "documents": len(train_rows),
                   "dropped_too_long": dropped, "seed": seed},
        "step_separator": STEP_SEPARATOR,  # what joined each document's steps (read by train.separator)
        "steps": steps, "epochs": steps * batch_size / max(1, len(train_rows)), "batch_size": batch_size, "lr": lr,
        "schedule": f"cosine, warm-up {warmup}", "anchored": arch == "adlm",
        "train_seconds": round(train_seconds, 1), "total_seconds": round(time.time() - t_start, 1),
        "held_out_derivation_nelbo": {"before": before, "after": after}, "derivation_check": check,
        "log_history": [h for h in trainer.state.log_history if "loss" in h],
        "date": dt.date.today().isoformat(), "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "torch_threads": torch.get_num_threads(),
    }
    (out / "backbone.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    import shutil

    shutil.rmtree(out / "_trainer", ignore_errors=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="where to save the backbone")
    p.add_argument("--check", metavar="DIR", help="only run the derivation check on a saved backbone (diffusion or AR) and print it")
    p.add_argument("--write", action="store_true", help="with --check: also store it in DIR/backbone.json")
    p.add_argument("--arch", choices=ARCHS, default="mdlm")
    p.add_argument("--init", choices=INITS, default="scratch", help="scratch, or ar: start from logic-gpt2's weights")
    p.add_argument("--init-from", default=None, help="with --init ar: the AR model to start from (alias or folder; "
                   "default logic-gpt2; logic-gpt2-shift carries its token shift over)")
    p.add_argument("--corpus", choices=["facts", "questions"], default="facts",
                   help="facts: question-free documents (logic-gpt2's); questions: whole problems (logic-gpt2-shift's)")
    p.add_argument("--shift-logits", action="store_true",
                   help="predict position t from t-1's state, as the AR model did (DiffuGPT/Dream's output shift)")
    p.add_argument("--max-steps", type=int, default=3000)
    p.add_argument("--minutes", type=float, default=None, help="also stop after this much training time")
    p.add_argument("--docs", type=int, default=60_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if a.check:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

        import anchored_reasoning.models  # noqa: F401  (Auto registration)
        from anchored_reasoning.models.zoo import resolve_model

        path = resolve_model(a.check)
        diffusion = getattr(AutoConfig.from_pretrained(path), "mask_token_id", None) is not None
        model = (AutoModelForMaskedLM if diffusion else AutoModelForCausalLM).from_pretrained(path)
        check = derivation_check(model, AutoTokenizer.from_pretrained(path))
        print(json.dumps(check, indent=1))
        info = Path(path) / "backbone.json"
        if a.write and info.is_file():
            info.write_text(json.dumps({**json.loads(info.read_text()), "derivation_check": check}, indent=1, default=str) + "\n")
        return 0
    if not a.out:
        p.error("--out is required (or --check DIR)")
    s = pretrain(Path(a.out), arch=a.arch, init=a.init, max_steps=a.max_steps, minutes=a.minutes, n_docs=a.docs, seed=a.seed,
                 batch_size=a.batch_size, lr=a.lr, threads=a.threads, init_from=a.init_from, corpus=a.corpus,
                 shift_logits=a.shift_logits)
    print(json.dumps({k: s[k] for k in ("steps", "train_seconds", "parameters", "held_out_derivation_nelbo")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
